"""A check session: build the target from a spec and flags, make sure it can be called,
and run the selected properties over the selected dtypes. Shared by the CLI and the
pytest plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from properties.checks import Property
from properties.runner import Result, RunOptions, run_property
from ropecheck import known_failures
from ropecheck.builtins import BUILTINS, DEFAULT_TARGET
from ropecheck.calling import Caller, CallError, TargetHung
from ropecheck.dtypes import canonical, torch_dtype
from ropecheck.loading import TargetLoadError, load
from reference.scaling import Scaling
from reference.scaling import parse as parse_scaling
from ropecheck.target import Convention, Target


class UnusableTarget(Exception):
    """The target cannot be loaded or called at all (exit status 2)."""


@dataclass
class TargetSpec:
    spec: Optional[str] = None
    layout: Optional[str] = None
    base: Optional[float] = None
    rotary_dim: Optional[int] = None
    backward: bool = True
    inplace: bool = False
    scaling: Optional[str] = None  # a --scaling value (reference.scaling.parse)

    @property
    def name(self) -> str:
        return self.spec or DEFAULT_TARGET

    def build(self) -> Target:
        """Load the target and attach the declared convention and capabilities."""
        try:
            scaling = None if self.scaling is None else parse_scaling(self.scaling)
            options = {k: v for k, v in (("base", self.base), ("rotary_dim", self.rotary_dim),
                                         ("layout", self.layout), ("scaling", scaling))
                       if v is not None}
            target = load(self.name, **(options if self.name in BUILTINS else {}))
            convention = target.convention
            if self.layout is not None:
                convention = Convention(self.layout, self.base or 10000.0, self.rotary_dim,
                                        scaling or Scaling())
            elif convention is not None and self.name not in BUILTINS:
                # a declared Target (adapter, file): flags override its declaration
                convention = Convention(convention.layout, self.base or convention.base,
                                        self.rotary_dim or convention.rotary_dim,
                                        scaling or convention.scaling)
            elif scaling is not None and convention is None:
                raise ValueError("--scaling needs a declared convention: give --layout too")
        except (TargetLoadError, ValueError, OSError) as exc:
            raise UnusableTarget(str(exc)) from None
        rotary_dim = self.rotary_dim or target.rotary_dim
        return target.with_(convention=convention, rotary_dim=rotary_dim,
                            backward=self.backward and target.backward,
                            inplace=self.inplace or target.inplace)


SMOKE_SHAPES = ((1, 4, 2), (2, 3, 3), (1, 1, 1))  # (batch, seq, heads)
SMOKE_HEAD_DIMS = (8, 64, 128)


def smoke_call(target: Target, dtype: str, timeout: Optional[float]) -> Optional[str]:
    """Call the target on a few small ordinary inputs. Returns None as soon as one call
    returns a tensor (right or wrong: the checks judge that), else why none could.
    A call that hangs raises TargetHung, with the input it hung on in its message."""
    problems = []
    head_dims = (target.rotary_dim,) if target.rotary_dim else SMOKE_HEAD_DIMS
    for head_dim in head_dims:
        for batch, seq, heads in SMOKE_SHAPES:
            x = torch.randn(batch, seq, heads, head_dim,
                            generator=torch.Generator().manual_seed(0)).to(torch_dtype(dtype))
            positions = torch.arange(seq, dtype=torch.int64).repeat(batch, 1)
            try:
                Caller(target, timeout)(x, positions)
                return None
            except CallError as exc:
                if exc.kind != "raised":
                    return None
                problems.append(f"on x {tuple(x.shape)} {dtype}: {exc}")
            except TargetHung as exc:
                raise TargetHung(exc.seconds, f"on x {tuple(x.shape)} {dtype}: {exc}") from None
    return problems[0] + (f" (and on {len(problems) - 1} other small inputs)" if len(problems) > 1 else "")


WARM_UP_ORDER = ("bfloat16", "float16", "float64", "float32")


def warm_up(target: Target, requested=(), timeout: Optional[float] = None) -> dict:
    """Smoke-call the target in every dtype it declares, lowest precision first, then in
    the ``requested`` dtypes, before any check: a target that keeps state from its first
    call (a cos/sin cache built in that call's dtype, say) is then checked in the state a
    real multi-dtype process sees. Returns {dtype: why it cannot be called, or None}.
    A hang costs a whole time limit, so after one the other unrequested dtypes are not
    tried, and after a hang in a requested dtype nothing more is."""
    others = [d for d in WARM_UP_ORDER if d in target.dtypes and d not in requested]
    problems: dict = {}
    for group in (others, [d for d in WARM_UP_ORDER if d in requested]):
        for position, dtype in enumerate(group):
            try:
                problems[dtype] = smoke_call(target, dtype, timeout)
            except TargetHung as hung:
                for rest in group[position:]:
                    problems[rest] = str(hung)
                break
    return problems


def callable_in(target: Target, problems: dict) -> Target:
    """The target restricted to the dtypes it could be called in (the distractor calls of
    the statelessness check draw from these)."""
    return target.with_(dtypes=tuple(d for d in target.dtypes if problems.get(d) is None))


@dataclass
class Session:
    target: Target
    dtypes: list[str]
    properties: list[Property]
    options: RunOptions = field(default_factory=RunOptions)
    reproduce: str = ""
    known: list = field(default_factory=list)  # ropecheck.known_failures records
    results: list[Result] = field(default_factory=list)
    stopped: Optional[str] = None  # why the run stopped early

    def run(self, on_result: Callable[[Result], None] = lambda r: None) -> list[Result]:
        for dtype in self.dtypes:
            for prop in self.properties:
                try:
                    result = run_property(prop, self.target, dtype, self.options,
                                          reproduce_hint=f"{self.reproduce} --property {prop.name}")
                except TargetHung as exc:
                    result = Result(prop.name, dtype, "failed", prop.formula,
                                    message=f"{exc}; the run was stopped here",
                                    counterexample=getattr(exc, "case", ""))
                    self.stopped = f"the target hung in {prop.name} ({dtype})"
                result = known_failures.apply(self.target.name, [result], self.known)[0]
                self.results.append(result)
                on_result(result)
                if self.stopped:
                    return self.results
        return self.results

    @property
    def verdict(self) -> str:
        statuses = {r.status for r in self.results}
        if "error" in statuses:
            return "error"
        return "failed" if "failed" in statuses else "passed"


def resolve_dtypes(requested, target: Target) -> tuple[list[str], bool]:
    """Requested dtypes (comma-separated or repeated), or the target's; and whether explicit."""
    names = [n for item in requested or () for n in str(item).split(",") if n.strip()]
    if names:
        return list(dict.fromkeys(canonical(n.strip()) for n in names)), True
    return list(target.dtypes), False


def default_seed() -> int:
    return int(np.random.default_rng().integers(0, 2**31))
