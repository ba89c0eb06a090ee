"""The one runner behind every front door (the CLI, the pytest plugin, the report): run a
property of any family against a target for one dtype under a hypothesis profile, and say
what happened."""

from __future__ import annotations

import math
import re
import shlex
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Optional

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ropecheck.properties import size_switches
from ropecheck.properties.accuracy import accuracy_sweep
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.core.sizes import SIZES, Sizes
from ropecheck.properties.core.sizes import parse as parse_sizes
from ropecheck.properties.diagnosis import likely_cause
from ropecheck.properties.inputs.cases import abridged
from ropecheck.properties.inputs.strategies import FREE_HEAD_DIMS
from ropecheck.properties.one_d import Context
from ropecheck.properties.property import Property

PROFILES = {
    # derandomized, bounded: the same verdict on every run
    "ci": {"max_examples": 20, "derandomize": True},
    "dev": {"max_examples": 40},
    "thorough": {"max_examples": 300},
    # production sizes (properties.core.sizes): fewer examples, each up to 2^24 elements
    "production": {"max_examples": 12, "derandomize": True},
}
# The sizes a profile draws at, unless --sizes says otherwise: toy for the others.
PROFILE_SIZES = {"production": "production"}


def profile_sizes(profile: str) -> Sizes:
    return SIZES[PROFILE_SIZES.get(profile, "toy")]


DEFAULT_PROFILE = "dev"


# Seconds a property may spend shrinking a counterexample once it has one: bounds the time
# of a failing verdict for a slow target.
SHRINK_BUDGET = 15.0
# Crashes (and exits) a property may see while shrinking: each one costs a new worker process.
CRASH_BUDGET = 2


class _ShrinkBudgetSpent(BaseException):
    """Ends hypothesis' shrinking (a BaseException: hypothesis does not catch it)."""


@dataclass
class Result:
    property: str
    dtype: str
    status: str  # passed | failed | skipped | error
    formula: str
    max_error: Optional[float] = None  # in tolerance units: the largest any input showed
    examples: int = 0
    seconds: float = 0.0
    message: str = ""
    counterexample: str = ""
    reproduce: str = ""
    accuracy: Optional[dict] = None
    notes: list = field(default_factory=list)  # support limits: refusals of exotic inputs
    diagnosis: str = ""  # likely cause of a reference failure
    cause: Optional[str] = None  # the root cause this failure shares with others (session)
    signature: str = ""  # what makes two failures the same cause
    mode: str = "eager"  # how the target was run (ropecheck.modes)
    # a target called through a library interface: the classes of its argument values each
    # call had, one tuple of (factor, class) pairs per distinct combination (the session
    # counts the pairs they cover)
    paths: list = field(default_factory=list)
    # the size switch inputs not tried (their time budget: ``size_switches``), in words
    untried: str = ""
    # the whole failing input (the JSON record's: the printed counterexample abridges it)
    input: dict = field(default_factory=dict)
    # the Triton kernels its calls launched (``ropecheck.calling.launches.Recorded``): the
    # specializations a GPU compiles for them, and on a GPU those it compiled and their time
    launches: Any = None
    # --opcheck: what torch.library.opcheck said of the custom ops its calls made
    # (``ropecheck.calling.opcheck.Called`` records; the session makes its opcheck row of them)
    opchecks: list = field(default_factory=list)
    # the counterexample is hypothesis' minimal one (False: the first input that showed it)
    shrunk: bool = True

    def counterexample_label(self) -> str:  # (a method: ``property`` is a field's name here)
        return "minimal counterexample: " if self.shrunk else "first input: "

    def to_dict(self) -> dict:
        out = {**asdict(self), "max_error": json_number(self.max_error)}
        out.pop("signature")
        out.pop("paths")
        out.pop("launches")
        out.pop("opchecks")
        if self.launches:
            out["launches"] = {
                "specializations": self.launches.count,
                "compiled": self.launches.compiled,
                "compile_seconds": round(self.launches.compile_seconds, 3),
            }
        return out


def json_number(value):
    """A float as strict JSON takes it: non-finite (inf: outputs that must differ are equal)
    as the string "inf"."""
    return str(value) if value is not None and not math.isfinite(value) else value


@dataclass
class RunOptions:
    profile: str = DEFAULT_PROFILE
    seed: Optional[int] = None
    timeout: Optional[float] = 20.0
    max_examples: Optional[int] = None
    strict_layouts: bool = False  # a refusal of an exotic layout fails, instead of a note
    # the sizes inputs are drawn at: a Sizes, a --sizes string, or None: the profile's
    # (PROFILE_SIZES, else toy)
    sizes: Optional[Sizes] = None

    def __post_init__(self):
        if self.sizes is None:
            self.sizes = profile_sizes(self.profile)
        elif isinstance(self.sizes, str):
            self.sizes = parse_sizes(self.sizes)

    @property
    def sizes_flag(self) -> list:
        """``--sizes`` as a reproduce line needs it: nothing where the profile implies them."""
        return [] if self.sizes == profile_sizes(self.profile) else ["--sizes", self.drawn_sizes.spec()]

    @property
    def drawn_sizes(self) -> Sizes:
        """The sizes inputs are drawn at (``sizes``, settled by __post_init__)."""
        assert isinstance(self.sizes, Sizes)
        return self.sizes

    def settings(self) -> settings:
        chosen: dict[str, Any] = dict(PROFILES[self.profile])
        if self.max_examples is not None:
            chosen["max_examples"] = self.max_examples
        if self.seed is not None:
            chosen["derandomize"] = False
        return settings(
            deadline=None,
            database=None,
            print_blob=True,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            **chosen,
        )


def failures_in(exc: BaseException) -> list:
    """Hypothesis reports several distinct failures as an ExceptionGroup: all of them."""
    group = getattr(exc, "exceptions", None)  # (Base)ExceptionGroup, or its backport
    if group:
        return [leaf for sub in group for leaf in failures_in(sub)]
    return [exc]


def _reproduce_line(exc: BaseException, command: str) -> str:
    """Our command line, and hypothesis' @reproduce_failure blob when it printed one."""
    for note in getattr(exc, "__notes__", []):
        if "@reproduce_failure" in note:
            blob = note[note.index("@reproduce_failure") :].split(" as a decorator")[0]
            return f"{command}  (in Python: {blob})"
    return command


def replay_pytest_command(config, name: str, dtype: str) -> str:
    """The pytest invocation that replays one check (the pytest front door's reproduce
    line): this run's arguments (``config``: pytest's), its seed, and -k."""
    args = [a for a in config.invocation_params.args if not a.startswith("--rope-seed")]
    seed = config.getoption("--rope-seed")
    return shlex.join(
        ["pytest", *args] + ([f"--rope-seed={seed}"] if seed is not None else []) + ["-k", f"{name} and {dtype}"]
    )


class Seen:
    """What the examples showed: the largest error (failures included), and for every
    failure raised, the input that raised it (so that a failure's message and its
    counterexample always describe the same input)."""

    def __init__(self):
        self.max = 0.0
        self.count = 0
        self.inputs: dict[int, tuple] = {}
        self.latest: Optional[tuple] = None  # (input, failure): the smallest so far
        self.since: Optional[float] = None  # when the first failure was seen
        self.crashes = 0
        self.rate = 0.0  # seconds per input row of the slowest check so far (``measured``)

    def measured(self, seconds: float, rows: float) -> None:
        """A check's time on an input of ``rows`` head vectors (tokens x heads): from
        MEASURED_ROWS on, the target's speed (its calls and the check's own work per row,
        a bound on one call's)."""
        if rows >= MEASURED_ROWS:
            self.rate = max(self.rate, seconds / rows)

    def passed(self, error: float):
        self.max = max(self.max, float(error))

    def failed(self, drawn, failure: BaseException):
        self.inputs[id(failure)] = drawn
        self.latest = (drawn, failure)
        self.since = self.since or time.perf_counter()
        self.crashes += isinstance(failure, CallError) and failure.kind in ("crashed", "exited")
        error = getattr(failure, "error", None)
        if error is not None:
            self.max = max(self.max, float(error))

    def budget_spent(self) -> bool:
        return self.crashes >= CRASH_BUDGET or (
            self.since is not None and time.perf_counter() - self.since > SHRINK_BUDGET
        )


def signature(exc: BaseException, counterexample: str) -> str:
    """What two failures must share to be one root cause: the same exception type raised at
    the same place, the same crash, the same kind of contract breach (values aside), or
    the same minimal input."""
    if isinstance(exc, CallError):
        text = str(exc)
        if exc.kind == "raised":
            kind = text.removeprefix("the target raised ").split(":")[0]
            where = re.findall(r"\(at ([^()]+)\)$", text)
            return f"raised {kind} at {where[-1] if where else '?'}"
        if exc.kind in ("exited", "crashed"):
            return f"{exc.kind}: {text}"
        return f"{exc.kind}: " + re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", text)
    return "input: " + counterexample.split("; {")[0]


@contextmanager
def _draws_from_the_seed_alone():
    """Hypothesis mixes into its draws (about 1 in 20) literals it reads from the source of
    every local module the process has loaded: the target's file, ropecheck's own in an
    editable install, a test session's other modules. A derandomized verdict then hung on
    what else the process had imported: in this project's test session, a kernel wrong only
    on the sbhd layout passed once, after other tests had loaded their kernels. While a
    property runs that pool is empty; hypothesis' own constants stay. A hypothesis without
    the pool (older, or renamed) is left as it is."""
    try:
        from hypothesis.internal.conjecture import providers

        empty, loaded, cache = providers.Constants(), providers._get_local_constants, providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):  # pragma: no cover - another hypothesis
        yield
        return
    cache.clear()  # the allowed constants per draw, the local ones among them
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = loaded
        cache.clear()


def run_property(
    prop: Property, target, dtype: str, options: RunOptions | None = None, reproduce_hint: str = ""
) -> Result:
    """Run one property of any family on one dtype: its drawn inputs (shrunk to a minimal
    counterexample on failure), then its family's fixed inputs, then its exotic probes.
    TargetHung propagates (the caller stops the run)."""
    options = options or RunOptions()
    result = Result(prop.name, dtype, "passed", prop.formula)
    applies, why = prop.applies_to(target)
    if not applies:
        result.status, result.message = "skipped", why
        return result
    ctx = prop.context(target, dtype, options.timeout, options.drawn_sizes)
    seen = Seen()

    @st.composite
    def inputs(draw):
        case = draw(prop.case_strategy(ctx))
        return case, draw(prop.extras(ctx, case))

    def attempt(drawn):
        run_check(drawn, prop.check)

    def run_check(drawn, check, predicted: float = 0.0):
        """``predicted``: the seconds a call on this input is expected to take at the
        target's measured speed (a size switch input), which its time limit allows for."""
        if seen.budget_spent():
            raise _ShrinkBudgetSpent()
        case, extras = drawn
        seen.count += 1
        ctx.rope.case = case  # its q/k split and sequences shape the calls on its tensors
        rows = float(np.prod(case.shape[:-1]))
        ctx.rope.timeout = call_time_limit(options.timeout, case, predicted, seen.rate)
        start = time.perf_counter()
        try:
            error = check(ctx, case, **extras)
        except TargetHung as hung:
            hung.case = _describe(case, extras)
            raise
        except Exception as failure:
            seen.measured(time.perf_counter() - start, rows)
            seen.failed(drawn, failure)
            raise
        seen.measured(time.perf_counter() - start, rows)
        seen.passed(error)

    def after_drawn():
        rate = 0.0  # seconds per element of the larger fixed inputs: the target's speed
        for drawn in prop.fixed(ctx):  # the fixed inputs every run tries
            start = time.perf_counter()
            attempt(drawn)
            elements = float(np.prod(drawn[0].shape))
            if elements >= RATE_ELEMENTS:
                rate = max(rate, (time.perf_counter() - start) / elements)
        _size_switches(prop, ctx, options, seen, run_check, result, rate)
        for probe in prop.probes(ctx):  # then the exotic inputs, where refusals are notes
            try:
                run_check((probe.case, {}), probe.check)
            except CallError as exc:
                if exc.kind != "raised" or options.strict_layouts:
                    raise
                said = str(exc).removeprefix("the target raised ")
                result.notes.append(f"raises on {probe.what}: {said}")

    start = time.perf_counter()
    failing = _run(
        result,
        seen,
        inputs(),
        attempt,
        options,
        reproduce_hint,
        after_drawn,
        describe=lambda drawn: _describe(*drawn),
        whose=lambda exc, drawn: _whose_head(exc, drawn[0]),
    )
    if failing is not None and result.status == "failed" and prop.size_switches:
        _switch_of(failing, result, prop, ctx, options)
    if prop.sweeps:
        _sweep(result, ctx, reproduce_hint)
        if result.status == "failed":
            result.diagnosis = _likely_cause(ctx)
    result.seconds = time.perf_counter() - start
    result.paths = sorted(getattr(ctx.rope, "paths", ()))
    result.launches = getattr(ctx.rope, "launches", None)
    result.opchecks = list(getattr(ctx.rope, "opchecks", ()))
    return result


def _run(
    result: Result,
    seen: Seen,
    strategy,
    attempt,
    options: RunOptions,
    reproduce_hint: str,
    after_drawn,
    describe,
    whose=lambda exc, drawn: "",
):
    """The one loop every check of every family runs in: hypothesis over ``strategy``
    (shrinking within the budgets), then ``after_drawn()``; a failure is recorded in ``result`` with the input that
    raised it (message and counterexample from the same failure), the largest error seen
    either way. Returns the failing input (None: none, or not known)."""
    drawn = None
    test = options.settings()(given(strategy)(attempt))
    if options.seed is not None:
        test = hypothesis_seed(options.seed)(test)
    try:
        with _draws_from_the_seed_alone():
            test()
        after_drawn()
    except (Exception, _ShrinkBudgetSpent) as raised:
        budget_spent = isinstance(raised, _ShrinkBudgetSpent)
        if budget_spent:
            assert seen.latest is not None  # the budget runs only once a failure was seen
            drawn, exc = seen.latest
        else:
            exc = failures_in(raised)[0]
            drawn = seen.inputs.get(id(exc))
        known = isinstance(exc, (CheckFailure, CallError))
        result.status = "failed" if known else "error"
        result.message = str(exc) if known else f"internal error {type(exc).__name__}: {exc}"
        if drawn is not None:
            result.input = _record(*drawn) if isinstance(drawn, tuple) and len(drawn) == 2 else {}
            result.message += whose(exc, drawn)
            result.counterexample = describe(drawn) + (
                f" (shrinking stopped after {SHRINK_BUDGET:g} s or {CRASH_BUDGET} crashes: the "
                "smallest found, perhaps not minimal)"
                if budget_spent
                else ""
            )
        result.reproduce = _reproduce_line(exc, reproduce_hint)
        if result.reproduce == reproduce_hint:
            result.reproduce = _reproduce_line(raised, reproduce_hint)
        result.signature = signature(exc, result.counterexample)
    result.max_error = seen.max if seen.count else None
    if result.status != "passed" and not seen.max > 1.0:
        result.max_error = None  # the failure is not a measured error (a raise, a crash, ...)
    result.examples = seen.count
    return drawn


# Elements of the largest drawn input, about: a call on more gets a proportionally longer
# time limit (a large fixed input under an interpreter is slow, not hung).
DRAWN_ELEMENTS = 2**16


def call_time_limit(timeout: Optional[float], case, predicted: float = 0.0, rate: float = 0.0) -> Optional[float]:
    """One call's time limit: ``timeout`` scaled by the input's size past the drawn ones,
    and at least SLACK times the ``predicted`` seconds (the target's measured speed: a slow
    target on a busy machine is slow, not hung). ``rate``: the seconds per head vector the
    checks so far took (``Seen.rate``): a large input gets SLACK times that much per row of
    its own (a kernel under an interpreter runs a program per row or block of rows, whatever
    the head size), within SPEED_ALLOWANCE times the size-scaled limit."""
    if not timeout:
        return timeout
    limit = max(timeout * max(1.0, float(np.prod(case.shape)) / DRAWN_ELEMENTS), SLACK * predicted)
    rows = float(np.prod(case.shape[:-1]))
    return max(limit, min(SLACK * rate * rows, SPEED_ALLOWANCE * limit))


SLACK = 4.0  # a call's time limit over its predicted time
# A check whose input has this many head vectors measures the target's speed (per row,
# its fixed costs included: an overestimate for a larger input, so a generous limit)
MEASURED_ROWS = 32
SPEED_ALLOWANCE = 8.0  # at most this many times the size-scaled limit, from the speed measured


# Seconds the size switch inputs of one property and dtype may take (at the rate the first
# ones took); the production profile tries the larger ones on a slow target too.
SIZE_BUDGET = {"production": 120.0}
DEFAULT_SIZE_BUDGET = 3.0


# Elements past which a fixed input's time measures the target's speed (below, a call's own
# overhead does)
RATE_ELEMENTS = 2**16


def _size_switches(
    prop: Property, ctx, options: RunOptions, seen: Seen, run_check, result: Result, rate: float = 0.0
) -> None:
    """The inputs that cross the size switch points (``size_switches``), smallest first: the
    first ones always, the others while their time (predicted at ``rate``, seconds per
    element, from the inputs before: the larger fixed ones, then these) fits the budget,
    whatever is left out named; a failure is searched down to its
    boundary, and a size switch found is the failure, its boundary input the
    counterexample."""
    budget = SIZE_BUDGET.get(options.profile, DEFAULT_SIZE_BUDGET)
    passed: dict = {}  # kind -> the largest count that passed
    spent = 0.0

    def fails(case, **extras):
        predicted = rate * float(np.prod(case.shape))
        ctx.rope.case, ctx.rope.timeout = case, call_time_limit(options.timeout, case, predicted)
        prop.check(ctx, case, **extras)

    sizes, result.untried = prop.size_inputs(ctx)
    for size in sizes:
        predicted = rate * size.elements
        if not size_tried(size.always, predicted, spent, budget, options.timeout):
            result.untried = "; ".join(
                filter(
                    None,
                    (
                        f"size switches: inputs from {size.crosses} on not tried (about {rate * size.elements:.0f} s "
                        f"each at this target's speed, past the {budget:g} s of the {options.profile} profile; "
                        "--profile production tries them)",
                        result.untried,
                    ),
                )
            )
            return
        start = time.perf_counter()
        try:
            run_check((size.case, size.extras(size.case)), prop.check, predicted)
        except (CheckFailure, CallError):
            found = size_switches.boundary(size, fails, passed.get(size.kind, 0))
            if found is None:
                raise
            failure = _switch_failure(found)
            seen.failed((found.case, size.extras(found.case)), failure)
            raise failure from None
        took = time.perf_counter() - start
        spent, rate = spent + took, max(rate, took / max(size.elements, 1))
        passed[size.kind] = size.count


def size_tried(always: bool, predicted: float, spent: float, budget: float, timeout: Optional[float]) -> bool:
    """Whether a size switch input is tried: the first ones (``always``) whatever the
    budget, unless one call alone is predicted to take over an eighth of a call's time
    limit (a kernel under an interpreter, whose time per element also grows with the
    input); the others while the ``predicted`` seconds fit what is left of the ``budget``."""
    if always and not (timeout and predicted > timeout / 8):
        return True
    return spent + predicted <= budget


def _switch_failure(found) -> CheckFailure:
    """The failure a size switch is: its sentence, then what failed at its boundary."""
    error, where = getattr(found.failure, "error", float("inf")), getattr(found.failure, "where", {})
    failure = CheckFailure(f"{found.sentence}: {found.failure}", error, where)
    return failure


def _switch_of(failing, result: Result, prop: Property, ctx, options: RunOptions) -> None:
    """A failure of a large input (a drawn one at production sizes, a fixed large one)
    searched down to the boundary of a size switch: where one is found, it is the failure,
    the boundary input its counterexample (hypothesis cannot shrink below a switch)."""
    case, extras = failing
    if getattr(case, "call", None) not in ("x", "qk", "packed") or result.message.startswith("size switch: "):
        return
    size = size_switches.from_case(case)
    if size is None:
        return

    def fails(case, **more):
        ctx.rope.case, ctx.rope.timeout = case, call_time_limit(options.timeout, case)
        prop.check(ctx, case, **{**extras, **more})

    found = size_switches.boundary(size, fails, 0)
    if found is None:
        return
    failure = _switch_failure(found)
    result.message = str(failure) + _whose_head(failure, found.case)
    result.counterexample = _describe(found.case, size.extras(found.case))
    result.input = _record(found.case, size.extras(found.case))
    result.signature = signature(failure, result.counterexample)


def _whose_head(exc: BaseException, case) -> str:
    """For a (q, k) call: whether the worst element's head is one of q's or of k's."""
    head = getattr(exc, "where", {}).get("head")
    if head is None or getattr(case, "call", "x") != "qk":
        return ""
    return (
        f" (head {head} is q's head {head})"
        if head < case.heads
        else f" (head {head} is k's head {head - case.heads}: k has {case.k_heads}, q {case.heads})"
    )


def _sweep(result: Result, ctx: Context, reproduce_hint: str) -> None:
    """The accuracy sweep of ``reference``: its largest error counts in the result's."""
    result.accuracy = accuracy_sweep(ctx)
    worst = result.accuracy.get("max_error", 0.0)
    result.max_error = max(result.max_error or 0.0, worst)
    if result.status == "passed" and worst > 1.0:
        at = result.accuracy["positions"][int(np.argmax(result.accuracy["error"]))]
        result.status = "failed"
        result.message = (
            f"accuracy sweep: error {worst:.3g} x tolerance at position {at} "
            f"(x of shape (1, {len(result.accuracy['positions'])}, "
            f"4, {ctx.target.rotary_dim or FREE_HEAD_DIMS[0]}), one position per token)"
        )
        result.reproduce = reproduce_hint
        result.signature = f"input: accuracy sweep {result.message}"


def _likely_cause(ctx: Context) -> str:
    """The usual suspect that explains a reference failure ('' when none fits)."""
    try:
        cause = likely_cause(ctx)
    except Exception:  # a diagnosis is a help, never a new failure
        return ""
    return (cause or "").removeprefix("likely cause: ")


def _record(case, extras) -> dict:
    """The whole input, as JSON takes it: the case's fields and the extras' values."""

    def plain(value):
        if is_dataclass(value) and not isinstance(value, type):
            return {k: plain(v) for k, v in asdict(value).items()}
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (int, float, str, bool)) or value is None else repr(value)

    return {"case": plain(case), "extras": plain(extras)}


def _describe(case, extras) -> str:
    """The input in one line: lists (positions, steps, offsets) abridged (``abridged``); the
    whole input is the JSON record's (``Result.input``) and the reproduce line's."""
    shown = ", ".join(f"{k!r}: {abridged(v)}" for k, v in extras.items())
    return case.describe() + (f"; {{{shown}}}" if shown else "")
