"""A check session: build the target from a spec and flags, make sure it can be called,
and run the selected properties over the selected dtypes. Shared by the CLI, the pytest
plugin and the report, for every family: a 1-D target comes from a ``TargetSpec``, the
others from a ``ropecheck.families.FamilySpec``, and both give the session a target and
its family's properties."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch
from rich.markup import escape

from ropecheck.properties import position_range
from ropecheck.properties.checks import ONE_D
from ropecheck.properties.property import Property, smoke_call as family_smoke_call
from ropecheck.properties.runner import (PROFILES, Result, RunOptions, run_property, selected_properties,
                                         wants_range_probe)
from ropecheck.properties.strategies import FREE_HEAD_DIMS, MAX_POSITION
from ropecheck import devices, known_failures, modes
from ropecheck.builtins import BUILTINS, DEFAULT_TARGET
from ropecheck.calling import Caller, CallError, TargetHung
from ropecheck.dtypes import canonical, torch_dtype
from ropecheck.families import ND_ADAPTERS, FamilySpec
from ropecheck.loading import TargetLoadError, is_named, load, load_isolated, target_name
from ropecheck.output import column_label
from ropecheck.reference.scaling import Scaling
from ropecheck.reference.scaling import parse as parse_scaling
from ropecheck.target import Convention, Target


class UnusableTarget(Exception):
    """The target cannot be loaded or called at all (exit status 2)."""


@dataclass
class TargetSpec:
    spec: object = None  # a spec string (file.py:func, module:attr, a name), or the Python object
    layout: Optional[str] = None
    base: Optional[float] = None
    rotary_dim: Optional[int] = None
    backward: bool = True
    inplace: bool = False
    scaling: Optional[str] = None  # a --scaling value (reference.scaling.parse)
    max_position: Optional[int] = None  # the declared position range [0, N] (--max-position)
    in_process: bool = False  # call the target in this process, not in a worker
    call: Optional[str] = None  # the call form (--call); None: what the target declares
    device: Optional[str] = None  # where inputs are made (--device); None: cpu, or the target's own

    @property
    def name(self) -> str:
        return target_name(self.spec) or DEFAULT_TARGET

    family_record = ONE_D

    @staticmethod
    def properties(names=()) -> list[Property]:
        return selected_properties(names)

    @staticmethod
    def range_probe(names=()) -> bool:
        """Whether the run starts with the position-range probe (a 1-D RoPE session)."""
        return wants_range_probe(names)

    @staticmethod
    def header(target: Target) -> str:
        if target.convention is None:
            return ("[yellow]No --layout given: running spec-free checks only "
                    "(no comparison with the float64 reference).[/]")
        return f"Convention: {target.convention.flags()}"

    def flags(self) -> list[str]:
        """The command-line flags that declare this spec (a reproduce line's)."""
        words = ["--call", self.call] if self.call else []
        for flag, value in (("--layout", self.layout), ("--base", self.base), ("--rotary-dim", self.rotary_dim),
                            ("--scaling", self.scaling), ("--max-position", self.max_position),
                            ("--device", self.device)):
            if value:
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        return words + [flag for flag, on in (("--no-backward", not self.backward), ("--inplace", self.inplace),
                                              ("--in-process", self.in_process)) if on]

    def build(self) -> Target:
        """Load the target and attach the declared convention and capabilities."""
        try:
            devices.require(self.device)
            scaling = None if self.scaling is None else parse_scaling(self.scaling)
            options = {k: v for k, v in (("base", self.base), ("rotary_dim", self.rotary_dim),
                                         ("layout", self.layout), ("scaling", scaling))
                       if v is not None}
            loader = load if self.in_process else load_isolated
            target = loader(self.spec or DEFAULT_TARGET, self.call,
                            **(options if self.name in BUILTINS else {}))
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
        declared = [n for n in (target.max_position, self.max_position) if n is not None]
        try:
            device = devices.choose(self.device, target.devices)
            devices.require(device)
        except ValueError as exc:
            target.executor_close()
            raise UnusableTarget(str(exc)) from None
        return target.with_(convention=convention, rotary_dim=rotary_dim, device=device,
                            backward=self.backward and target.backward,
                            inplace=self.inplace or target.inplace,
                            max_position=min(declared) if declared else None)


def spec_for(target=None, family: Optional[str] = None, *, layout=None, base=None, nd_base=None,
             rotary_dim=None, scaling=None, axes=None, sections=None, split=None, mrope_interleaved=False,
             scale_base=None, gamma=None, max_position=None, backward=True, inplace=False,
             in_process=False, call=None, device=None):
    """The spec ``ropecheck check``'s flags (or ``ropecheck.check``'s keywords) describe: a
    FamilySpec with a family (or for an N-D adapter), else a TargetSpec. Per-axis values
    (``nd_base`` or a list ``base``, ``sections``, ``split``) may be lists or comma-separated
    text. Raises FamilyError for bad family flags."""
    if family or (is_named(target) and target in ND_ADAPTERS):
        bases = nd_base or _listed(base, lambda b: f"{float(b):g}")
        return FamilySpec(target or "", family or ND_ADAPTERS[target]["family"], axes, _listed(sections),
                          _listed(split), layout, bases, scale_base, gamma,
                          interleaved=mrope_interleaved or None, max_position=max_position,
                          in_process=in_process, backward=backward, call=call, device=device)
    return TargetSpec(target, layout, None if base is None else float(base), rotary_dim, backward=backward,
                      inplace=inplace, scaling=scaling, max_position=max_position, in_process=in_process,
                      call=call, device=device)


def _listed(values, shown: Callable = str) -> Optional[str]:
    """A per-axis flag's text: as given, or a value or a list of them joined with commas."""
    if values is None or isinstance(values, str):
        return values
    return ",".join(shown(v) for v in (values if isinstance(values, (list, tuple)) else [values]))


def smoke_call(target: Target, dtype: str, timeout: Optional[float], family=ONE_D) -> Optional[str]:
    """The family's smoke call (``properties.property.smoke_call``; 1-D RoPE's by default)."""
    return family_smoke_call(family, target, dtype, timeout)


WARM_UP_ORDER = ("bfloat16", "float16", "float64", "float32")


def warm_up(target, requested=(), timeout: Optional[float] = None,
            crashes: Optional[dict] = None, family=ONE_D) -> dict:
    """Smoke-call the target in every dtype it declares, lowest precision first, then in
    the ``requested`` dtypes, before any check: a target that keeps state from its first
    call (a cos/sin cache built in that call's dtype, say) is then checked in the state a
    real multi-dtype process sees. Returns {dtype: why it cannot be called, or None}.
    A dtype whose smallest call crashes the process (or exits) is callable, and a failure:
    its message goes into ``crashes`` (dtype -> message).
    A hang costs a whole time limit, so after one the other unrequested dtypes are not
    tried, and after a hang in a requested dtype nothing more is. A target that takes no
    tensors (a position builder, dtype "-") has nothing to warm up."""
    others = [d for d in WARM_UP_ORDER if d in target.dtypes and d not in requested]
    problems: dict = {}
    for group in (others, [d for d in WARM_UP_ORDER if d in requested]):
        for position, dtype in enumerate(group):
            try:
                problems[dtype] = smoke_call(target, dtype, timeout, family)
            except CallError as crash:
                problems[dtype] = None
                if crashes is not None:
                    crashes[dtype] = str(crash)
            except TargetHung as hung:
                for rest in group[position:]:
                    problems[rest] = str(hung)
                break
    return problems


class Prepared(NamedTuple):
    """A target built and warmed up: what a Session needs besides its properties."""

    target: object  # restricted to the dtypes it can be called in (callable_in)
    dtypes: list  # the dtypes to check
    unsupported: dict  # dtype -> why the target cannot be called in it (not requested by name)
    crashes: dict  # dtype -> the crash of its smallest call
    modes: list  # how the target is run (--mode, parsed)


def prepare(spec, dtypes=(), timeout: Optional[float] = None, notify: Callable[[str], None] = lambda line: None,
            run_modes=("eager",)) -> Prepared:
    """Build ``spec``'s target (a TargetSpec or a FamilySpec) and warm it up in the requested
    dtypes (default: the target's). ``notify`` gets the header line and each dtype skipped.
    Raises ValueError for a bad dtype or mode name (before anything loads), UnusableTarget
    (exit 2) when the target cannot be loaded, cannot be run in a mode asked for (on its
    device), cannot be called in a dtype asked for by name, or in any dtype; the target's
    worker is closed then."""
    if dtypes:
        resolve_dtypes(dtypes, None)
    run_modes = modes.parse(run_modes)
    try:
        built = spec.build()
    except UnusableTarget as exc:
        raise UnusableTarget(f"cannot load target {spec.name!r}: {exc}") from None
    except ValueError as exc:  # a FamilyError: bad family flags or an unloadable target
        raise UnusableTarget(str(exc)) from None
    try:
        if run_modes != ["eager"] and not hasattr(built, "mode"):
            raise UnusableTarget(f"--mode {' '.join(run_modes)}: {spec.name!r} takes no tensors to run in a mode")
        try:
            modes.require(run_modes, getattr(built, "device", "cpu"))
        except ValueError as exc:
            raise UnusableTarget(str(exc)) from None
        dtype_list, explicit = resolve_dtypes(dtypes, built)
        notify(spec.header(built))
        crashes: dict = {}
        problems = warm_up(built, dtype_list, timeout, crashes, spec.family_record)
        usable, unsupported = [], {}
        for dtype in dtype_list:
            problem = problems.get(dtype)
            if problem is None:
                usable.append(dtype)
            elif explicit:
                raise UnusableTarget(f"target {spec.name!r} cannot be called: {problem}")
            else:
                unsupported[dtype] = problem
                notify(f"[yellow]skipping {dtype}: {escape(problem)}[/]")
        if not usable:
            raise UnusableTarget(f"target {spec.name!r} cannot be called in any dtype"
                                 + (f": {next(iter(unsupported.values()))}" if unsupported else ""))
    except BaseException:
        close(built)
        raise
    return Prepared(callable_in(built, problems), usable, unsupported, crashes, run_modes)


def close(target) -> None:
    """Stop the worker process ``target`` runs in, if any."""
    executor = getattr(target, "executor", None)
    if executor is not None:
        executor.close()


def callable_in(target, problems: dict):
    """The target restricted to the dtypes it could be called in (the distractor calls of
    the statelessness check draw from these)."""
    return replace(target, dtypes=tuple(d for d in target.dtypes if problems.get(d) is None))


def probe_position_range(target: Target, dtype: str, options: RunOptions, reproduce: str) -> tuple[Result, Target]:
    """The position-range finding for one dtype, and the target restricted to the
    positions it accepts (so the properties judge its values, not its range)."""
    result = Result("position-range", dtype, "passed", position_range.FORMULA)
    head_dim = target.rotary_dim or FREE_HEAD_DIMS[0]
    x = torch.randn(1, 1, 1, head_dim, generator=torch.Generator().manual_seed(0)).to(torch_dtype(dtype))
    caller = Caller(target, options.timeout)
    limit = min(MAX_POSITION, target.max_position or MAX_POSITION)
    found = position_range.find_limit(
        lambda m: caller(x, torch.tensor([[m]], dtype=torch.int64)), limit)
    if found is None:
        return result, target
    at, why = found
    result.status, result.message = "failed", position_range.finding(at, why)
    result.counterexample = f"x: shape {tuple(x.shape)} {dtype}, contiguous; positions [{at}]"
    result.reproduce = reproduce
    result.signature = "position-range"
    return result, target.with_(max_position=at - 1)


@dataclass
class Session:
    target: Target
    dtypes: list[str]
    properties: list[Property]
    options: RunOptions = field(default_factory=RunOptions)
    # the command that reruns this session (``--property NAME`` is added per check), or a
    # function giving the rerun of one check by its name (the Python API's)
    reproduce: object = ""
    known: list = field(default_factory=list)  # ropecheck.known_failures records
    results: list[Result] = field(default_factory=list)
    stopped: Optional[str] = None  # why the run stopped early
    crashes: dict = field(default_factory=dict)  # dtype -> the crash of its smallest call
    unsupported: dict = field(default_factory=dict)  # dtype -> why it cannot be called
    causes: list = field(default_factory=list)  # root causes shared by several failures
    range_probe: bool = True  # probe the accepted position range first
    modes: list = field(default_factory=lambda: ["eager"])  # how the target is run (--mode)

    @property
    def rows(self) -> list[str]:
        """The table's rows: the position-range probe, then the properties."""
        return (["position-range"] if self.range_probe else []) + [p.name for p in self.properties]

    @property
    def columns(self) -> list[tuple[str, str]]:
        """The table's columns: (dtype, mode), each dtype's modes side by side."""
        return [(dtype, mode) for dtype in self.dtypes for mode in self.modes]

    def reproduce_check(self, name: str, mode: str = "eager") -> str:
        """How to rerun the check ``name`` alone (in ``mode``)."""
        if callable(self.reproduce):
            return self.reproduce(name, mode)
        return f"{self.reproduce} --property {name}" + ("" if mode == "eager" else f" --mode {mode}")

    def _record(self, result: Result, on_result) -> None:
        result = known_failures.apply(self.target.name, [result], self.known)[0]
        self.results.append(result)
        on_result(result)

    def _run_dtype(self, dtype: str, on_result) -> None:
        if dtype in self.crashes:  # its smallest call crashes: every property would
            for mode in self.modes:
                for prop in self.properties:
                    crashed = Result(prop.name, dtype, "failed", prop.formula,
                                     message=self.crashes[dtype].split("\n")[0],
                                     counterexample=self.crashes[dtype].split("on the first, smallest input: ")[-1])
                    crashed.signature, crashed.mode = f"crashed: {crashed.message}", mode
                    self._record(crashed, on_result)
            return
        target = self.target
        if self.range_probe:
            self._running = ("position-range", position_range.FORMULA, "eager")
            found, target = probe_position_range(target, dtype, self.options,
                                                 self.reproduce_check("position-range"))
            self._record(found, on_result)
        for mode in self.modes:
            run_in = target if mode == "eager" else replace(target, mode=mode)
            for prop in self.properties:
                self._running = (prop.name, prop.formula, mode)
                result = run_property(prop, run_in, dtype, self.options,
                                      reproduce_hint=self.reproduce_check(prop.name, mode))
                result.mode = mode
                self._record(result, on_result)

    def run(self, on_result: Callable[[Result], None] = lambda r: None) -> list[Result]:
        for dtype in self.dtypes:
            self._running = (self.rows[0], position_range.FORMULA, "eager")
            try:
                self._run_dtype(dtype, on_result)
            except TargetHung as exc:
                name, formula, mode = self._running
                hung = Result(name, dtype, "failed", formula, message=f"{exc}; the run was stopped here",
                              counterexample=getattr(exc, "case", ""), mode=mode)
                self.stopped = f"the target hung in {name} ({dtype}{'' if mode == 'eager' else ', ' + mode})"
                self._record(hung, on_result)
                break
        self.causes = group_causes(self.results)
        return self.results

    @property
    def verdict(self) -> str:
        statuses = {r.status for r in self.results}
        if "error" in statuses:
            return "error"
        return "failed" if "failed" in statuses else "passed"


def group_causes(results: list[Result]) -> list[dict]:
    """Failures that share a signature (the same exception at the same place, the same
    crash, the same contract breach, the same minimal input) are one root cause: each gets
    the cause's id; returns the causes, each with the properties it took down."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.status == "failed" and r.signature:
            groups.setdefault(r.signature, []).append(r)
    causes = []
    for members in groups.values():
        if len(members) < 2:
            continue
        cause = f"C{len(causes) + 1}"
        for r in members:
            r.cause = cause
        first = members[0]
        same_input = first.signature.startswith("input: ")
        causes.append({"id": cause, "message": first.message, "diagnosis": first.diagnosis,
                       "counterexample": first.counterexample, "reproduce": first.reproduce,
                       "properties": list(dict.fromkeys(r.property for r in members)),
                       "dtypes": list(dict.fromkeys(column_label(r.dtype, r.mode) for r in members)),
                       # one input failing several checks: what each of them saw
                       "also": [{"property": r.property, "dtype": column_label(r.dtype, r.mode),
                                 "message": r.message}
                                for r in members[1:] if same_input and r.message != first.message]})
    return causes


def resolve_dtypes(requested, target) -> tuple[list[str], bool]:
    """Requested dtypes (comma-separated or repeated), or the target's; and whether explicit.
    A target taking no tensors (a position builder, dtypes ("-",)) runs once, as "-"."""
    if tuple(getattr(target, "dtypes", ())) == ("-",):
        return ["-"], False
    names = [n for item in requested or () for n in str(item).split(",") if n.strip()]
    if names:
        return list(dict.fromkeys(canonical(n.strip()) for n in names)), True
    return list(target.dtypes), False


def default_seed() -> int:
    return int(np.random.default_rng().integers(0, 2**31))


def run_seed(seed: Optional[int], profile: str) -> Optional[int]:
    """The hypothesis seed a run uses: the one given; none for a derandomized profile (ci,
    production); else a random one, printed so that the run can be replayed."""
    return seed if seed is not None or PROFILES[profile].get("derandomize") else default_seed()
