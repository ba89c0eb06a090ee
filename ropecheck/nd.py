"""N-D, multimodal and builder targets: ``ropecheck check TARGET --family F``.

Families and what TARGET must be:
- ``axial`` (``--axes N``, ``--layout``, ``--base``, ``--split``): ``rope(x, positions)``,
  positions int64 (batch, seq, N); features split into N consecutive blocks (``--split``:
  features per block; default equal), a 1-D RoPE of its own width in each block.
- ``mrope`` (``--sections 16,24,24``, ``--layout``, ``--base``, ``--mrope-interleaved``):
  ``rope(x, positions)``, positions int64 (batch, seq, len(sections)); one 1-D RoPE over
  head_dim = 2 * sum(sections), pair i driven by the axis its section assigns, sections in
  chunks (HF Qwen2-VL: half layout) or interleaved (Qwen3-VL).
- ``nd`` (``--axes N``): spec-free N-D checks only (no reference).
- ``rope-tie-builder``, ``rope-tv-builder`` (``--axes 2`` or ``3``), ``mrope-builder``:
  ``build_positions(segments) -> array (tokens, n_axes)`` (``reference.multimodal``).
- ``xpos`` (``--layout``, ``--base``, ``--scale-base``, ``--gamma``; defaults interleaved,
  10000, 512, 0.4): ``xpos(q, k, positions) -> (q_out, k_out)``, positions int64 (batch, seq)
  (``properties.xpos_checks``).
Rotation and xPos targets are checked backward too (their VJP through autograd) unless
they declare no backward (an adapter's ``backward=False``, a Target's) or ``--no-backward``
is given.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, NamedTuple, Optional

from properties import builder_checks
from properties.nd_checks import ND_PROPERTIES, NDTarget
from properties.runner import Result, RunOptions, run_property
from properties.property import smoke_call
from properties.xpos_checks import XPOS, XPOS_MAX_POSITION, XPOS_PROPERTIES, XposConvention, XposTarget
from reference import nd as ndref
from ropecheck import known_failures
from ropecheck.adapters.nd_registry import ND_ADAPTERS
from ropecheck.calling import CallError, InProcess, PlainCaller, TargetHung
from ropecheck.loading import TargetLoadError, load_callable, load_callable_isolated

ROTATION_FAMILIES = ("axial", "mrope", "nd")
BUILDER_FAMILIES = {"rope-tie-builder": "rope-tie", "rope-tv-builder": "rope-tv", "mrope-builder": "mrope"}
FAMILIES = ROTATION_FAMILIES + tuple(BUILDER_FAMILIES) + ("xpos",)
ND_DEFAULT_DTYPES = ("float32", "bfloat16")


class FamilyError(ValueError):
    """Bad family flags or an unloadable target (exit 2)."""


class Loaded(NamedTuple):
    """A family target as loaded: ``FamilySpec.load``."""

    fn: Callable
    max_position: Optional[int]
    executor: object  # its worker, or None (in this process)
    backward: bool
    call: str = "x"  # its call form


def parse_ints(text: Optional[str], what: str) -> Optional[list]:
    if text is None:
        return None
    try:
        values = [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise FamilyError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise FamilyError(f"{what} is empty")
    return values


def parse_bases(text) -> object:
    if text is None:
        return 10000.0
    try:
        values = [float(v) for v in str(text).split(",") if v]
    except ValueError:
        raise FamilyError(f"--base must be a number or one per axis, got {text!r}") from None
    if any(not v > 1 for v in values):
        raise FamilyError(f"--base must be > 1, got {text!r}")
    return values[0] if len(values) == 1 else values


@dataclass
class FamilySpec:
    target: str
    family: str
    axes: Optional[int] = None
    sections: Optional[str] = None
    split: Optional[str] = None
    layout: Optional[str] = None
    base: Optional[str] = None
    scale_base: Optional[float] = None
    gamma: Optional[float] = None
    interleaved: Optional[bool] = None  # mrope sections interleaved over the pairs (Qwen3-VL)
    extra: dict = field(default_factory=dict)
    max_position: Optional[int] = None  # the declared position range (--max-position)
    in_process: bool = False  # call the target here, not in a worker process
    backward: bool = True  # False: --no-backward (the target has no autograd)
    call: Optional[str] = None  # --call: x or qk for the rotation families

    def load(self, rope_signature: bool) -> "Loaded":
        """The callable, the largest position it accepts or None, its executor, and whether
        it has a backward (the target's declaration and --no-backward)."""
        try:
            if self.in_process:
                fn, declared = load_callable(self.target, rope_signature, self.call)
                executor = None
            else:
                fn, declared, executor = load_callable_isolated(self.target, rope_signature, self.call)
        except TargetLoadError as exc:
            raise FamilyError(str(exc)) from None
        limits = [n for n in (declared.max_position, self.max_position) if n is not None]
        return Loaded(fn, min(limits) if limits else None, executor, self.backward and declared.backward,
                      declared.call)

    def flags(self) -> list:
        words = ["--family", self.family] + (["--call", self.call] if self.call else [])
        for flag, value in (("--axes", self.axes), ("--sections", self.sections), ("--split", self.split),
                            ("--layout", self.layout), ("--base", self.base),
                            ("--scale-base", self.scale_base), ("--gamma", self.gamma),
                            ("--max-position", self.max_position)):
            if value is not None:
                words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        if self.interleaved:
            words.append("--mrope-interleaved")
        if not self.backward:
            words.append("--no-backward")
        if self.in_process:
            words.append("--in-process")
        return words

    def xpos_target(self) -> XposTarget:
        """The xPos convention (defaults: the paper's, interleaved as its code) and the
        largest position the target's adapter declares (default XPOS_MAX_POSITION)."""
        base = parse_bases(self.base)
        if isinstance(base, list):
            raise FamilyError("--family xpos takes one --base")
        try:
            given = {"gamma": self.gamma, "scale_base": self.scale_base}
            conv = XposConvention(self.layout or "interleaved", base,
                                  **{k: float(v) for k, v in given.items() if v is not None})
        except ValueError as exc:
            raise FamilyError(str(exc)) from None
        loaded = self.load(rope_signature=False)
        return XposTarget(self.target, loaded.fn, conv,
                          max_position=min(loaded.max_position or XPOS_MAX_POSITION, XPOS_MAX_POSITION),
                          executor=loaded.executor, backward=loaded.backward)

    def convention(self) -> tuple[int, Optional[ndref.PairRotation], tuple]:
        """(n_axes, reference convention or None, head sizes to draw)."""
        try:
            if self.family == "mrope":
                sections = parse_ints(self.sections, "--sections")
                if sections is None:
                    raise FamilyError("--family mrope needs --sections (pairs per axis, e.g. 16,24,24)")
                conv = ndref.mrope(sections, layout=self.layout or "half", base=float(parse_bases(self.base)),
                                   interleaved=bool(self.interleaved))
                return len(sections), conv, (conv.head_dim,)
            n_axes = self.axes or 2
            if n_axes < 1 or n_axes > 8:
                raise FamilyError(f"--axes must be 1 .. 8, got {n_axes}")
            split = parse_ints(self.split, "--split")
            head_dims = (sum(split),) if split else (4 * n_axes, 32 * n_axes)
            if self.family == "nd":
                return n_axes, None, head_dims
            if self.layout is None:
                raise FamilyError("--family axial needs --layout (half or interleaved); --family nd runs "
                                  "the spec-free checks only")
            base = parse_bases(self.base)
            convs = [ndref.axial(d, n_axes, layout=self.layout, base=base, split=split) for d in head_dims]
            return n_axes, convs, head_dims
        except (ValueError, TypeError) as exc:
            raise FamilyError(str(exc)) from None


def build_session(spec: FamilySpec, dtypes, property_names, options: RunOptions, reproduce: str):
    """Everything needed to run: a list of (property name, dtype, formula, runner) and a
    session shell that ropecheck.output can print and save."""
    preset = ND_ADAPTERS.get(spec.target, {})
    for key, value in preset.items():
        if getattr(spec, key) is None:
            setattr(spec, key, value)
    if spec.family not in FAMILIES:
        raise FamilyError(f"unknown --family {spec.family!r}; known: {', '.join(FAMILIES)}")
    runs = []
    backward = False  # what the session reports: the rotation and xPos targets' declaration
    if spec.family in BUILDER_FAMILIES:
        fam = builder_checks.family(BUILDER_FAMILIES[spec.family], spec.axes) if spec.axes else \
            builder_checks.family(BUILDER_FAMILIES[spec.family])
        loaded = spec.load(rope_signature=False)
        fn = PlainCaller(loaded.executor or InProcess(loaded.fn), options.timeout)
        names = _select(property_names, builder_checks.BUILDER_CHECKS)
        for name in names:
            formula = builder_checks.BUILDER_CHECKS[name][0]
            runs.append((name, "-", formula, lambda name=name: builder_checks.run_builder_property(
                name, fn, fam, options, f"{reproduce} --property {name}")))
        dtypes = ["-"]
    else:
        if spec.family == "xpos":
            target = spec.xpos_target()
            backward = target.backward
            names = _select(property_names, XPOS_PROPERTIES)
            registry = XPOS_PROPERTIES
            for dtype in dtypes:
                try:
                    problem = smoke_call(XPOS, target, dtype, options.timeout)
                except TargetHung as hung:
                    problem = str(hung)
                except CallError:  # a crash on the smallest input: the checks report it
                    problem = None
                if problem:
                    raise FamilyError(f"target {spec.target!r} does not follow xpos(q, k, positions) -> "
                                      f"(q_out, k_out): {problem}")

            def run_one(name, dtype, command):
                return run_property(XPOS_PROPERTIES[name], target, dtype, options, command)
        else:
            n_axes, conv, head_dims = spec.convention()
            loaded = spec.load(rope_signature=True)
            convs = conv if isinstance(conv, list) else [conv] * len(head_dims)
            try:
                targets = [NDTarget(spec.target, loaded.fn, n_axes, c, (d,), max_position=loaded.max_position,
                                    executor=loaded.executor, backward=loaded.backward, call=loaded.call)
                           for d, c in zip(head_dims, convs)]
            except ValueError as exc:
                raise FamilyError(str(exc)) from None
            backward = loaded.backward
            names = _select(property_names, ND_PROPERTIES)
            registry = ND_PROPERTIES

            def run_one(name, dtype, command):
                results = [run_property(ND_PROPERTIES[name], t, dtype, options, command) for t in targets]
                bad = [r for r in results if r.status in ("failed", "error")]
                return bad[0] if bad else max(results, key=lambda r: r.max_error or 0.0)
        for dtype in dtypes:
            for name in names:
                runs.append((name, dtype, registry[name].formula, lambda name=name, dtype=dtype: run_one(
                    name, dtype, f"{reproduce} --dtype {dtype} --property {name}")))
    shell = SimpleNamespace(
        target=SimpleNamespace(name=spec.target, convention=None, backward=backward, inplace=False,
                               max_position=spec.max_position),
        dtypes=list(dtypes), properties=[SimpleNamespace(name=n) for n in names], options=options,
        results=[], stopped=None, causes=[])
    shell.verdict = None
    return runs, shell


def _select(names, registry) -> list:
    if not names:
        return list(registry)
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise FamilyError(f"unknown properties {unknown}; known here: {', '.join(registry)}")
    return list(names)


def verdict(results) -> str:
    statuses = {r.status for r in results}
    return "error" if "error" in statuses else "failed" if "failed" in statuses else "passed"


def reproduce_command(spec: FamilySpec, profile, seed) -> str:
    """The command line of this run, without dtypes (each run adds its own)."""
    words = ["ropecheck", "check", spec.target] + spec.flags()
    words += ["--profile", profile] + (["--seed", str(seed)] if seed is not None else [])
    return shlex.join(words)


def check_family(console, spec: FamilySpec, dtypes, property_names, options: RunOptions,
                 json_path=None, junit_path=None, debug=False,
                 known_paths=(known_failures.DEFAULT_FILE,)) -> int:
    """Run a --family check; returns the exit status (0 passed, 1 failed, 2 unusable/error).
    Failures that a record in ``known_paths`` excuses show as ``known``."""
    from ropecheck.output import (EXIT_STATUS, print_failures, print_notes, results_table, verdict_line,
                                  write_json, write_junit, write_unusable)
    from ropecheck.session import group_causes, resolve_dtypes

    try:
        names = [n for item in dtypes or () for n in str(item).split(",") if n.strip()]
        dtype_list = resolve_dtypes(names, SimpleNamespace(dtypes=ND_DEFAULT_DTYPES))[0]
        runs, shell = build_session(spec, dtype_list, property_names, options,
                                    reproduce_command(spec, options.profile, options.seed))
        known = known_failures.load(known_paths)
    except (FamilyError, KeyError, ValueError) as exc:
        console.print(f"[bold red]ropecheck:[/] {exc}", highlight=False, soft_wrap=True)
        write_unusable(json_path, junit_path, spec.target, str(exc))
        return 2
    console.print(f"Family {spec.family}: " + " ".join(spec.flags()[2:]) if len(spec.flags()) > 2
                  else f"Family {spec.family}")
    for name, dtype, formula, run in runs:
        try:
            result = run()
        except TargetHung as exc:  # as the 1-D session does: one finding, then stop
            result = Result(name, dtype, "failed", formula, message=f"{exc}; the run was stopped here")
            shell.stopped = f"the target hung in {name} ({dtype})"
        shell.results += known_failures.apply(spec.target, [result], known)
        if shell.stopped:
            break
    shell.causes = group_causes(shell.results)
    shell.verdict = verdict(shell.results)
    console.print(results_table(shell))
    print_failures(console, shell)
    print_notes(console, shell)
    if shell.stopped:
        console.print(f"[bold red]stopped early:[/] {shell.stopped}")
    if json_path:
        write_json(json_path, shell)
    if junit_path:
        write_junit(junit_path, shell)
    console.print(verdict_line(shell), soft_wrap=True)
    return EXIT_STATUS[shell.verdict]
