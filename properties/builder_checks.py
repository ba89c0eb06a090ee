"""Checks of multimodal position builders: ``build_positions(segments) -> (seq, n_axes)``
(``reference.multimodal`` describes segments and the families).

Each family declares the properties it promises (data, not if/else in the checks):
- compatibility: text-only input gives exactly 1-D RoPE positions (n, .., n);
- text-runs: inside a text segment positions advance by (1, .., 1);
- text-after-media: the text after a medium starts where the family says (RoPE-Tie:
  L + (w+1)(h+1); RoPE-TV: L + N + 1 for N patches; M-RoPE: previous max + 1);
- symmetry: (first patch - last text before) = (first text after - last patch);
- equivalence: a medium of N patches moves the following text as N tokens would;
- reference: equal to the float64 reference builder (positions compared exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.core.contract import CallError, Subject
from ropecheck.properties.property import Declaration, Family, FamilyContext, FamilyError, Property, family_registry
from ropecheck.reference import multimodal as mm


@dataclass(frozen=True)
class BuilderFamily:
    name: str
    n_axes: int
    media: tuple  # segment kinds it accepts besides text
    promises: frozenset
    next_text: Callable  # (L, previous positions, medium segment, n_axes) -> first text position after
    # Qwen2-VL wraps every medium in <|vision_start|> .. <|vision_end|> text tokens, and
    # HF's get_rope_index groups adjacent media into one: draw media separated by text
    adjacent_media: bool = True


def _tie_next(L, prev, seg, n_axes):
    _, h, w = seg
    return L + (w + 1) * (h + 1)


def _tv_next(L, prev, seg, n_axes):
    return L + int(np.prod(seg[1:])) + 1 if n_axes == 3 else L + seg[-1] * seg[-2] + 1


def _mrope_next(L, prev, seg, n_axes):
    return prev.max() + 1


ALL = frozenset({"contract", "compatibility", "text-runs", "text-after-media", "symmetry", "equivalence", "reference"})
FAMILIES = {
    "rope-tie": BuilderFamily("rope-tie", 2, ("image",), ALL - {"equivalence"}, _tie_next),
    "rope-tv": BuilderFamily("rope-tv", 2, ("image",), ALL, _tv_next),
    "rope-tv-3d": BuilderFamily("rope-tv", 3, ("image", "video"), ALL, _tv_next),
    "mrope": BuilderFamily(
        "mrope", 3, ("image", "video"), ALL - {"symmetry", "equivalence"}, _mrope_next, adjacent_media=False
    ),
}


def family(name: str, n_axes: int | None = None) -> BuilderFamily:
    key = "rope-tv-3d" if name == "rope-tv" and n_axes == 3 else name
    if key not in FAMILIES:
        raise ValueError(
            f"unknown builder family {name!r} (with {n_axes} axes); known: rope-tie, rope-tv (2 or 3 axes), mrope"
        )
    fam = FAMILIES[key]
    if n_axes not in (None, fam.n_axes):
        raise ValueError(f"{name} builders have {fam.n_axes} axes, not {n_axes}")
    return fam


def segments_strategy(fam: BuilderFamily, text_around: bool = False):
    text = st.tuples(st.just("text"), st.integers(1 if text_around or not fam.adjacent_media else 0, 4))
    image = st.tuples(st.just("image"), st.integers(1, 4), st.integers(1, 4))
    video = st.tuples(st.just("video"), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
    media = st.one_of([s for k, s in (("image", image), ("video", video)) if k in fam.media])
    if text_around or not fam.adjacent_media:
        return st.lists(media, min_size=1, max_size=3).flatmap(
            lambda ms: st.lists(text, min_size=len(ms) + 1, max_size=len(ms) + 1).map(
                lambda ts: [seg for pair in zip(ts, ms + [None]) for seg in pair if seg is not None][
                    0 if text_around else 1 :
                ]
            )
        )  # without text_around: may start with a medium
    return st.lists(st.one_of(text, media), max_size=5)


def call_builder(fn, segments, fam: BuilderFamily) -> np.ndarray:
    """The builder's output as float64 (seq, n_axes), after checking the contract."""
    try:
        out = fn([tuple(s) for s in segments])
    except CallError as exc:  # through ropecheck's calling layer: it says what the target did
        raise CheckFailure(f"{exc} on {mm.describe_segments(segments)}") from None
    except Exception as exc:
        raise CheckFailure(
            f"the builder raised {type(exc).__name__}: {exc} on {mm.describe_segments(segments)}"
        ) from None
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu().numpy()
    out = np.asarray(out)
    n = mm.token_count(segments)
    if out.dtype.kind not in "iuf":
        raise CheckFailure(f"the builder returned dtype {out.dtype}, expected numbers")
    if out.shape != (n, fam.n_axes):
        raise CheckFailure(
            f"the builder returned shape {out.shape}, expected ({n}, {fam.n_axes}) for {mm.describe_segments(segments)}"
        )
    out = out.astype(np.float64)
    if not np.isfinite(out).all():
        raise CheckFailure("the builder returned non-finite positions")
    return out


def _fail(what, segments, at, got, expected):
    raise CheckFailure(
        f"{what} on {mm.describe_segments(segments)}: token {at} at {np.asarray(got).tolist()}, "
        f"expected {np.asarray(expected).tolist()}"
    )


@dataclass(frozen=True)
class Segments:
    """A builder's input, as a check's case: the segments, printable."""

    segments: tuple

    shape = (1,)  # one call's worth of work (the runner's time limit scales with it)
    call = "segments"

    def describe(self) -> str:
        return mm.describe_segments(list(self.segments))


@dataclass
class BuilderContext(FamilyContext):
    """The builder family's context: the builder behind the calling layer (time limit,
    exceptions as findings; it takes segments, not tensors, so no error model: positions
    are compared exactly) and the rules of its family (its convention, a BuilderFamily)."""

    def __post_init__(self):
        self.rope = self.target.caller(self.timeout)
        self.family = self.target.convention


def _segment_cases(prop: Property, ctx: BuilderContext):
    return segments_strategy(ctx.family, prop.case_options.get("text_around", False)).map(
        lambda segments: Segments(tuple(tuple(s) for s in segments))
    )


def _promised(prop: Property, target: Subject) -> tuple:
    if prop.name not in target.convention.promises:
        return False, f"not promised by {target.convention.name}"
    return True, ""


# Position builders: their input is a list of segments, their output positions compared exactly
BUILDERS = Family(
    "position builder",
    BuilderContext,
    _segment_cases,
    applies=_promised,
    calls=("segments",),
    description="build_positions(segments) -> array (tokens, n_axes); segments "
    "('text', n), ('image', h, w), ('video', t, h, w)",
)

BUILDER_PROPERTIES: dict[str, Property]
BUILDER_PROPERTIES, builder_register = family_registry(BUILDERS)


def _declare(name: str):
    """The declaration of a builder family: its rules (a BuilderFamily) as the convention;
    it takes segments, no tensors (dtype "-"), and has no backward."""

    def declare(parameters: dict, own) -> Declaration:
        try:
            rules = family(name, parameters.get("axes"))
        except ValueError as exc:
            raise FamilyError(str(exc)) from None
        return Declaration(rules, n_axes=rules.n_axes, dtypes=("-",))

    return declare


BUILDER_FAMILIES = tuple(
    BUILDERS.variant(f"{name}-builder", _declare(name)) for name in ("rope-tie", "rope-tv", "mrope")
)


def _builder_property(name: str, formula: str, text_around: bool = False):
    """Register check(fn, family, segments) as the builder property ``name``."""

    def register(check):
        builder_register(name=name, formula=formula, case_options={"text_around": text_around}, calls=("segments",))(
            lambda ctx, case: check(ctx.rope, ctx.family, list(case.segments)) or 0.0
        )
        return check

    return register


@_builder_property("contract", "build_positions(segments) is numeric, finite, of shape (tokens, n_axes)")
def check_contract(fn, fam, segments):
    call_builder(fn, segments, fam)


@_builder_property("compatibility", "text-only input gives 1-D RoPE positions (n, .., n)")
def check_compatibility(fn, fam, segments):
    n = mm.token_count(segments)
    text_only = [("text", n)]
    out = call_builder(fn, text_only, fam)
    expected = mm.flat_positions(text_only, fam.n_axes)
    bad = np.nonzero((out != expected).any(-1))[0]
    if len(bad):
        _fail("text-only input is not 1-D RoPE", text_only, int(bad[0]), out[bad[0]], expected[bad[0]])


@_builder_property("text-runs", "positions inside a text segment advance by (1, .., 1)")
def check_text_runs(fn, fam, segments):
    out = call_builder(fn, segments, fam)
    for kind, a, b in mm.media_spans(segments):
        if kind == "text" and b - a > 1:
            steps = np.diff(out[a:b], axis=0)
            bad = np.nonzero((steps != 1).any(-1))[0]
            if len(bad):
                _fail(
                    "text positions do not advance by 1 on every axis",
                    segments,
                    a + int(bad[0]) + 1,
                    out[a + bad[0] + 1],
                    out[a + bad[0]] + 1,
                )


def _around(segments, out):
    """(L, previous positions, medium, medium positions, first text position after) for every
    medium followed by text."""
    spans, segs = mm.media_spans(segments), mm.validate_segments(segments)
    for k, (kind, a, b) in enumerate(spans):
        if kind == "text" or k + 1 >= len(spans) or spans[k + 1][0] != "text" or spans[k + 1][2] == spans[k + 1][1]:
            continue
        L = out[a - 1][0] if a > 0 else -1.0
        before = [kind for kind, start, end in spans[:k] if end > start]
        if before and before[-1] != "text":
            continue  # two media in a row (or with empty text between): L is not a text position
        yield L, out[:a] if a else np.full((1, out.shape[1]), -1.0), segs[k], out[a:b], b, out[b]


@_builder_property("text-after-media", "the text after a medium starts at the family's position")
def check_text_after_media(fn, fam, segments):
    out = call_builder(fn, segments, fam)
    for L, prev, seg, block, at, first_after in _around(segments, out):
        expected = fam.next_text(L, np.concatenate([prev, block]), seg, fam.n_axes)
        if (first_after != expected).any():
            _fail(
                f"the text after {seg[0]} {seg[1:]} starts at the wrong position",
                segments,
                at,
                first_after,
                np.full(fam.n_axes, expected),
            )


@_builder_property("symmetry", "first patch - last text before = next text - last patch", text_around=True)
def check_symmetry(fn, fam, segments):
    out = call_builder(fn, segments, fam)
    for L, _prev, seg, block, _at, first_after in _around(segments, out):
        if L < 0:
            continue
        before, after = block[0] - L, first_after - block[-1]
        if (before != after).any():
            raise CheckFailure(
                f"asymmetric gaps around {seg[0]} {seg[1:]} in {mm.describe_segments(segments)}: "
                f"first patch - last text = {before.tolist()}, next text - last patch = "
                f"{after.tolist()}"
            )


@_builder_property("equivalence", "a medium of N patches counts as N tokens: next text at L + N + 1", text_around=True)
def check_equivalence(fn, fam, segments):
    out = call_builder(fn, segments, fam)
    for L, _prev, seg, block, _at, first_after in _around(segments, out):
        n = len(block)
        if (first_after != L + n + 1).any():
            raise CheckFailure(
                f"{seg[0]} {seg[1:]} of {n} patches does not count as {n} tokens in "
                f"{mm.describe_segments(segments)}: next text at {first_after.tolist()}, "
                f"expected {L + n + 1:g}"
            )


@_builder_property("reference", "positions equal the reference builder's")
def check_reference(fn, fam, segments):
    out = call_builder(fn, segments, fam)
    ref, _ = mm.reference_builder(fam.name, fam.n_axes)
    expected = ref(segments).astype(np.float64)
    bad = np.nonzero((out != expected).any(-1))[0]
    if len(bad):
        _fail(f"positions differ from the {fam.name} reference", segments, int(bad[0]), out[bad[0]], expected[bad[0]])
