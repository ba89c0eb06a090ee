"""One sample of a kernel's time per call, and the yardsticks it is read against.

A timer is given ``calls``: one zero-argument callable per input set, the same kernel call
on different input buffers. ``prepare`` warms them up (and captures a CUDA graph),
``sample`` returns one sample in seconds per call, ``close`` puts back what ``prepare``
changed. The timers that say so rotate through the input sets round-robin, so that a
sample's inputs are not the ones the previous sample left in the cache: how many sets that
takes is ``input_sets_for`` (the rotation passes through more than twice the cache).

What each timer measures, and why:

``CpuTimer`` ("cpu")
    One call on the CPU with cold caches: the last-level cache is evicted before each
    sample by writing a buffer twice its size (read-modify-write through numpy: ``memset``
    of a large buffer may use non-temporal stores that bypass the cache and evict nothing),
    then ``clock()`` is read either side of the one call. The time a call takes when its
    inputs come from memory, as a long sequence's do. ``threads`` fixes torch's thread count
    for the run (a kernel is compared with itself only at one count); ``close`` restores it.
    ``perf_counter_ns`` resolves well under a microsecond; a call that short is timed by the
    host timer instead.
``HostTimer`` ("host")
    ``repeat`` eager calls back to back, then ``sync()``, between two clock readings: the
    wall time per call that a user's model pays in eager mode, launch and Python overhead
    included, caches warm. On a GPU that is whichever is longer, launching or running the
    kernel. ``sync`` is also called before the first reading (not timed), so that nothing
    left queued by another arm is counted.
``CudaColdTimer`` ("cuda-cold")
    One call between two CUDA events after the L2 is flushed (a buffer of
    ``l2_flush_bytes`` zeroed: at least 256 MiB, Triton's ``do_bench`` flushes 256 MB): the
    kernel's device time with its inputs in HBM. The start event completes when the flush
    does, so the sample holds no launch gap unless launching the call takes longer than the
    flush. CUDA events resolve about half a microsecond.
``CudaGraphTimer`` ("cuda-graph")
    ``calls_per_graph`` calls, cycling through the input sets, captured in one CUDA graph
    and replayed between two events; a sample is the replay's time over
    ``calls_per_graph``. Back-to-back device time with no launch overhead, as a model run
    under CUDA graphs (or ``torch.compile``'s ``reduce-overhead``) pays it. The L2 is not
    flushed: the inputs rotated through are what keeps a call from finding the last one's
    in the cache, so give it enough sets (``input_sets_for(bytes_per_set, l2_bytes(device))``).

A single sample means little (an interrupt, a clock step, a garbage collection land in
one); ``ropecheck.timing.sampling`` takes many, in blocks interleaved with the yardstick
``copy_call`` (a device copy that moves as many bytes as the kernel: the bandwidth the
kernel is compared with in the same run), and ``ropecheck.timing.stats`` reads their
medians.

Every timer takes its clock, events, graph and streams as parameters, so that the tests
run on CPU with fakes. The CUDA timers are tested only against fake events and graphs:
they are unverified on a GPU until a GPU run has measured them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import numpy as np
import torch

MiB = 1 << 20
DEFAULT_LLC_BYTES = 32 * MiB  # where sysfs does not say
TRITON_FLUSH_BYTES = 256 * MiB  # what Triton's do_bench zeroes to flush the L2
CPU_CACHE = "/sys/devices/system/cpu/cpu0/cache"

Call = Callable[[], object]
Clock = Callable[[], int]


class Timer:
    """The protocol every timer follows, and the rotation through the input sets."""

    name: str = "timer"

    def __init__(self) -> None:
        self._calls: list[Call] = []
        self._next = 0

    def prepare(self, calls: Sequence[Call]) -> None:
        """Take the calls (at least one) and warm them up."""
        if not calls:
            raise ValueError(f"{self.name} timer: no calls to time")
        self._calls = list(calls)
        self._next = 0

    def sample(self) -> float:
        """One sample: seconds per call."""
        raise NotImplementedError

    def close(self) -> None:
        """Put back what ``prepare`` changed and free what it made."""
        self._calls = []

    def _call(self) -> Call:
        """The next call in the rotation through the input sets."""
        if not self._calls:
            raise RuntimeError(f"{self.name} timer: prepare() it before sampling")
        call = self._calls[self._next % len(self._calls)]
        self._next += 1
        return call


class CpuTimer(Timer):
    """One call with the last-level cache evicted before it (module docstring).
    ``flush_bytes=0`` turns the eviction off (a warm-cache CPU timer)."""

    name = "cpu"

    def __init__(
        self, threads: int | None = None, flush_bytes: int | None = None, clock: Clock = time.perf_counter_ns
    ) -> None:
        super().__init__()
        self.threads = threads
        self.flush_bytes = flush_bytes
        self.clock = clock
        self.flush_buffer: np.ndarray | None = None
        self._saved_threads: int | None = None

    def prepare(self, calls: Sequence[Call]) -> None:
        super().prepare(calls)
        if self.threads is not None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        size = 2 * last_level_cache_bytes() if self.flush_bytes is None else self.flush_bytes
        self.flush_buffer = np.zeros(size, np.uint8) if size > 0 else None
        for call in self._calls:
            call()
        self.evict()  # the buffer's pages are faulted in here, not in the first sample

    def evict(self) -> None:
        """Write every byte of the flush buffer (a read and a write through the cache)."""
        if self.flush_buffer is not None:
            np.add(self.flush_buffer, 1, out=self.flush_buffer)

    def sample(self) -> float:
        call = self._call()
        self.evict()
        t0 = self.clock()
        call()
        t1 = self.clock()
        return (t1 - t0) / 1e9

    def close(self) -> None:
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
        self.flush_buffer = None
        super().close()


class HostTimer(Timer):
    """``repeat`` eager calls and a ``sync`` between two clock readings (module docstring)."""

    name = "host"

    def __init__(
        self, sync: Callable[[], None] = lambda: None, repeat: int = 8, clock: Clock = time.perf_counter_ns
    ) -> None:
        super().__init__()
        if repeat < 1:
            raise ValueError(f"host timer: repeat must be at least 1, not {repeat}")
        self.sync = sync
        self.repeat = repeat
        self.clock = clock

    def prepare(self, calls: Sequence[Call]) -> None:
        super().prepare(calls)
        for call in self._calls:
            call()
        self.sync()

    def sample(self) -> float:
        calls = [self._call() for _ in range(self.repeat)]  # the rotation is not timed
        self.sync()  # nothing queued before counts
        t0 = self.clock()
        for call in calls:
            call()
        self.sync()
        t1 = self.clock()
        return (t1 - t0) / self.repeat / 1e9


def _timing_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class CudaColdTimer(Timer):
    """One call between CUDA events after an L2 flush (module docstring). ``device``: the
    CUDA device whose L2 the default flush empties (None: the current one)."""

    name = "cuda-cold"

    def __init__(
        self,
        flush: Callable[[], None] | None = None,
        event_factory: Callable[[], Any] | None = None,
        device: torch.device | str | int | None = None,
    ) -> None:
        super().__init__()
        self.flush = flush
        self.event_factory = event_factory or _timing_event
        self.device = device
        self._flush: Callable[[], object] = lambda: None
        self._buffer: torch.Tensor | None = None
        self._start: Any = None
        self._end: Any = None

    def prepare(self, calls: Sequence[Call]) -> None:
        super().prepare(calls)
        if self.flush is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.device is None else self.device
            self._buffer = torch.empty(l2_flush_bytes(device), dtype=torch.uint8, device=device)
            self._flush = self._buffer.zero_
        else:
            self._flush = self.flush
        self._start, self._end = self.event_factory(), self.event_factory()
        for call in self._calls:
            call()
        self._flush()
        self._end.record()
        self._end.synchronize()

    def sample(self) -> float:
        call = self._call()
        self._flush()
        self._start.record()
        call()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # elapsed_time is in milliseconds

    def close(self) -> None:
        self._buffer = None
        self._flush = lambda: None
        self._start = self._end = None
        super().close()


def _on_stream(stream: Any) -> ContextManager[Any]:
    """The context that makes ``stream`` current (a fake stream is its own context)."""
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    return stream


class CudaGraphTimer(Timer):
    """``calls_per_graph`` calls captured in one CUDA graph, replayed between events
    (module docstring). ``capture_factory(graph)`` is the capture context
    (``torch.cuda.graph``)."""

    name = "cuda-graph"

    def __init__(
        self,
        calls_per_graph: int,
        graph_factory: Callable[[], Any] | None = None,
        event_factory: Callable[[], Any] | None = None,
        stream_factory: Callable[[], Any] | None = None,
        capture_factory: Callable[[Any], ContextManager[Any]] | None = None,
    ) -> None:
        super().__init__()
        if calls_per_graph < 1:
            raise ValueError(f"cuda-graph timer: calls_per_graph must be at least 1, not {calls_per_graph}")
        self.calls_per_graph = calls_per_graph
        self.graph_factory = graph_factory or torch.cuda.CUDAGraph
        self.event_factory = event_factory or _timing_event
        self.stream_factory = stream_factory or torch.cuda.Stream
        self.capture_factory = capture_factory or torch.cuda.graph
        self._graph: Any = None
        self._start: Any = None
        self._end: Any = None

    def prepare(self, calls: Sequence[Call]) -> None:
        super().prepare(calls)
        self._start, self._end = self.event_factory(), self.event_factory()
        # torch's CUDA graph docs: warm up on a side stream before capturing, after the
        # work that made the inputs (an event on the current stream the side one waits for)
        side = self.stream_factory()
        ready = self.event_factory()
        ready.record()
        side.wait_event(ready)
        with _on_stream(side):
            for call in self._calls:
                call()
        side.synchronize()
        self._graph = self.graph_factory()
        with self.capture_factory(self._graph):
            for _ in range(self.calls_per_graph):
                self._call()()
        self._graph.replay()  # the first replay uploads the graph: not a sample
        self._end.record()
        self._end.synchronize()

    def sample(self) -> float:
        if self._graph is None:
            raise RuntimeError("cuda-graph timer: prepare() it before sampling")
        self._start.record()
        self._graph.replay()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3 / self.calls_per_graph

    def close(self) -> None:
        self._graph = None  # its memory pool goes with it
        self._start = self._end = None
        super().close()


def _size_bytes(text: str) -> int:
    """sysfs's cache size ("32K", "36M", "512") in bytes."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if scale > 1 else text) * scale


def last_level_cache_bytes(root: str | Path = CPU_CACHE) -> int:
    """The size of CPU 0's highest-level data (or unified) cache, from Linux's sysfs; 32 MiB
    where sysfs does not say."""
    best: tuple[int, int] | None = None
    for index in Path(root).glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            found = int((index / "level").read_text()), _size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if best is None or found > best:
            best = found
    return best[1] if best is not None else DEFAULT_LLC_BYTES


def l2_bytes(device: torch.device | str | int | None) -> int:
    """The L2 cache of a CUDA device, in bytes."""
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def l2_flush_bytes(device: torch.device | str | int | None) -> int:
    """How many bytes to write to empty a CUDA device's L2: four times its size, at least
    the 256 MiB Triton's ``do_bench`` writes."""
    return max(TRITON_FLUSH_BYTES, 4 * l2_bytes(device))


def input_sets_for(bytes_per_set: int, cache_bytes: int, limit: int = 64) -> int:
    """How many input sets of ``bytes_per_set`` bytes make a round of the rotation pass
    through more than twice ``cache_bytes``: at least 1, at most ``limit``.

    Between two uses of one set the others then bring more than one cache of data past it
    (for a set no larger than the cache), so an LRU-like cache has let it go; a set larger
    than twice the cache evicts its own start as it streams through, and one set is enough.
    ``limit`` caps the memory the sets take: below the count this returns, a sample may
    find part of its inputs in the cache.
    """
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, not {bytes_per_set}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    return max(1, min(limit, 2 * cache_bytes // bytes_per_set + 1))


def copy_call(moved_bytes: int, device: str) -> Call:
    """A copy that moves ``moved_bytes`` in all (reads half, writes half, uint8 buffers of
    at least one byte): the bandwidth yardstick a kernel is compared with in the same run.
    The source is written once here, so that on a CPU its pages are real memory (pages never
    written all map to one zero page, and reading them would hit the cache)."""
    half = max(1, moved_bytes // 2)
    src = torch.ones(half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def copy() -> object:
        return dst.copy_(src)

    return copy


def _nothing() -> object:
    return None


def empty_call(device: str) -> Call:
    """The cheapest call the device has, to measure launch time: one empty kernel on CUDA
    (``torch.cuda._sleep(0)``, on the current CUDA device), a Python function that does
    nothing on the CPU."""
    kind = torch.device(device).type
    if kind == "cuda":
        return lambda: torch.cuda._sleep(0)
    if kind == "cpu":
        return _nothing
    raise ValueError(f"empty_call: no empty call for device {device!r} (cpu or cuda)")


def gpu_clock_mhz(device: torch.device | str | int | None) -> int | None:
    """The SM clock of a CUDA device in MHz (``torch.cuda.clock_rate``, which needs pynvml),
    or None where that does not work; never raises."""
    try:
        return int(torch.cuda.clock_rate(device))
    except Exception:
        return None
