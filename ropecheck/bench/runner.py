"""One bench run: a target (and an ``--against`` target) timed at each shape and dtype.

Per row:
1. the input (``shapes.Shape``) made as the checks make theirs (``Case``: the target's call
   form, its interface's choices), and the target's output on it checked against the
   float64 reference by the family's ``reference`` property, within its error model: a
   kernel that is fast and wrong is reported wrong and not timed;
2. the call prepared once in the target's process (``calling.timed``: the staged call
   recorded, then made again and again) and timed in blocks interleaved with a copy of
   the same bytes on the same device (``timing.sampling.interleave``, the arms' order
   shuffled per block) until the median of the per-block ratio kernel / copy settles or the
   row's budget is spent; then the host timer (wall time per eager call) for a few blocks;
3. the output checked again on fresh inputs (a kernel that goes wrong after many calls:
   a cache it fills, a state it keeps).
The device's empty call is timed once per timer (launch time: a row within 3x of it is
launch-bound). On CUDA the copy's block medians and the SM clock tell of throttling.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import numpy as np
import torch

from ropecheck.bench import shapes as bench_shapes
from ropecheck.bench.traffic import Traffic, itemsize, traffic
from ropecheck.calling.caller import Executor
from ropecheck.calling.in_process import InProcess
from ropecheck.calling.timed import TimeRequest
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.core.contract import APPLIER_FORMS, CallError, TargetHung
from ropecheck.properties.core.sizes import TOY
from ropecheck.properties.inputs.cases import Case, nested
from ropecheck.properties.nd.checks import coordinates_of, limit
from ropecheck.properties.nd.coordinates import grid_sides
from ropecheck.properties.one_d import for_interface
from ropecheck.properties.runner import call_time_limit
from ropecheck.session.spec import family_of
from ropecheck.targets.target import Target
from ropecheck.timing import stats
from ropecheck.timing.sampling import Samples, interleave
from ropecheck.timing.timers import input_sets_for, l2_bytes

GRAPH_BELOW = 32 * 2**20  # bytes moved: below, launch overhead dominates a cold call on a GPU
LAUNCH_BOUND = 3.0  # a call within this factor of the empty call's time is launch-bound
BLOCK = 5  # samples per arm per block
HOST_BLOCKS = 3
THROTTLE = 0.10  # the copy slowing by this much during a row on a GPU: throttling suspected
CPU_DRIFT = 0.25  # on a CPU (shared, frequency-scaled), a drift worth saying
CALLS_PER_GRAPH = 20  # calls captured in one graph at least (one per input set when there are more)
GRAPH_SETS = 8192  # input sets at most: a decode call's inputs (tens of KB) times this pass twice an H200's L2


@dataclass
class Row:
    """One shape in one dtype: its verdict (``status``: timed, wrong, error), its samples and
    figures, the gate's verdict against a baseline (set by ``gate``)."""

    shape: bench_shapes.Shape
    dtype: str
    traffic: Traffic
    status: str = "timed"
    message: str = ""
    timer: str = ""
    samples: Optional[Samples] = None
    host: list = field(default_factory=list)
    launch: float = 0.0  # the empty call's median with the row's timer
    notes: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    against: Optional[str] = None  # the --against target's name (its arm in samples)
    device: str = ""  # the device's name (``run.device_name``), recorded with the row
    gate: Optional[stats.Gate] = None

    @property
    def name(self) -> str:
        return f"{self.dtype} {self.shape.name}"

    def times(self, arm: str = "call") -> np.ndarray:
        assert self.samples is not None
        return np.asarray(self.samples.arms[arm])

    @property
    def median(self) -> float:
        return float(np.median(self.times()))

    @property
    def interval(self) -> tuple:
        return stats.median_interval(self.times())

    @property
    def copy_median(self) -> float:
        return float(np.median(self.times("copy")))

    @property
    def ratios(self) -> np.ndarray:
        assert self.samples is not None
        return self.samples.ratios("call", "copy")

    @property
    def launch_bound(self) -> bool:
        return self.launch > 0 and self.median < LAUNCH_BOUND * self.launch

    @property
    def gb_per_s(self) -> float:
        return self.traffic.moved / self.median / 1e9

    @property
    def percent_of_copy(self) -> float:
        return 100.0 * self.copy_median / self.median


@dataclass
class Subject:
    """A target being timed: its name, its caller (the checks' ``Caller``) and the family's
    reference property and context, per dtype."""

    name: str
    target: Target
    timeout: Optional[float]
    contexts: dict = field(default_factory=dict)
    in_process: Optional[InProcess] = None

    @property
    def executor(self) -> Executor:
        """The target's worker, or (``--in-process``) one executor in this process."""
        if self.target.executor is not None:
            return self.target.executor
        if self.in_process is None:
            assert self.target.fn is not None, "an in-process target has its callable"
            self.in_process = InProcess(self.target.fn)
        return self.in_process

    def restart(self) -> None:
        """A new process for the target (a worker's; in-process targets stay): what a rerun
        is timed in."""
        start = getattr(self.executor, "start", None)
        if start is not None:
            start()

    def context(self, dtype: str):
        if dtype not in self.contexts:
            prop = reference_property(self.target)
            self.contexts[dtype] = (prop, prop.context(self.target, dtype, self.timeout, TOY))
        return self.contexts[dtype]


def reference_property(target):
    """The family's reference agreement (ValueError when it has none, or no convention)."""
    family = family_of(target)
    found = [p for p in family.properties.values() if p.name == "reference"]
    if not found:
        raise ValueError(f"--family {family.name} has no reference property to check a timed call against")
    prop = found[0]
    applies, why = prop.applies_to(target)
    if not applies:
        raise ValueError(f"bench checks each timed call against the float64 reference, which {why}")
    return prop


def case_for(target, shape: bench_shapes.Shape, dtype: str, seed: int) -> Case:
    """The shape's input as the checks make one for ``target``: its call form's split of q
    and k heads (q and k together in one x for the x and packed forms), packed sequences,
    its interface's choices; an N-D rotation's positions a patch grid (``nd_positions``)."""
    m = shape.model
    nd = target.n_axes > 1 or target.family != "rope"
    positions = nd_positions(target, shape) if nd else shape.positions(seed)
    call = target.call
    heads, k_heads = (m.q_heads, m.k_heads or m.q_heads) if call == "qk" else (m.q_heads + m.k_heads, 0)
    extra = dict(n_axes=target.n_axes, position_dtype=str(positions.dtype)) if nd else {}
    if call == "packed":
        flat = positions.reshape(1, shape.tokens, *positions.shape[2:])
        case = Case(dtype, 1, shape.tokens, heads, m.head_dim, nested(flat, flat.dtype), seed=seed, call=call,
                    lengths=(shape.seq,) * shape.sequences, **extra)  # fmt: skip
    else:
        case = Case(dtype, shape.sequences, shape.seq, heads, m.head_dim, nested(positions, positions.dtype),
                    seed=seed, call=call, k_heads=k_heads, **extra)  # fmt: skip
    if call in APPLIER_FORMS:  # x as (B, S, H, D), diffusers' sequence_dim=1
        return case.with_choices(sequence_dim="1")
    return case if nd else for_interface(case, target)


def nd_positions(target, shape: bench_shapes.Shape) -> np.ndarray:
    """(sequences, seq, n_axes): each sequence one image's (a video's) patches, the meshgrid
    of a grid as near square as the axes allow, last axis fastest; token indices count from
    0 (within the target's range), declared coordinates span their ranges."""
    n = target.n_axes
    coords = coordinates_of(target)
    sides = grid_sides(shape.seq, n)
    if coords.token_indices:
        top = max(limit(target) // 2, 1)
        axes = [np.minimum(np.arange(side), top) for side in sides]
    else:
        lo, hi = coords.bounds(n)
        axes = [
            np.clip(lo[a] + np.arange(side), lo[a], hi[a]) if coords.kind == "int" else np.linspace(lo[a], hi[a], side)
            for a, side in enumerate(sides)
        ]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, n)[: shape.seq]
    return np.ascontiguousarray(np.broadcast_to(grid, (shape.sequences, shape.seq, n))).astype(coords.dtype)


def check_output(subject: Subject, case: Case) -> Optional[tuple]:
    """None when the target's output on ``case`` agrees with the float64 reference, else
    (status, message): ("wrong", the check's finding) or ("error", the call's failure)."""
    prop, ctx = subject.context(case.dtype)
    ctx.rope.case = case
    ctx.rope.timeout = call_time_limit(subject.timeout, case)
    try:
        prop.check(ctx, case)
    except CheckFailure as failure:
        return "wrong", str(failure).split("\n")[0]
    except CallError as exc:
        return ("wrong" if exc.kind not in ("raised", "crashed", "exited") else "error"), f"{exc.kind}: {exc}"
    except TargetHung as exc:
        return "error", f"hung: {exc}"
    return None


@dataclass
class Plan:
    """How a run times: its device, timer (``auto`` resolved per row), the CPU threads and
    the budget per row."""

    device: str
    timer: str = "auto"
    threads: Optional[int] = None
    budget: float = 10.0
    seed: int = 0

    @property
    def settle(self) -> float:
        """The relative width of the median's interval at which sampling stops: 2 % on a
        GPU, 5 % on a CPU (a shared machine's noise rarely allows less in seconds)."""
        return 0.02 if self.device.startswith("cuda") else 0.05

    def timer_for(self, moved: int) -> str:
        if self.timer != "auto":
            return self.timer
        if not self.device.startswith("cuda"):
            return "cpu"
        return "cuda-graph" if moved < GRAPH_BELOW else "cuda-cold"

    def sets_for(self, timer: str, moved: int) -> int:
        """Input sets rotated through: more than the L2 for the graph timer (it does not
        flush), one for a timer that flushes or a host timer."""
        if timer != "cuda-graph":
            return 1
        return input_sets_for(moved, l2_bytes(self.device), limit=GRAPH_SETS)


def fits(shape: bench_shapes.Shape, dtype: str, device: str) -> bool:
    """Whether a shape's input fits: on CUDA a sixth of the free memory for the input and
    its sets; on the host (the float64 reference and its bound) a quarter of what is
    available."""
    m = shape.model
    elements = shape.tokens * (m.q_heads + m.k_heads) * m.head_dim
    host = elements * 8 * 8  # float64: the input, the reference, the bound, their differences
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = 8 * 2**30
    if host > available / 4:
        return False
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return elements * itemsize(dtype) * 6 < free
    return True


class Runner:
    """Times rows for ``subject`` (and ``other``, an ``--against`` target) under ``plan``."""

    def __init__(self, subject: Subject, plan: Plan, other: Optional[Subject] = None):
        self.subject, self.plan, self.other = subject, plan, other
        self.launch: dict = {}  # timer -> the empty call's median
        self.rows = 0

    def _launch_time(self, timer: str, key: str) -> float:
        if timer not in self.launch:
            arm = _Arm(
                self.subject,
                TimeRequest(
                    f"{key}|empty",
                    "empty",
                    timer,
                    0,
                    device=self.plan.device,
                    threads=self.plan.threads,
                    calls_per_graph=CALLS_PER_GRAPH,
                    timeout=60.0,
                ),
            )
            self.launch[timer] = float(np.median(arm(2 * BLOCK)))
        return self.launch[timer]

    def row(self, shape: bench_shapes.Shape, dtype: str) -> Row:
        target = self.subject.target
        m = shape.model
        subjects = [self.subject] + ([self.other] if self.other is not None else [])
        cases = {s.name: case_for(s.target, shape, dtype, self.plan.seed) for s in subjects}  # each made once
        case = cases[self.subject.name]
        moved = traffic(target, dtype, shape.tokens, m.q_heads, m.k_heads, m.head_dim, case.positions_array())
        row = Row(shape, dtype, moved)
        for subject in subjects:  # first: a wrong kernel is not timed
            found = check_output(subject, cases[subject.name])
            if found is not None:
                who = f"{subject.name}: " if subject is not self.subject else ""
                row.status, row.message = found[0], who + found[1]
                return row
        self.rows += 1
        key = f"row{self.rows}"
        timer = row.timer = self.plan.timer_for(moved.moved)
        limit = 60.0 + 10 * (call_time_limit(self.subject.timeout, case) or 20.0)

        def call_arm(subject: Subject, name: str, kind: str, common: dict) -> _Arm:
            case = cases[subject.name]
            rope = subject.context(dtype)[1].rope
            rope.case = case
            positions = torch.from_numpy(np.ascontiguousarray(case.positions_array()))
            request = rope.request("call", (case.tensor(),), positions, case=case)
            return _Arm(subject, TimeRequest(f"{key}|{name}|{kind}", "call", kind, 0, request=request, **common))

        try:
            for kind in [timer] + (["cuda-cold"] if timer == "cuda-graph" else []):
                sets = self.plan.sets_for(kind, moved.moved)
                common: dict[str, Any] = dict(
                    device=self.plan.device,
                    threads=self.plan.threads,
                    calls_per_graph=max(CALLS_PER_GRAPH, sets),  # every set once per replay
                    timeout=limit,
                    sets=sets,
                )
                call = call_arm(self.subject, "call", kind, common)
                arms: dict[str, Callable[[int], list]] = {"call": call}
                if self.other is not None:
                    row.against = self.other.name
                    arms["against"] = call_arm(self.other, "against", kind, common)
                try:
                    for arm in arms.values():
                        arm(1)  # prepared (a graph captured) before the first block
                except CallError as exc:
                    if kind != "cuda-graph":
                        raise
                    row.notes.append(f"cannot be captured in a CUDA graph ({exc}): timed cold instead")
                    continue
                row.timer = timer = kind
                arms["copy"] = _Arm(
                    self.subject, TimeRequest(f"{key}|copy|{kind}", "copy", kind, 0, moved_bytes=moved.moved, **common)
                )
                break
            row.launch = self._launch_time(timer, key)
            row.samples = interleave(
                arms,
                block=BLOCK,
                budget_s=self.plan.budget,
                settle=self.plan.settle,
                watch=("call", "copy"),
                seed=self.plan.seed + self.rows,
            )
            host = call_arm(self.subject, "host", "host", {**common, "sets": 1})
            row.host = [s for _ in range(HOST_BLOCKS) for s in host(BLOCK)]
        except (CallError, TargetHung) as exc:
            row.status, row.message = "error", f"while timing: {exc}"
            return row
        row.info = call.info
        self._notes(row)
        launched = getattr(self.subject.context(dtype)[1].rope, "launches", None)
        if launched is not None and launched.count and not self.plan.device.startswith("cuda"):
            row.notes.append("Triton's interpreter ran this kernel (no GPU here): its times are the interpreter's")
        fresh = check_output(self.subject, case_for(target, shape, dtype, self.plan.seed + 1))
        if fresh is not None:
            row.status, row.message = fresh[0], f"after timing, on fresh inputs: {fresh[1]}"
        return row

    def _notes(self, row: Row) -> None:
        assert row.samples is not None
        drift = stats.drift(row.samples.block_medians("copy"))
        gpu = self.plan.device.startswith("cuda")
        if drift > (THROTTLE if gpu else CPU_DRIFT):
            cause = "throttling suspected" if gpu else "the machine's speed changed (load, frequency scaling)"
            row.notes.append(
                f"{cause}: the same copy got {100 * drift:.0f} % slower during the row (the ratio to the copy, "
                "what a baseline compares, still compares like with like)"
            )
        clock = row.info.get("clock_mhz")
        if clock and clock[0] and clock[1] and clock[1] < clock[0] * (1 - THROTTLE):
            row.notes.append(f"the GPU's clock fell from {clock[0]} to {clock[1]} MHz during the row: throttled")
        if row.samples.stopped != "settled":
            blocks = len(row.ratios)
            width = stats.relative_width(row.ratios) if blocks >= 2 else math.inf
            said = f"its interval {100 * width:.1f} % of it" if math.isfinite(width) else f"{blocks} block"
            row.notes.append(f"stopped at the {row.samples.stopped} before the median settled ({said})")


class _Arm:
    """Blocks of samples of one TimeRequest in a subject's process: the call (its inputs)
    sent with the first block only, and again when the process had to be restarted."""

    def __init__(self, subject: Subject, request: TimeRequest):
        self.subject, self.request = subject, request
        self.sent = False
        self.info: dict = {}

    def __call__(self, n: int) -> list:
        request = replace(self.request, samples=n)
        if self.sent:
            request = replace(request, request=None)
        timed = self.subject.executor.time(request)
        if timed.error is not None and timed.error[0] == "unprepared":
            timed = self.subject.executor.time(replace(self.request, samples=n))
        if timed.error is not None:
            raise CallError(*timed.error)
        self.sent = True
        self.info = timed.info
        return timed.samples


def default_dtype(target, device: str) -> str:
    """bfloat16 on CUDA, float32 on the CPU, where the target takes them; else its first."""
    for dtype in ("bfloat16", "float32") if device.startswith("cuda") else ("float32",):
        if dtype in target.dtypes:
            return dtype
    return target.dtypes[0]
