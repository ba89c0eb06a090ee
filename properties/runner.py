"""The one engine behind both front doors (the CLI and the pytest plugin): run a property
against a target for one dtype under a hypothesis profile, and say what happened."""

from __future__ import annotations

import math

import time
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings
from hypothesis import strategies as st

from properties.accuracy import accuracy_sweep
from properties.assertions import CheckFailure
from properties.checks import PROPERTIES, Context, Property
from properties.strategies import FREE_HEAD_DIMS, critical_cases
from ropecheck.calling import CallError, TargetHung

PROFILES = {
    # derandomized, bounded: the same verdict on every run
    "ci": {"max_examples": 20, "derandomize": True},
    "dev": {"max_examples": 40},
    "thorough": {"max_examples": 300},
}
DEFAULT_PROFILE = "dev"


# Seconds a property may spend shrinking a counterexample once it has one: bounds the time
# of a failing verdict for a slow target.
SHRINK_BUDGET = 15.0


class _ShrinkBudgetSpent(BaseException):
    """Ends hypothesis' shrinking (a BaseException: hypothesis does not catch it)."""


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
        return {**asdict(self), "max_error": json_number(self.max_error)}


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
        elif case.positions_array().max() > ctx.max_position:
            case = case.with_positions(np.minimum(case.positions_array(), ctx.max_position))
        out.append((case, prop.example_extras(ctx, case)))
    return out


def _first_failure(exc: BaseException) -> BaseException:
    """Hypothesis reports several distinct failures as an ExceptionGroup: take the first."""
    while getattr(exc, "exceptions", None):  # (Base)ExceptionGroup, or its backport
        exc = exc.exceptions[0]
    return exc


def _reproduce_line(exc: BaseException, command: str) -> str:
    """Our command line, and hypothesis' @reproduce_failure blob when it printed one."""
    for note in getattr(exc, "__notes__", []):
        if "@reproduce_failure" in note:
            blob = note[note.index("@reproduce_failure"):].split(" as a decorator")[0]
            return f"{command}  (in Python: {blob})"
    return command


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
    seen = {"failing": None, "error": None, "since": None, "max": 0.0, "count": 0}

    @st.composite
    def inputs(draw):
        case = draw(prop.case_strategy(ctx))
        return case, draw(prop.extras(ctx, case))

    def attempt(drawn):
        if seen["since"] is not None and time.perf_counter() - seen["since"] > SHRINK_BUDGET:
            raise _ShrinkBudgetSpent()
        case, extras = drawn
        seen["count"] += 1
        try:
            error = prop.check(ctx, case, **extras)
        except TargetHung as hung:
            hung.case = _describe(case, extras)
            raise
        except Exception as failure:
            # each failing example hypothesis tries is smaller than the last: the latest is
            # the smallest so far, and the minimal one is replayed last
            seen["failing"], seen["error"] = drawn, failure
            seen["since"] = seen["since"] or time.perf_counter()
            raise
        seen["max"] = max(seen["max"], float(error))

    test = options.settings()(given(inputs())(attempt))
    if options.seed is not None:
        test = hypothesis_seed(options.seed)(test)

    start = time.perf_counter()
    try:
        test()  # generated examples, shrunk to a minimal counterexample on failure
        for drawn in _examples(prop, ctx):  # then the fixed critical inputs
            attempt(drawn)
    except (Exception, _ShrinkBudgetSpent) as raised:
        budget_spent = isinstance(raised, _ShrinkBudgetSpent)
        exc = seen["error"] if budget_spent else _first_failure(raised)
        known = isinstance(exc, (CheckFailure, CallError))
        result.status = "failed" if known else "error"
        result.message = str(exc) if known else f"internal error {type(exc).__name__}: {exc}"
        result.max_error = getattr(exc, "error", None)
        if seen["failing"] is not None:
            result.counterexample = _describe(*seen["failing"]) + (
                f" (shrinking stopped after {SHRINK_BUDGET:g} s: the smallest found, "
                "perhaps not minimal)" if budget_spent else "")
        result.reproduce = _reproduce_line(raised, reproduce_hint)
    else:
        result.max_error = seen["max"]
    result.examples = seen["count"]
    if prop.name == "reference":
        result.accuracy = accuracy_sweep(ctx)
        worst = result.accuracy.get("max_error", 0.0)
        if result.status == "passed" and worst > 1.0:
            at = result.accuracy["positions"][int(np.argmax(result.accuracy["error"]))]
            result.status, result.max_error = "failed", worst
            result.message = (f"accuracy sweep: error {worst:.3g} x tolerance at position {at} "
                              f"(x of shape (1, {len(result.accuracy['positions'])}, "
                              f"4, {ctx.target.rotary_dim or FREE_HEAD_DIMS[0]}), one position per token)")
            result.reproduce = reproduce_hint
    result.seconds = time.perf_counter() - start
    return result


def _describe(case, extras) -> str:
    shown = {k: (v.describe() if hasattr(v, "describe") else
                 np.asarray(v).tolist() if isinstance(v, np.ndarray) else v)
             for k, v in extras.items()}
    return case.describe() + (f"; {shown}" if shown else "")


def selected_properties(names=None) -> list[Property]:
    if not names:
        return list(PROPERTIES.values())
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ValueError(f"unknown properties {unknown}; known: {', '.join(PROPERTIES)}")
    return [PROPERTIES[n] for n in names]
