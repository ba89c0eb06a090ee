"""ropecheck.timing: the timers against fake clocks, events, graphs and streams (the CUDA
timers cannot run here: a GPU-only test at the end measures them where there is one), the
interleaving and its stop rules, the statistics against known order statistics and on
simulated data, and the records against pytest-benchmark's own reader."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from pytest_benchmark.stats import Stats
from scipy import stats as sps

from ropecheck.timing import records, sampling, stats, timers

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A fake nanosecond clock: reading it is logged, the calls advance it."""

    def __init__(self, log: list):
        self.now = 0
        self.log = log

    def __call__(self) -> int:
        self.log.append("clock")
        return self.now


def timed_calls(clock: Clock, log: list, ns: list[int]) -> list:
    """One call per input set: set i logs ("call", i) and takes ns[i] nanoseconds."""

    def make(i):
        def call():
            log.append(("call", i))
            clock.now += ns[i]

        return call

    return [make(i) for i in range(len(ns))]


# -- timers ---------------------------------------------------------------------------------


def test_cpu_timer_times_one_call_per_sample_rotating_through_the_sets():
    log: list = []
    clock = Clock(log)
    timer = timers.CpuTimer(flush_bytes=64, clock=clock)
    timer.prepare(timed_calls(clock, log, [1000, 2000, 3000]))
    assert [e for e in log if e != "clock"] == [("call", 0), ("call", 1), ("call", 2)]  # the warm-up
    log.clear()
    got = [timer.sample() for _ in range(6)]
    assert got == pytest.approx([1e-6, 2e-6, 3e-6, 1e-6, 2e-6, 3e-6])
    assert [e[1] for e in log if e != "clock"] == [0, 1, 2, 0, 1, 2]
    assert timer.name == "cpu"


def test_cpu_timer_evicts_the_cache_before_each_sample():
    log: list = []
    clock = Clock(log)
    timer = timers.CpuTimer(flush_bytes=4096, clock=clock)
    timer.prepare(timed_calls(clock, log, [10, 10]))
    assert timer.flush_buffer is not None and timer.flush_buffer.size == 4096
    assert np.all(timer.flush_buffer == 1)  # written once in prepare: its pages are real
    timer.sample()
    timer.sample()
    assert np.all(timer.flush_buffer == 3)  # every byte written before each sample
    log.clear()
    real_evict = timer.evict
    timer.evict = lambda: (log.append("evict"), real_evict())  # type: ignore[method-assign]
    timer.sample()
    assert log == ["evict", "clock", ("call", 0), "clock"]  # outside the timed call
    timer.close()
    assert timer.flush_buffer is None


def test_cpu_timer_flush_buffer_is_twice_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(timers, "last_level_cache_bytes", lambda: 1000)
    timer = timers.CpuTimer()
    timer.prepare([lambda: None])
    assert timer.flush_buffer is not None and timer.flush_buffer.size == 2000
    timer.close()
    off = timers.CpuTimer(flush_bytes=0)
    off.prepare([lambda: None])
    assert off.flush_buffer is None  # 0: no eviction (a warm-cache timer)


def test_cpu_timer_fixes_the_thread_count_and_close_restores_it():
    before = torch.get_num_threads()
    wanted = 2 if before != 2 else 1
    seen = []
    timer = timers.CpuTimer(threads=wanted, flush_bytes=64)
    timer.prepare([lambda: seen.append(torch.get_num_threads())])
    timer.sample()
    assert seen == [wanted, wanted]
    timer.close()
    assert torch.get_num_threads() == before


def test_host_timer_divides_by_repeat_and_syncs_before_the_end_reading():
    log: list = []
    clock = Clock(log)

    def sync():  # a device queue that takes 400 ns to drain
        log.append("sync")
        clock.now += 400

    timer = timers.HostTimer(sync=sync, repeat=4, clock=clock)
    timer.prepare(timed_calls(clock, log, [1000, 3000]))
    log.clear()
    got = timer.sample()
    assert got == pytest.approx((1000 + 3000 + 1000 + 3000 + 400) / 4 / 1e9)
    assert log == ["sync", "clock", ("call", 0), ("call", 1), ("call", 0), ("call", 1), "sync", "clock"]
    assert timer.name == "host"


def test_host_timer_rotation_carries_over_between_samples():
    log: list = []
    clock = Clock(log)
    timer = timers.HostTimer(repeat=2, clock=clock)
    timer.prepare(timed_calls(clock, log, [100, 200, 300]))
    log.clear()
    assert [timer.sample() for _ in range(3)] == pytest.approx([150e-9, 200e-9, 250e-9])
    assert [e[1] for e in log if e != "clock"] == [0, 1, 2, 0, 1, 2]
    with pytest.raises(ValueError):
        timers.HostTimer(repeat=0)


class Device:
    """A fake CUDA device: a nanosecond clock, the current stream, the graph being captured
    and a log of what happened, for fake events, streams and graphs."""

    def __init__(self):
        self.now = 0
        self.log: list = []
        self.stream = "default"
        self.capturing = None

    def event(self):
        return Event(self)

    def calls(self, ns: list[int]) -> list:
        def make(i):
            def call():
                if self.capturing is not None:
                    self.capturing.captured.append((i, ns[i]))
                else:
                    self.log.append(("call", i, self.stream))
                    self.now += ns[i]

            return call

        return [make(i) for i in range(len(ns))]


class Event:
    count = 0

    def __init__(self, device: Device):
        self.device = device
        self.time: int | None = None
        Event.count += 1
        self.id = Event.count

    def record(self):
        self.time = self.device.now
        self.device.log.append(("record", self.id))

    def synchronize(self):
        self.device.log.append(("synchronize", self.id))

    def elapsed_time(self, end: Event) -> float:  # milliseconds, as torch's
        assert self.time is not None and end.time is not None
        return (end.time - self.time) / 1e6


class Stream:
    def __init__(self, device: Device):
        self.device = device
        self.before = None

    def wait_event(self, event: Event):
        self.device.log.append(("wait_event", event.id))

    def synchronize(self):
        self.device.log.append("side synchronize")

    def __enter__(self):
        self.before, self.device.stream = self.device.stream, "side"
        return self

    def __exit__(self, *exc):
        self.device.stream = self.before


class Graph:
    def __init__(self, device: Device):
        self.device = device
        self.captured: list = []

    def replay(self):
        self.device.log.append("replay")
        for _, ns in self.captured:
            self.device.now += ns


def test_cuda_cold_timer_flushes_then_times_one_call_between_events():
    device = Device()
    timer = timers.CudaColdTimer(flush=lambda: device.log.append("flush"), event_factory=device.event)
    timer.prepare(device.calls([3000, 5000]))
    device.log.clear()
    got = [timer.sample() for _ in range(3)]
    assert got == pytest.approx([3e-6, 5e-6, 3e-6])  # ms from elapsed_time, seconds back
    start, end = timer._start.id, timer._end.id
    assert device.log[:5] == ["flush", ("record", start), ("call", 0, "default"), ("record", end), ("synchronize", end)]
    assert timer.name == "cuda-cold"


def test_cuda_graph_timer_divides_a_replay_by_its_calls():
    device = Device()

    @contextmanager
    def capture(graph):
        device.capturing = graph
        device.log.append("capture")
        yield
        device.capturing = None

    timer = timers.CudaGraphTimer(
        5,
        graph_factory=lambda: Graph(device),
        event_factory=device.event,
        stream_factory=lambda: Stream(device),
        capture_factory=capture,
    )
    timer.prepare(device.calls([2000, 2000, 2000]))
    graph = timer._graph
    assert [i for i, _ in graph.captured] == [0, 1, 2, 0, 1]  # the sets cycled through in the capture
    # every set warmed up on the side stream, after it waited for the current one, before the capture
    ready = device.log[0][1]
    assert device.log[:6] == [
        ("record", ready),
        ("wait_event", ready),
        ("call", 0, "side"),
        ("call", 1, "side"),
        ("call", 2, "side"),
        "side synchronize",
    ]
    assert device.log[6] == "capture"
    assert "replay" in device.log[7:]  # one replay in prepare: the graph's upload is not a sample
    device.log.clear()
    assert timer.sample() == pytest.approx(2e-6)  # the replay advanced 5 * 2000 ns
    assert device.log == [
        ("record", timer._start.id),
        "replay",
        ("record", timer._end.id),
        ("synchronize", timer._end.id),
    ]
    assert timer.name == "cuda-graph"
    timer.close()
    with pytest.raises(RuntimeError):
        timer.sample()


def test_last_level_cache_from_sysfs(tmp_path):
    for index, (level, kind, size) in enumerate(
        [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "36M")]
    ):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    assert timers.last_level_cache_bytes(tmp_path) == 36 << 20
    (tmp_path / "index3" / "size").unlink()  # unreadable: the next level down
    assert timers.last_level_cache_bytes(tmp_path) == 2048 << 10
    assert timers.last_level_cache_bytes(tmp_path / "absent") == 32 << 20


def test_input_sets_pass_through_more_than_twice_the_cache():
    assert timers.input_sets_for(10 << 20, 32 << 20) == 7  # 70 MiB > 64 MiB; 60 MiB is not
    assert timers.input_sets_for(32 << 20, 32 << 20) == 3
    assert timers.input_sets_for(100 << 20, 32 << 20) == 1  # one set streams past the cache itself
    assert timers.input_sets_for(1024, 32 << 20) == 64  # the limit
    assert timers.input_sets_for(1024, 32 << 20, limit=10) == 10
    for per_set, cache in [(1, 1), (3 << 20, 50 << 20), (7, 100)]:
        n = timers.input_sets_for(per_set, cache, limit=10**9)
        assert n * per_set > 2 * cache >= (n - 1) * per_set
    with pytest.raises(ValueError):
        timers.input_sets_for(0, 1)


def test_l2_flush_is_four_times_the_l2_or_triton_s_256_mib(monkeypatch):
    monkeypatch.setattr(timers, "l2_bytes", lambda device: 50 << 20)
    assert timers.l2_flush_bytes(0) == 256 << 20
    monkeypatch.setattr(timers, "l2_bytes", lambda device: 128 << 20)
    assert timers.l2_flush_bytes(0) == 512 << 20


def test_copy_call_moves_the_bytes_asked():
    copy = timers.copy_call(1000, "cpu")
    out = copy()
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8 and out.numel() == 500
    assert bool((out == 1).all())  # the source was written: its pages are real memory
    assert timers.copy_call(1, "cpu")().numel() == 1
    assert timers.empty_call("cpu")() is None
    with pytest.raises(ValueError):
        timers.empty_call("meta")


def test_gpu_clock_never_raises():
    got = timers.gpu_clock_mhz(0)
    assert got is None or got > 0


# -- sampling -------------------------------------------------------------------------------


def constant_arm(value: float, order: list | None = None, name: str = ""):
    def arm(n):
        if order is not None:
            order.append(name)
        return [value] * n

    return arm


def noisy_arm(seed: int, sigma: float = 0.5):
    rng = np.random.default_rng(seed)
    return lambda n: list(rng.lognormal(0, sigma, n))


def arm_order(seed: int = 0, blocks: int = 400) -> list:
    """The order two constant arms ran in over ``blocks`` blocks of 2 samples."""
    order: list = []
    got = sampling.interleave(
        {"a": constant_arm(1.0, order, "a"), "b": constant_arm(2.0, order, "b")},
        block=2,
        min_blocks=blocks,
        max_blocks=blocks,
        seed=seed,
    )
    assert got.blocks == blocks and len(got.arms["a"]) == len(got.arms["b"]) == 2 * blocks
    return order


def test_interleave_shuffles_the_order_of_the_arms_per_block():
    order = arm_order()
    second = order[1::2]
    assert 0.4 < second.count("b") / len(second) < 0.6  # each arm second about half the time
    assert arm_order() == order  # seeded
    assert arm_order(seed=1) != order


def test_interleave_stops_when_settled():
    got = sampling.interleave({"a": constant_arm(1.0), "b": constant_arm(2.0)}, block=3, min_blocks=6)
    assert (got.stopped, got.blocks) == ("settled", 6)
    assert got.arms["a"] == [1.0] * 18


def test_interleave_stops_at_the_sample_limit():
    got = sampling.interleave({"a": noisy_arm(0), "b": noisy_arm(1)}, block=3, max_blocks=10, settle=0.001)
    assert (got.stopped, got.blocks) == ("sample limit", 10)
    assert len(got.arms["a"]) == len(got.arms["b"]) == 30


def test_interleave_stops_at_the_time_limit():
    now = [0.0]

    def slow(arm):
        def timed(n):
            now[0] += 1.0  # each arm's samples take a second
            return arm(n)

        return timed

    got = sampling.interleave(
        {"a": slow(noisy_arm(0)), "b": slow(noisy_arm(1))}, budget_s=5.5, settle=0.001, clock=lambda: now[0]
    )
    assert (got.stopped, got.blocks, got.seconds) == ("time limit", 3, 6.0)  # 2 s a block: over 5.5 s after 3
    now[0] = 0.0
    once = sampling.interleave({"a": slow(noisy_arm(0))}, budget_s=0.0, clock=lambda: now[0])
    assert (once.stopped, once.blocks) == ("time limit", 1)  # always one block


def test_interleave_watching_a_ratio_settles_through_a_drift_both_arms_see():
    def drifting(scale):
        state = {"block": 0}

        def arm(n):  # both arms slow down 5 % a block: their ratio stays 2
            state["block"] += 1
            return [scale * 1.05 ** state["block"]] * n

        return arm

    watched = sampling.interleave(
        {"kernel": drifting(2.0), "copy": drifting(1.0)}, watch=("kernel", "copy"), max_blocks=20
    )
    assert (watched.stopped, watched.blocks) == ("settled", 6)
    assert watched.ratios("kernel", "copy") == pytest.approx([2.0] * 6)
    unwatched = sampling.interleave({"kernel": drifting(2.0), "copy": drifting(1.0)}, max_blocks=20)
    assert unwatched.stopped == "sample limit"


def test_samples_ratios_are_per_block_medians():
    got = sampling.Samples(
        {"k": [3, 1, 2, 30, 10, 20], "c": [1, 1, 1, 5, 4, 6]}, block=3, blocks=2, stopped="settled", seconds=1.0
    )
    assert list(got.block_medians("k")) == [2, 20]
    assert list(got.ratios("k", "c")) == [2, 4]


def test_interleave_rejects_an_arm_returning_the_wrong_count():
    with pytest.raises(ValueError, match="returned 1 samples"):
        sampling.interleave({"a": lambda n: [1.0]})
    with pytest.raises(ValueError, match="watch"):
        sampling.interleave({"a": constant_arm(1.0)}, watch=("a", "copy"))


# -- stats ----------------------------------------------------------------------------------


def test_median_interval_is_known_order_statistics():
    rng = np.random.default_rng(0)
    assert stats.median_interval(rng.permutation(np.arange(1.0, 101))) == (40.0, 61.0)  # the textbook ranks
    assert stats.median_interval(np.arange(1.0, 11)) == (2.0, 9.0)  # P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2)
    assert stats.median_interval(np.arange(1.0, 11), 0.99) == (1.0, 10.0)
    assert stats.median_interval([5.0, 1, 3, 2, 4]) == (1.0, 5.0)  # too few for 95 %: the whole range
    assert stats.median_interval([7.0]) == (7.0, 7.0)
    with pytest.raises(ValueError):
        stats.median_interval([])


def test_median_interval_covers_the_median_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    data = rng.lognormal(0.0, 0.5, size=(2000, 25))  # skewed; the true median is 1
    covered = np.mean([lo <= 1.0 <= hi for lo, hi in map(stats.median_interval, data)])
    exact = 1 - 2 * sps.binom.cdf(7, 25, 0.5)  # the ranks 8 and 18 at n = 25: 95.7 %
    assert 0.95 <= exact
    assert abs(covered - exact) < 0.015


def test_relative_width_and_block_medians():
    assert stats.relative_width(np.arange(1.0, 11)) == pytest.approx((9 - 2) / 5.5)
    assert list(stats.block_medians([1, 2, 3, 10, 20, 30, 7], 3)) == [2, 20]  # the partial block dropped


def lognormal(rng, n, scale=1.0, sigma=0.05):
    return scale * rng.lognormal(0.0, sigma, n)


def test_shift_recovers_a_20_percent_slowdown():
    rng = np.random.default_rng(2)
    s = stats.shift(lognormal(rng, 30), lognormal(rng, 30, 1.2))
    assert s.low < 0.2 < s.high and s.low <= s.estimate <= s.high
    assert abs(s.estimate - 0.2) < 0.04
    assert s.p_slower < 1e-6 and s.p_faster > 0.99 and (s.n_baseline, s.n_current) == (30, 30)
    g = stats.gate(s, 0.05)
    assert (g.verdict, g.failed) == ("slower", True)
    assert g.message.startswith(f"{100 * s.estimate:.1f} % slower (95 % interval ")
    assert "over the 5 % threshold" in g.message


@pytest.mark.parametrize("sizes, method", [((5, 7), "exact"), ((12, 12), "asymptotic")])
def test_the_shift_interval_is_the_inverted_rank_test(sizes, method):
    """Shifting current by just inside the interval's ends keeps scipy's two-sided test at
    5 % from rejecting; just outside, it rejects: by the exact null distribution for 5
    against 7 (where the normal approximation puts the ends one rank further out), by the
    normal approximation for 12 against 12."""
    rng = np.random.default_rng(3)
    b, c = np.log(lognormal(rng, sizes[0])), np.log(lognormal(rng, sizes[1], 1.1))
    s = stats.shift(np.exp(b), np.exp(c))

    def p(delta):
        return sps.mannwhitneyu(c - delta, b, alternative="two-sided", method=method).pvalue

    for end, inward in ((math.log1p(s.low), 1e-9), (math.log1p(s.high), -1e-9)):
        assert p(end + inward) > 0.05 >= p(end - inward)


def test_the_shift_interval_covers_the_true_shift_95_percent_of_the_time():
    rng = np.random.default_rng(4)
    hits = [
        s.low <= 0.1 <= s.high for s in (stats.shift(lognormal(rng, 6), lognormal(rng, 6, 1.1)) for _ in range(1000))
    ]
    assert 0.945 < np.mean(hits) < 0.975  # exactly 1 - 2 * 19/924 = 95.9 % at 6 against 6


def test_identical_distributions_are_unchanged():
    rng = np.random.default_rng(5)
    g = stats.gate(stats.shift(lognormal(rng, 30, sigma=0.02), lognormal(rng, 30, sigma=0.02)), 0.05)
    assert (g.verdict, g.failed) == ("unchanged", False)


def test_no_significant_change_that_rules_out_a_slowdown_is_unchanged():
    rng = np.random.default_rng(2)
    s = stats.shift(lognormal(rng, 8, sigma=0.04), lognormal(rng, 8, 0.985, sigma=0.04))
    assert min(s.p_slower, s.p_faster) > 0.01 and s.low < -0.05 < s.estimate and s.high < 0.05
    g = stats.gate(s, 0.05)
    assert g.verdict == "unchanged" and "rules out a slowdown past the 5 % threshold" in g.message


def test_a_2_percent_slowdown_under_a_5_percent_threshold_does_not_fail():
    rng = np.random.default_rng(6)
    s = stats.shift(lognormal(rng, 30, sigma=0.01), lognormal(rng, 30, 1.02, sigma=0.01))
    assert s.p_slower < 0.01  # significant, but small
    g = stats.gate(s, 0.05)
    assert (g.verdict, g.failed) == ("unchanged", False)


def test_a_faster_kernel_is_faster():
    rng = np.random.default_rng(7)
    g = stats.gate(stats.shift(lognormal(rng, 20), lognormal(rng, 20, 0.8)), 0.05)
    assert (g.verdict, g.failed) == ("faster", False)
    assert "faster" in g.message and "past the 5 % threshold" in g.message


def test_few_or_noisy_blocks_are_inconclusive():
    rng = np.random.default_rng(8)
    g = stats.gate(stats.shift(lognormal(rng, 2), lognormal(rng, 10, 2.0)), 0.05)
    assert (g.verdict, g.failed) == ("inconclusive", False)  # twice as slow, but on 2 baseline blocks
    assert "too few blocks" in g.message
    g = stats.gate(stats.shift(lognormal(rng, 4), lognormal(rng, 4, 1.3)), 0.05)
    assert g.verdict == "inconclusive"  # 4 against 4 cannot reach p < 0.01
    assert "at least 5 blocks on each side" in g.message
    g = stats.gate(stats.shift(lognormal(rng, 4), lognormal(rng, 4, 0.7)), 0.05)
    assert g.verdict == "inconclusive"  # nor can it say faster
    g = stats.gate(stats.shift(lognormal(rng, 8, sigma=0.2), lognormal(rng, 8, 1.04, sigma=0.2)), 0.05)
    assert g.verdict == "inconclusive" and "more blocks" in g.message


def test_a_significant_change_under_the_threshold_whose_interval_reaches_past_it_is_inconclusive():
    rng = np.random.default_rng(2)
    s = stats.shift(lognormal(rng, 10, sigma=0.03), lognormal(rng, 10, 0.965, sigma=0.03))
    assert s.p_faster < 0.01 and -0.05 < s.estimate and s.low < -0.05  # 4 % faster, maybe 6 %
    assert stats.gate(s, 0.05).verdict == "inconclusive"


def test_shift_wants_positive_values():
    with pytest.raises(ValueError):
        stats.shift([1.0, 0.0, 2.0], [1.0, 2.0, 3.0])


def test_drift():
    assert stats.drift([1.0, 1.0, 1.0, 2.0, 2.0]) == 0.0  # fewer than 6
    assert stats.drift([1.0, 1.0, 1.0, 1.05, 1.05, 1.05, 1.1, 1.1, 1.1]) == pytest.approx(0.1)
    assert stats.drift([1.0, 1.0, 5.0, 1.2, 1.2, 1.2, 1.1, 1.5, 1.1]) == pytest.approx(0.1)  # medians, not means
    assert stats.drift([2.0, 2.0, 9.0, 1.0, 1.0, 1.0, 1.0]) == pytest.approx(-0.5)  # thirds of 2 of 7


# -- records --------------------------------------------------------------------------------


def test_an_entry_holds_pytest_benchmark_s_own_statistics():
    samples = [1e-6, 2e-6, 1.5e-6, 9e-6, 1.2e-6]
    e = records.entry(
        "rope[float16-4096]",
        "rope",
        samples,
        params={"dtype": "float16", "tokens": 4096},
        options={"timer": "cuda-graph"},
        extra_info={"bytes": 1 << 20},
    )
    reference = Stats()
    for t in samples:
        reference.update(t)
    assert {k: e["stats"][k] for k in Stats.fields} == reference.as_dict()
    assert e["stats"]["data"] == samples and e["stats"]["iterations"] == 1
    assert e["param"] == "float16-4096" and e["fullname"] == "rope[float16-4096]"
    assert e["options"]["timer"] == "cuda-graph" and e["options"]["min_rounds"] == 5
    with pytest.raises(ValueError):
        records.entry("empty", "rope", [])


def test_machine_info_is_pytest_benchmark_s_and_the_device():
    info = records.machine_info("cuda:0", "NVIDIA H200")
    assert info["ropecheck_device"] == "NVIDIA H200" and info["ropecheck_device_string"] == "cuda:0"
    assert "python_version" in info and "machine" in info


def test_a_saved_document_loads_and_pytest_benchmark_compares_it(tmp_path):
    doc = records.document(
        [
            records.entry("rope_fused", "rope", [1e-6, 1.1e-6, 0.9e-6]),
            records.entry("copy", "rope", [2e-6, 2.1e-6, 1.9e-6]),
        ],
        records.machine_info("cpu", "cpu"),
        commit={"id": "abc", "dirty": False},
    )
    assert doc["version"] and doc["datetime"].endswith("+00:00")
    path = records.save(doc, tmp_path / "0001_bench.json")
    assert records.load(path) == json.loads(json.dumps(doc))
    cli = Path(sys.executable).parent / "pytest-benchmark"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "pytest_benchmark"]
    # without pytest's plugins (ropecheck's own would import torch: 4 s); cwd: compare makes ./.benchmarks
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        command + ["compare", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "rope_fused" in done.stdout and "copy" in done.stdout


def test_document_fills_commit_info_itself():
    doc = records.document([], {})
    assert "id" in doc["commit_info"]


def test_load_refuses_what_is_not_a_benchmark_file(tmp_path):
    for i, text in enumerate(
        [
            '{"a": 1}',
            "[1, 2]",
            "not json",
            '{"machine_info": {}, "commit_info": {}, "datetime": "", "version": "", "benchmarks": [{"name": "x"}]}',
        ]
    ):
        path = tmp_path / f"{i}.json"
        path.write_text(text)
        with pytest.raises(ValueError, match="is not a pytest-benchmark file"):
            records.load(path)


# -- the package ----------------------------------------------------------------------------


def test_timing_imports_nothing_of_the_rest_of_ropecheck():
    allowed = {"torch", "numpy", "scipy", "pytest_benchmark"} | set(sys.stdlib_module_names)
    for path in sorted((ROOT / "ropecheck" / "timing").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert name.startswith("ropecheck.timing") or top in allowed or top == "__future__", (path.name, name)


# -- on a GPU -------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_timers_measure_a_copy_on_a_gpu():
    """A 64 MiB copy on the GPU: every timer gives a time per call a bandwidth can be read
    from (between 100 GB/s and 20 TB/s), and the empty kernel is faster than the copy."""
    moved = 64 << 20
    sets = timers.input_sets_for(moved, timers.l2_bytes(0), limit=8)
    calls = [timers.copy_call(moved, "cuda") for _ in range(sets)]
    for timer in (
        timers.CudaColdTimer(),
        timers.CudaGraphTimer(sets * 2),
        timers.HostTimer(sync=torch.cuda.synchronize),
    ):
        timer.prepare(calls)
        t = float(np.median([timer.sample() for _ in range(20)]))
        timer.close()
        assert 100e9 < moved / t < 20e12, (timer.name, t)
    empty = timers.CudaGraphTimer(16)
    empty.prepare([timers.empty_call("cuda")])
    assert 0 < float(np.median([empty.sample() for _ in range(20)])) < 20e-6
    empty.close()
