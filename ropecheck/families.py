"""The families beside 1-D RoPE, as ``ropecheck check TARGET --family F`` declares them: what
the flags say the target computes, made into a target and the family's properties, which the
one check session (``ropecheck.session``) runs as it runs 1-D RoPE.

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
  10000, 512, 0.4): ``xpos(q, k, positions) -> (q_out, k_out)``, the qk call form (k may have
  fewer heads than q), positions int64 (batch, seq) (``properties.xpos_checks``).
Rotation and xPos targets are checked backward too (their VJP through autograd) unless
they declare no backward (an adapter's ``backward=False``, a Target's) or ``--no-backward``
is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from ropecheck.properties import builder_checks
from ropecheck.properties.property import Family
from ropecheck.properties.nd_checks import ND_PROPERTIES, NDTarget
from ropecheck.properties.xpos_checks import XPOS_MAX_POSITION, XPOS_PROPERTIES, XposConvention, XposTarget
from ropecheck.reference import nd as ndref
from ropecheck.adapters.nd_registry import ND_ADAPTERS
from ropecheck import devices
from ropecheck.loading import TargetLoadError, is_named, load_callable, load_callable_isolated, target_name

ROTATION_FAMILIES = ("axial", "mrope", "nd")
BUILDER_FAMILIES = {"rope-tie-builder": "rope-tie", "rope-tv-builder": "rope-tv", "mrope-builder": "mrope"}
FAMILIES = ROTATION_FAMILIES + tuple(BUILDER_FAMILIES) + ("xpos",)
ND_DEFAULT_DTYPES = ("float32", "bfloat16")
# the call forms each family's targets may take (--call)
CALLS = {"xpos": ("qk",), **{f: ("x", "qk", "packed") for f in ROTATION_FAMILIES}}


class FamilyError(ValueError):
    """Bad family flags or an unloadable target (exit 2)."""


class Loaded(NamedTuple):
    """A family target as loaded: ``FamilySpec.load``."""

    fn: Callable
    max_position: Optional[int]
    executor: object  # its worker, or None (in this process)
    backward: bool
    call: str = "x"  # its call form
    device: str = "cpu"  # where its inputs are made


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
    target: object  # a spec string (file.py:func, module:attr, a name), or the Python object
    family: str
    axes: Optional[int] = None
    sections: Optional[str] = None
    split: Optional[str] = None
    layout: Optional[str] = None
    base: Optional[str] = None
    scale_base: Optional[float] = None
    gamma: Optional[float] = None
    interleaved: Optional[bool] = None  # mrope sections interleaved over the pairs (Qwen3-VL)
    max_position: Optional[int] = None  # the declared position range (--max-position)
    in_process: bool = False  # call the target here, not in a worker process
    backward: bool = True  # False: --no-backward (the target has no autograd)
    call: Optional[str] = None  # --call: x, qk or packed for the rotation families, qk for xPos
    device: Optional[str] = None  # --device: where inputs are made (None: cpu, or the target's own)

    def __post_init__(self):
        declared = ND_ADAPTERS.get(self.target, {}) if is_named(self.target) else {}
        for key, value in declared.items():  # an adapter's declaration
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.family not in FAMILIES:
            raise FamilyError(f"unknown --family {self.family!r}; known: {', '.join(FAMILIES)}")
        forms = CALLS.get(self.family, ())
        if self.call is not None and self.call not in forms:
            raise FamilyError(f"--call {self.call} is not available with --family {self.family} (it takes "
                              f"{', '.join('--call ' + f for f in forms) or 'no call form'})")

    @property
    def name(self) -> str:
        return target_name(self.target)

    @property
    def registry(self) -> dict:
        """The family's properties, by name."""
        if self.family in BUILDER_FAMILIES:
            return builder_checks.BUILDER_PROPERTIES
        return XPOS_PROPERTIES if self.family == "xpos" else ND_PROPERTIES

    @property
    def family_record(self) -> Family:
        """The Family its targets belong to (their smoke call and warm-up)."""
        return next(iter(self.registry.values())).family

    def properties(self, names=()) -> list:
        """The properties named (all of the family's without names)."""
        registry = self.registry
        unknown = [n for n in names or () if n not in registry]
        if unknown:
            raise FamilyError(f"unknown properties {unknown}; known here: {', '.join(registry)}")
        return [registry[n] for n in names] if names else list(registry.values())

    @staticmethod
    def range_probe(names=()) -> bool:
        return False  # the position-range probe is 1-D RoPE's

    def header(self, target) -> str:
        """The line a run starts with: the family and its flags."""
        flags = " ".join(self.flags()[2:])
        return f"Family {self.family}" + (f": {flags}" if flags else "")

    def build(self):
        """The target this spec describes: an NDTarget, an XposTarget or a BuilderTarget."""
        if self.family in BUILDER_FAMILIES:
            try:
                fam = builder_checks.family(BUILDER_FAMILIES[self.family], self.axes)
            except ValueError as exc:
                raise FamilyError(str(exc)) from None
            loaded = self.load(rope_signature=False)
            return builder_checks.BuilderTarget(self.name, loaded.fn, fam, executor=loaded.executor)
        if self.family == "xpos":
            return self.xpos_target()
        n_axes, conv, head_dims = self.convention()
        loaded = self.load(rope_signature=True)
        convs = dict(zip(head_dims, conv)) if isinstance(conv, list) else conv
        try:
            return NDTarget(self.name, loaded.fn, n_axes, convs, head_dims, ND_DEFAULT_DTYPES,
                            max_position=loaded.max_position, executor=loaded.executor, backward=loaded.backward,
                            call=loaded.call, device=loaded.device)
        except ValueError as exc:
            raise FamilyError(str(exc)) from None

    def load(self, rope_signature: bool) -> "Loaded":
        """The callable, the largest position it accepts or None, its executor, and whether
        it has a backward (the target's declaration and --no-backward)."""
        try:
            devices.require(self.device)
            if self.in_process:
                fn, declared = load_callable(self.target, rope_signature, self.call)
                executor = None
            else:
                fn, declared, executor = load_callable_isolated(self.target, rope_signature, self.call)
        except (TargetLoadError, ValueError) as exc:
            raise FamilyError(str(exc)) from None
        try:
            device = devices.choose(self.device, declared.devices)
        except ValueError as exc:
            if executor is not None:
                executor.close()
            raise FamilyError(str(exc)) from None
        limits = [n for n in (declared.max_position, self.max_position) if n is not None]
        return Loaded(fn, min(limits) if limits else None, executor, self.backward and declared.backward,
                      declared.call, device)

    def flags(self) -> list:
        words = ["--family", self.family] + (["--call", self.call] if self.call else [])
        for flag, value in (("--axes", self.axes), ("--sections", self.sections), ("--split", self.split),
                            ("--layout", self.layout), ("--base", self.base),
                            ("--scale-base", self.scale_base), ("--gamma", self.gamma),
                            ("--max-position", self.max_position), ("--device", self.device)):
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
        return XposTarget(self.name, loaded.fn, conv,
                          max_position=min(loaded.max_position or XPOS_MAX_POSITION, XPOS_MAX_POSITION),
                          executor=loaded.executor, backward=loaded.backward,
                          dtypes=ND_DEFAULT_DTYPES, device=loaded.device)

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
