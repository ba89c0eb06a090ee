"""Execution modes (``--mode``): how the process that calls the target runs it.

- ``eager``: as it is.
- ``compile``: wrapped in ``torch.compile`` (inductor, on CPU too) as serving and training
  stacks compile: one artefact with the token dimensions dynamic (batch and sequence of
  the tensors, every dimension of the integer ones: positions, offsets), so the shapes a
  run draws share one compiled graph (inference size-oblivious, as vLLM compiles it: one
  token and one sequence share it too), plus a static-shape artefact for the first
  STATIC_SIGNATURES input signatures so that shape-specialised code still runs; the checks
  draw one model's shapes (``ONE_MODEL_MODES``); past dynamo's recompile limit, where it
  would fall back to eager (and the verdict would be eager's under the compile label), a
  fresh compiled function takes over (``Compiled``). Dynamo's graph breaks and the dynamic
  artefact's recompiles are counted with their reasons (``_CompileEvents``), as its
  warnings are.
- ``autocast``, ``autocast-fp16``: called inside ``torch.autocast`` of the input's device
  with bfloat16 / float16, as a model under mixed precision calls it. The inputs keep
  their dtype and are judged at its tolerance: a RoPE must not let autocast lower the
  precision of its angles (HF computes them with autocast disabled for that reason).
- ``cudagraph``: CUDA only. Each input shape and layout is captured once in a CUDA graph
  on buffers of its own (after a warm-up call on a side stream, with positions 0); every
  call then writes its x and positions into those buffers and replays the graph, as a
  server replays a captured decode step. A kernel that reads positions on the host or
  keeps state the graph does not see fails here. The backward is not captured: VJP calls
  run eagerly.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from typing import Callable

import torch

from ropecheck.calling import quiet

MODES = ("eager", "compile", "autocast", "autocast-fp16", "cudagraph")
# Modes that build code per input signature, as a server builds it for the model it
# serves: a run in them draws one model's shapes (``Sizes.one_model``: one head size, head
# count and layout; the batch, the sequence, the positions and the values vary), so that
# one compiled artefact (one captured graph per shape) serves it, not one per head size.
ONE_MODEL_MODES = ("compile", "cudagraph")
AUTOCAST_DTYPES = {"autocast": torch.bfloat16, "autocast-fp16": torch.float16}
RECOMPILE_LIMIT = 64  # distinct shapes and layouts one compiled target may see
STATIC_SIGNATURES = 3  # input signatures compiled with static shapes in a compile run


# What torch.compile warns of (Python warnings, and dynamo's and inductor's log records at
# WARNING and above) is caught where the target runs and counted, never printed (--debug
# prints it as well): ``_pending`` in the process that calls the target, handed back with
# each call's outcome (``take_notes``) and summed over the run in ropecheck's process
# (``record_notes``, ``run_notes``), which reports it in one line.
COMPILE_LOGGERS = ("torch._dynamo", "torch._inductor")
_pending: Counter = Counter()
_run: Counter = Counter()


def _first_line(text) -> str:
    lines = str(text).strip().splitlines()
    return lines[0][:200] if lines else ""


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _pending[_first_line(record.getMessage())] += 1


@contextmanager
def collecting(show: bool = False):
    """Count what torch.compile warns of in the block (``show``: also let it through)."""
    collector = _Collect(logging.WARNING)
    loggers = [logging.getLogger(name) for name in COMPILE_LOGGERS]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = [*lg.handlers, collector] if show else [collector]
        lg.propagate = lg.propagate and show
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate
        for w in caught:
            _pending[f"{w.category.__name__}: {_first_line(w.message)}"] += 1
            if show:
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def note(message: str) -> None:
    """Count one event of a compiling mode (a recompile limit hit, ...)."""
    _pending[message] += 1


def take_notes() -> list:
    """The (message, count) pairs caught since the last call of this, in this process."""
    out = list(_pending.items())
    _pending.clear()
    return out


def record_notes(notes) -> None:
    """Add a call's notes to this run's (ropecheck's process)."""
    for message, count in notes:
        _run[message] += count


def run_notes(clear: bool = False) -> list:
    """This run's notes, most frequent first (``clear``: and start a new run)."""
    out = _run.most_common()
    if clear:
        _run.clear()
    return out


# Dynamo's own record of a compile's graph breaks (``torch._dynamo.utils.counters``) and
# recompiles (its compilation metrics' ``recompile_reason``), noted with these prefixes
GRAPH_BREAK, RECOMPILE = "graph break: ", "recompile: "
EVENT_WIDTH = 240  # characters of a graph break's or recompile's reason


def _counted(notes, what: str) -> str:
    """'N times (K kinds, most often Cx: 'the commonest')' of the notes ``notes`` (most
    frequent first)."""
    total = sum(count for _, count in notes)
    top, count = notes[0]
    kinds = f"{len(notes)} kinds, " if len(notes) > 1 else ""
    return f"{what} {'once' if total == 1 else f'{total} times'} ({kinds}most often {count}x: {top!r})"


def summary(notes) -> str:
    """One line: how many graph breaks and recompiles dynamo made, and how many warnings
    torch.compile gave, each with how many kinds and the commonest."""
    breaks = [(m.removeprefix(GRAPH_BREAK), c) for m, c in notes if m.startswith(GRAPH_BREAK)]
    recompiles = [(m.removeprefix(RECOMPILE), c) for m, c in notes if m.startswith(RECOMPILE)]
    warned = [(m, c) for m, c in notes if not m.startswith((GRAPH_BREAK, RECOMPILE))]
    parts = [_counted(warned, "warned") + "; --debug prints them"] if warned else []
    if breaks:
        parts.append(_counted(breaks, "broke the graph"))
    if recompiles:
        parts.append(_counted(recompiles, "recompiled"))
    if breaks or recompiles:
        parts[-1] += " (TORCH_LOGS=graph_breaks,recompiles shows each)"
    return "torch.compile " + "; ".join(parts) if parts else ""


def reason_line(text: str) -> str:
    """A dynamo message (a graph break's, a compile error's) in one line: its first line,
    its explanation and, when short, its developer context (which often names the op), the
    arguments of a traced call left out (fake tensors' sizes are no reason)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    said = {
        key: line.removeprefix(key).strip()
        for line in lines
        for key in ("Explanation:", "Developer debug context:")
        if line.startswith(key)
    }
    line = lines[0]
    if said.get("Explanation:"):
        line += ": " + said["Explanation:"]
    context = said.get("Developer debug context:", "")
    if context and len(context) <= 100 and context not in line:
        line += f" ({context})"
    line = re.sub(r"\(\*\(.*?\), \*\*\{.*?\}\)", "(...)", line)
    return line if len(line) <= EVENT_WIDTH else line[: EVENT_WIDTH - 3] + "..."


class _CompileEvents:
    """The graph breaks and recompiles dynamo records during a block, noted (``note``) as
    GRAPH_BREAK and RECOMPILE notes: dynamo's counters and compilation metrics are read
    before and after."""

    def __init__(self):
        from torch._dynamo.utils import counters, get_compilation_metrics

        self.counters, self.metrics = counters, get_compilation_metrics
        self.breaks = Counter(counters["graph_break"])
        self.before = get_compilation_metrics()  # kept: their ids stay theirs

    def note(self, recompiles: bool = True) -> None:
        for message, count in (Counter(self.counters["graph_break"]) - self.breaks).items():
            _pending[GRAPH_BREAK + reason_line(message)] += count
        if not recompiles:
            return
        known = {id(m) for m in self.before}
        for m in self.metrics():
            reason = getattr(m, "recompile_reason", None)
            # BACKEND_MATCH: another torch.compile of the same function (ropecheck's static and
            # dynamic artefacts) compiling it for the first time
            if id(m) not in known and reason and "BACKEND_MATCH" not in reason:
                _pending[RECOMPILE + _first_line(reason)[:EVENT_WIDTH]] += 1


def parse(modes) -> list:
    """--mode values (repeated or comma-separated), in order, without repeats; default eager.
    ValueError for an unknown one."""
    names = [n.strip() for item in modes or () for n in str(item).split(",") if n.strip()]
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"unknown --mode {', '.join(unknown)}; known: {', '.join(MODES)}")
    return list(dict.fromkeys(names)) or ["eager"]


def warm_up(modes) -> None:
    """Start what these modes need before the target is loaded (a worker does it while
    ropecheck starts up). ``compile``: import dynamo and inductor and compile a small
    function once, which loads the compiler's machinery (about 4 s on the 2-core CI
    machine, most of a first compile); its notes are dropped."""
    if "compile" in modes:
        with collecting():
            Compiled(lambda x: x * 2.0 + 1.0)(torch.ones(2, 3, 1, 4))
        take_notes()


def require(modes, device: str) -> None:
    """ValueError for a mode this device cannot run."""
    if "cudagraph" in modes and not str(device).startswith("cuda"):
        raise ValueError("--mode cudagraph needs --device cuda (CUDA graphs exist only on CUDA devices)")


def wrap(fn: Callable, mode: str) -> Callable:
    """``fn`` run in ``mode`` (called where the target runs, once per mode)."""
    if mode == "eager":
        return fn
    if mode == "compile":
        return Compiled(fn)
    if mode in AUTOCAST_DTYPES:
        dtype = AUTOCAST_DTYPES[mode]

        def autocast(*args):
            device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
            with torch.autocast(device_type=device, dtype=dtype):
                return fn(*args)

        return autocast
    if mode == "cudagraph":
        return CudaGraphed(fn)
    raise ValueError(f"unknown mode {mode!r}")


class Compiled:
    """``fn`` under ``torch.compile`` (inductor). Each input signature (shapes, strides,
    dtypes, requires_grad) is routed to one artefact for the whole run, so that a check
    calling the same input twice compares one compiled code with itself: the first
    STATIC_SIGNATURES signatures to a static-shape compile, every later one to the dynamic
    compile (``dynamic_dims``). Past dynamo's recompile limit dynamo would run the function
    eagerly, so hitting it is an error here and the next call starts a fresh compiled
    function instead (every call stays compiled)."""

    def __init__(self, fn: Callable):
        from torch import _dynamo

        _dynamo.config.recompile_limit = RECOMPILE_LIMIT
        _dynamo.config.fail_on_recompile_limit_hit = True
        self.dynamo, self.fn = _dynamo, fn
        self.static_signatures: set = set()
        self.seen: set = set()
        self.static = torch.compile(fn, dynamic=False)
        self.dynamic = torch.compile(fn, dynamic=None)

    def _static(self, args) -> bool:
        key = signature(args) + (torch.is_grad_enabled(),)
        if key not in self.seen:
            self.seen.add(key)
            if len(self.static_signatures) < STATIC_SIGNATURES:
                self.static_signatures.add(key)
        return key in self.static_signatures

    def __call__(self, *args):
        static = self._static(args)
        if not static:
            for a in args:
                for dim in dynamic_dims(a):
                    self.dynamo.maybe_mark_dynamic(a, dim)
        events = _CompileEvents()
        with collecting(show=quiet.showing()), _size_oblivious(not static and not _training(args)):
            try:
                return (self.static if static else self.dynamic)(*args)
            except self.dynamo.exc.FailOnRecompileLimitHit:
                note(f"recompile limit ({RECOMPILE_LIMIT}) hit: compiled afresh")
                self.dynamo.reset()
                self.static = torch.compile(self.fn, dynamic=False)
                self.dynamic = torch.compile(self.fn, dynamic=None)
                return (self.static if static else self.dynamic)(*args)
            finally:  # a static artefact recompiles for each of its signatures by design
                events.note(recompiles=not static)


def _training(args) -> bool:
    """Whether a call records a graph for backward (a training step, not inference)."""
    return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _size_oblivious(on: bool):
    """Inference as serving stacks compile it (vLLM's backed_size_oblivious): a dynamic
    size of 1 (one sequence, one token) is not specialised, so decode and prefill share the
    graph. Training compiles as torch.compile does by default: 0 and 1 specialised (with
    size-oblivious sizes, inductor's backward asserted strides the incoming gradient does
    not have)."""
    if not on:
        return nullcontext()
    from torch.fx.experimental import _config as fx_config

    return fx_config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]  # installed by torch.utils._config_module


def signature(args) -> tuple:
    """What makes two calls' inputs different to a compiler or a captured graph."""
    return tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.storage_offset(), a.requires_grad)
        if isinstance(a, torch.Tensor)
        else repr(a)
        for a in args
    )


def dynamic_dims(a) -> range:
    """The dimensions of a call argument a serving stack marks dynamic: the token
    dimensions of a float tensor (all but its last two, heads and head size; the first of a
    flattened (tokens, heads * head_dim) one) and every dimension of an integer one
    (positions, offsets, cu_seqlens)."""
    if not isinstance(a, torch.Tensor) or a.dim() == 0:
        return range(0)
    if a.is_floating_point() or a.is_complex():
        return range(max(a.dim() - 2, 1 if a.dim() == 2 else 0))
    return range(a.dim())


class CudaGraphed:
    """``fn`` captured in a CUDA graph per input signature (shapes, strides, dtypes) and
    replayed with each call's values written into the captured buffers."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.graphs: dict = {}

    def _capture(self, args):
        buffers = []
        for a in args:
            if isinstance(a, torch.Tensor):
                b = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                b.copy_(a if a.is_floating_point() else torch.zeros_like(a))  # positions 0 at capture
                buffers.append(b)
            else:
                buffers.append(a)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.fn(*buffers)  # warm-up: lazy allocations and autotuning outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.fn(*buffers)
        return graph, buffers, out

    def __call__(self, *args):
        if _training(args):
            return self.fn(*args)  # a VJP: the backward is not captured
        key = signature(args)
        if key not in self.graphs:
            self.graphs[key] = self._capture(args)
        graph, buffers, out = self.graphs[key]
        for b, a in zip(buffers, args):
            if isinstance(a, torch.Tensor):
                b.copy_(a)
        graph.replay()
        if isinstance(out, torch.Tensor):
            return out.clone()
        if isinstance(out, (tuple, list)):
            return type(out)(o.clone() if isinstance(o, torch.Tensor) else o for o in out)
        return out
