"""The one engine behind both front doors (the CLI and the pytest plugin): run a property
against a target for one dtype under a hypothesis profile, and say what happened."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
from hypothesis import HealthCheck, Phase, example, given, seed as hypothesis_seed, settings
from hypothesis import strategies as st

from properties.accuracy import accuracy_sweep
from properties.assertions import CheckFailure
from properties.checks import PROPERTIES, Context, Property
from properties.strategies import critical_cases
from ropecheck.calling import CallError

PROFILES = {
    # derandomized, bounded: the same verdict on every run
    "ci": {"max_examples": 20, "derandomize": True},
    "dev": {"max_examples": 40},
    "thorough": {"max_examples": 300},
}
DEFAULT_PROFILE = "dev"


@dataclass
class Result:
    property: str
    dtype: str
    status: str  # passed | failed | skipped | error
    formula: str
    max_error: Optional[float] = None  # in tolerance units
    examples: int = 0
    seconds: float = 0.0
    message: str = ""
    counterexample: str = ""
    reproduce: str = ""
    accuracy: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunOptions:
    profile: str = DEFAULT_PROFILE
    seed: Optional[int] = None
    timeout: Optional[float] = 20.0
    max_examples: Optional[int] = None
    extra: dict = field(default_factory=dict)

    def settings(self) -> settings:
        chosen = dict(PROFILES[self.profile])
        if self.max_examples is not None:
            chosen["max_examples"] = self.max_examples
        if self.seed is not None:
            chosen["derandomize"] = False
        return settings(
            deadline=None, database=None, print_blob=True,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
            **chosen)


def _example_fits(prop: Property, case) -> bool:
    options = prop.case_options
    return (case.batch >= options.get("min_batch", 1) and case.seq >= options.get("min_seq", 1)
            and case.memory in options.get("memory", (case.memory,)))


def _examples(prop: Property, ctx: Context) -> list:
    out = []
    for case in critical_cases(ctx.dtype, ctx.target.rotary_dim):
        if not _example_fits(prop, case):
            continue
        if prop.case_options.get("positions", True) is False:
            case = case.with_positions(np.zeros((case.batch, case.seq), dtype=np.int64))
        out.append((case, prop.example_extras(ctx, case)))
    return out


def _first_failure(exc: BaseException) -> BaseException:
    """Hypothesis reports several distinct failures as an ExceptionGroup: take the first."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _reproduce_line(exc: BaseException, options: RunOptions, spec: str) -> str:
    for note in getattr(exc, "__notes__", []):
        if "@reproduce_failure" in note:
            return note.strip()
    return spec


def run_property(prop: Property, target, dtype: str, options: RunOptions | None = None,
                 reproduce_hint: str = "") -> Result:
    """Run one property on one dtype. TargetHung propagates (the caller stops the run)."""
    options = options or RunOptions()
    result = Result(prop.name, dtype, "passed", prop.formula)
    applies, why = prop.applies_to(target)
    if not applies:
        result.status, result.message = "skipped", why
        return result
    ctx = Context(target, dtype, options.timeout)
    seen = {"last": None, "max": 0.0, "count": 0}

    @st.composite
    def inputs(draw):
        case = draw(prop.case_strategy(ctx))
        return case, draw(prop.extras(ctx, case))

    def test(drawn):
        case, extras = drawn
        seen["last"] = drawn
        seen["count"] += 1
        error = prop.check(ctx, case, **extras)
        seen["max"] = max(seen["max"], float(error))

    test = given(inputs())(test)
    for case, extras in reversed(_examples(prop, ctx)):
        test = example((case, extras))(test)
    test = options.settings()(test)
    if options.seed is not None:
        test = hypothesis_seed(options.seed)(test)

    start = time.perf_counter()
    try:
        test()
    except (AssertionError, CallError, Exception) as raised:
        exc = _first_failure(raised)
        result.status = "failed" if isinstance(exc, (CheckFailure, CallError)) else "error"
        result.message = (str(exc) if result.status == "failed"
                          else f"internal error {type(exc).__name__}: {exc}")
        result.max_error = getattr(exc, "error", None)
        if seen["last"] is not None:
            case, extras = seen["last"]
            shown = {k: (v.describe() if hasattr(v, "describe") else
                         np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
                     for k, v in extras.items()}
            result.counterexample = case.describe() + (f"; {shown}" if shown else "")
        result.reproduce = _reproduce_line(raised, options, reproduce_hint)
    else:
        result.max_error = seen["max"]
    result.examples = seen["count"]
    if prop.name == "reference":
        result.accuracy = accuracy_sweep(ctx)
    result.seconds = time.perf_counter() - start
    return result


def selected_properties(names=None) -> list[Property]:
    if not names:
        return list(PROPERTIES.values())
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    return [PROPERTIES[n] for n in names]
