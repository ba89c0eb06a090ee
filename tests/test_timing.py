"""ropecheck.timing: the timers against fake clocks, events, graphs and streams (the CUDA
timers cannot run here: a GPU-only test at the end measures them where there is one), the
interleaving and its stop rules, the statistics against known order statistics and on
simulated data, and the records against pytest-benchmark's own reader."""

from __future__ import annotations

import ast
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from ropecheck.timing import timers

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
