"""properties.diagnosis: a target with one defect gets that cause named; a correct target,
or one with a defect no candidate describes, gets none."""

import pytest
import torch

from ropecheck.properties.checks import Context
from ropecheck.properties.diagnosis import likely_cause, probe_positions, suspects
from ropecheck.targets.builtins import builtin
from ropecheck.targets.target import Convention, Target
from tests.mutants import mutant_target

BASE = 10000.0
PARTIAL = 16  # a declared partial rotary dimension


def kernel(*, layout="half", base=BASE, rotary_dim=None, sign=1.0, positions=None, scale=None,
           theta_from_head_dim=False, last=False, angle_dtype=None, angle_rounded_after=False,
           cos_dtype=None):
    """RoPE as libraries write it: theta_i and the angles m * theta_i in float32, float32
    arithmetic, one rounding to x's dtype at the end. Each keyword is one defect."""

    def rope(x, p):
        d = x.shape[-1]
        r = rotary_dim or d
        start = d - r if last else 0
        exponent = torch.arange(0, r, 2, dtype=torch.float32) / (d if theta_from_head_dim else r)
        inv_freq = 1.0 / (base ** exponent)
        m = (positions(p) if positions else p).to(torch.float32)
        if scale is not None:
            m = m / scale
        if angle_dtype is not None and not angle_rounded_after:
            phi = (m.to(angle_dtype)[..., None] * inv_freq.to(angle_dtype)).float()
        else:
            phi = m[..., None] * inv_freq
            if angle_dtype is not None:
                phi = phi.to(angle_dtype).float()
        cos, sin = phi.cos(), sign * phi.sin()
        if cos_dtype is not None:
            cos, sin = cos.to(cos_dtype).float(), sin.to(cos_dtype).float()
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        rot = x[..., start:start + r].float()
        half = layout == "half"
        a, b = (rot[..., :r // 2], rot[..., r // 2:]) if half else (rot[..., 0::2], rot[..., 1::2])
        ya, yb = a * cos - b * sin, a * sin + b * cos
        out = torch.cat((ya, yb), -1) if half else torch.stack((ya, yb), -1).flatten(-2)
        y = x.clone()
        y[..., start:start + r] = out.to(x.dtype)
        return y

    return rope


def ctx_for(fn, dtype, layout="half", base=BASE, rotary_dim=None, **target):
    return Context(Target("t", fn, Convention(layout, base, rotary_dim), **target), dtype)


def named(ctx):
    found = suspects(ctx)
    return (found[0].name, found[0].option) if found else None


# defect -> (kernel keywords, declared convention keywords, target keywords, expected
# (candidate, option), dtypes)
BOTH = ("float32", "bfloat16")
FP16_CACHE = {"max_position": 32768}  # float16 holds positions up to 65504 only
DEFECTS = {
    "clockwise": (dict(sign=-1.0), {}, {}, ("clockwise", ""), BOTH),
    "interleaved-declared-half": (dict(layout="interleaved"), {}, {}, ("layout", ""), BOTH),
    "half-declared-interleaved": ({}, dict(layout="interleaved"), {}, ("layout", ""), BOTH),
    "base-1000": (dict(base=1000.0), {}, {}, ("base", "1000"), BOTH),
    "base-500000": (dict(base=500000.0), {}, {}, ("base", "500000"), BOTH),
    "base-10000-declared-500000": ({}, dict(base=500000.0), {}, ("base", "10000"), BOTH),
    "base-12345": (dict(base=12345.0), {}, {}, ("base", "12345"), ("float32",)),
    "off-by-+1": (dict(positions=lambda p: p + 1), {}, {}, ("offset", "+1"), BOTH),
    "off-by--1": (dict(positions=lambda p: p - 1), {}, {}, ("offset", "-1"), BOTH),
    "off-by-+2": (dict(positions=lambda p: p + 2), {}, {}, ("offset", "+2"), BOTH),
    "off-by--2": (dict(positions=lambda p: p - 2), {}, {}, ("offset", "-2"), BOTH),
    "linear-scale-4": (dict(scale=4.0), {}, {}, ("linear-scale", "4"), BOTH),
    "linear-scale-2.5": (dict(scale=2.5), {}, {}, ("linear-scale", "2.5"), ("float32",)),
    "positions-ignored": (dict(positions=lambda p: torch.arange(p.shape[1]).expand_as(p)), {}, {},
                          ("positions-ignored", ""), BOTH),
    "first-row-positions": (dict(positions=lambda p: p[:1].expand_as(p)), {}, {},
                            ("first-row-positions", ""), BOTH),
    "positions-in-bf16": (dict(positions=lambda p: p.to(torch.bfloat16)), {}, {},
                          ("positions-rounded", "bfloat16"), BOTH),
    "positions-in-fp16": (dict(positions=lambda p: p.to(torch.float16)), {}, FP16_CACHE,
                          ("positions-rounded", "float16"), BOTH),
    "angles-in-bf16": (dict(angle_dtype=torch.bfloat16), {}, {}, ("rounding", "angles-bfloat16"), BOTH),
    "angles-rounded-to-bf16": (dict(angle_dtype=torch.bfloat16, angle_rounded_after=True), {}, {},
                               ("rounding", "angles-bfloat16"), BOTH),
    "angles-in-fp16": (dict(angle_dtype=torch.float16), {}, FP16_CACHE,
                       ("rounding", "angles-float16"), BOTH),
    "angles-rounded-to-fp16": (dict(angle_dtype=torch.float16, angle_rounded_after=True), {}, FP16_CACHE,
                               ("rounding", "angles-float16"), BOTH),
    "cos-sin-in-bf16": (dict(cos_dtype=torch.bfloat16), {}, {}, ("rounding", "cos/sin-bfloat16"),
                        ("float32",)),  # a float16 kernel may hold cos/sin in bf16: 2^-9 < 6 u_fp16
    "cos-sin-in-fp16": (dict(cos_dtype=torch.float16), {}, {}, ("rounding", "cos/sin-float16"),
                        ("float32",)),
    "last-features-rotated": (dict(rotary_dim=PARTIAL, last=True), dict(rotary_dim=PARTIAL), {},
                              ("last-features", ""), BOTH),
    "whole-head-rotated": ({}, dict(rotary_dim=PARTIAL), {}, ("whole-head", ""), BOTH),
    "theta-from-head-dim": (dict(rotary_dim=PARTIAL, theta_from_head_dim=True), dict(rotary_dim=PARTIAL),
                            {}, ("theta-from-head-dim", ""), BOTH),
}
# theta_i = base^(-2i/d) = (base^(r/d))^(-2i/r): the same map as another base
SAME_MAP = {"theta-from-head-dim": {"base"}}
CASES = [(name, dtype) for name, spec in DEFECTS.items() for dtype in spec[-1]]


@pytest.mark.parametrize("defect,dtype", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_defect_is_named(defect, dtype):
    kw, declared, target, expected, _ = DEFECTS[defect]
    ctx = ctx_for(kernel(**kw), dtype, **declared, **target)
    found = suspects(ctx)
    assert found, f"{defect} ({dtype}): nothing fits"
    assert (found[0].name, found[0].option) == expected, [s.cause for s in found]
    assert all(s.error <= 1.0 for s in found)
    # one exact explanation (or the same map described twice), one rounding envelope at most
    extra = {s.name for s in found[1:] if s.exact} - SAME_MAP.get(defect, set())
    assert not extra and sum(not s.exact for s in found) <= 1, [s.cause for s in found]
    line = likely_cause(ctx)
    assert line.startswith("likely cause: ") and found[0].cause in line


def test_message_reports_the_agreement():
    line = likely_cause(ctx_for(kernel(sign=-1.0), "float32"))
    assert line.startswith("likely cause: the target rotates clockwise (it equals the reference at -m to ")
    assert "e-0" in line and "of the error bound" in line
    base = likely_cause(ctx_for(kernel(base=1000.0), "float32"))
    assert "base 1000 (fitted from its angles: 1000" in base and "not 10000" in base
    rounding = likely_cause(ctx_for(kernel(cos_dtype=torch.bfloat16), "float32"))
    assert rounding.startswith("likely cause: cos and sin are rounded to bfloat16 while x is float32 "
                               "(its error is ")
    assert "of that allowance" in rounding


MUTANT_CAUSES = {
    "sign-flipped": ("clockwise", ""),
    "interleaved-pairs": ("layout", ""),
    "wrong-base": ("base", "1000"),
    "off-by-one": ("offset", "+1"),
    "positions-ignored": ("positions-ignored", ""),
    "first-row-positions": ("first-row-positions", ""),
    "angles-in-bf16": ("rounding", "angles-bfloat16"),
    "cos-sin-in-fp16": ("rounding", "cos/sin-float16"),
    "constant-map": ("no-rotation", ""),
}


@pytest.mark.parametrize("mutant", MUTANT_CAUSES)
def test_mutants_are_named(mutant):
    assert named(Context(mutant_target(mutant), "float32")) == MUTANT_CAUSES[mutant]


def test_positions_in_fp16_overflow_gets_no_diagnosis():
    """Past 65504 float16 positions are inf: the probe's output is not finite, the call
    breaks the contract, and nothing is named."""
    assert likely_cause(Context(mutant_target("positions-in-fp16"), "float32")) is None
    ctx = Context(mutant_target("positions-in-fp16").with_(max_position=32768), "float32")
    assert named(ctx) == ("positions-rounded", "float16")


# --- nothing fits ---------------------------------------------------------------------

CORRECT = [("rotate-half", {}), ("llama-complex", {}), ("matrix", {}), ("cached", {}),
           ("rotate-half", {"rotary_dim": PARTIAL}), ("llama-complex", {"base": 500000.0})]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("name,kw", CORRECT, ids=[f"{n}-{kw}" for n, kw in CORRECT])
def test_correct_target_gets_no_diagnosis(name, kw, dtype):
    ctx = Context(builtin(name, **kw), dtype)
    assert suspects(ctx) == [] and likely_cause(ctx) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_correct_kernel_and_scaled_builtin_get_no_diagnosis(dtype):
    assert likely_cause(ctx_for(kernel(), dtype)) is None
    assert likely_cause(ctx_for(kernel(rotary_dim=PARTIAL), dtype, rotary_dim=PARTIAL)) is None
    from ropecheck.reference.scaling import parse
    scaled = builtin("rotate-half", scaling=parse("yarn:factor=4,original_max_position_embeddings=256"))
    assert likely_cause(Context(scaled, dtype)) is None


def negated(x, p):
    return -kernel()(x, p)


def raises(x, p):
    raise RuntimeError("no kernel for this shape")


def nan_output(x, p):
    y = kernel()(x, p)
    y[0, 0, 0, 0] = float("nan")
    return y


def sin_scaled(x, p):  # not a rotation: the pair norms change
    return mutant_target("norm-growing").fn(x, p)


def clamps_past(length, base=BASE):
    """A cos/sin table of ``length`` rows indexed by the clamped position."""
    return kernel(base=base, positions=lambda q: q.clamp(max=length - 1))


UNRELATED = {
    "negated": negated, "raises": raises, "nan-output": nan_output, "sin-scaled": sin_scaled,
    "table-clamps-at-70000": clamps_past(70000), "table-clamps-at-4096": clamps_past(4096),
    **{name: mutant_target(name).fn for name in (
        "cache-wraps", "taylor-sincos", "additive-sinusoid", "norm-growing", "quadratic-angle",
        "nan-at-zero", "mutates-input")},
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("defect", UNRELATED)
def test_unrelated_defect_gets_no_false_diagnosis(defect, dtype):
    assert likely_cause(ctx_for(UNRELATED[defect], dtype)) is None


def test_first_dtype_cache_clamp_is_not_called_rounding():
    """Its table stops at 70000: wrong only at the probe's 2^20 positions, where bfloat16
    angles may be off by whole radians; the angle envelope must not take it."""
    for dtype in ("float32", "bfloat16"):
        assert likely_cause(Context(mutant_target("first-dtype-cache"), dtype)) is None


@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("length", [4096, 70000, 2**20])
def test_table_that_clamps_is_not_called_rounding(length, base):
    """Clamped at 2^20, position 2^20 + 2^12 - 1 is off by 4096, as much as bfloat16
    rounding moves it: only the smaller positions bfloat16 cannot hold tell the two apart."""
    for dtype in ("float32", "bfloat16"):
        ctx = ctx_for(clamps_past(length, base), dtype, base=base)
        assert likely_cause(ctx) is None, likely_cause(ctx)


def test_no_convention_no_diagnosis():
    assert likely_cause(Context(Target("t", kernel(sign=-1.0)), "float32")) is None


# --- the rounding candidates: told apart by how the error grows with m -----------------

ROUNDINGS = [("cos/sin", "float16"), ("cos/sin", "bfloat16"), ("angles", "float16"), ("angles", "bfloat16")]


@pytest.mark.parametrize("kind,dtype", ROUNDINGS, ids=[f"{k}-{d}" for k, d in ROUNDINGS])
def test_rounding_candidates_are_told_apart(kind, dtype):
    """Each rounding target is held by its own envelope and by none of the other kind;
    within a kind, the finer dtype's envelope (tried first) does not hold the coarser
    dtype's target. cos/sin rounding errs by u_L rho at every m and changes pair norms;
    angle rounding keeps norms and errs by ~u_L |m theta_i|, a radian where m is not
    representable in L."""
    from ropecheck.properties import diagnosis, suspects as models
    L = torch.float16 if dtype == "float16" else torch.bfloat16
    kw = dict(cos_dtype=L) if kind == "cos/sin" else dict(angle_dtype=L)
    probe = diagnosis._probe(ctx_for(kernel(**kw), "float32", max_position=32768))

    def holds(option):
        model = models._rounding(probe, option)
        return model is not None and diagnosis._score(probe, model) <= 1.0

    assert holds((kind, dtype))
    for other in ROUNDINGS:
        if other[0] != kind:
            assert not holds(other), other
    if dtype == "bfloat16":
        assert not holds((kind, "float16"))


def test_angle_rounding_error_grows_and_cos_sin_rounding_does_not():
    """The measured error of the two bfloat16 defects against position (the signature the
    envelopes rely on): angles in bf16 reach O(1) at large m, cos/sin in bf16 stay under
    u_bf16 = 2^-8 of the pair's norm."""
    import numpy as np
    from ropecheck.properties.inputs.cases import as_float64
    limit = 2**20
    positions = probe_positions(limit)
    x = torch.randn(2, positions.shape[1], 2, 64, generator=torch.Generator().manual_seed(0))
    reference = Convention("half").apply(as_float64(x), positions)
    norm = np.linalg.norm(as_float64(x), axis=-1)
    for kw, small, large in ((dict(angle_dtype=torch.bfloat16), 1e-1, 0.5),
                             (dict(cos_dtype=torch.bfloat16), 2**-8, 0.0)):
        error = np.linalg.norm(as_float64(kernel(**kw)(x, torch.from_numpy(positions))) - reference,
                               axis=-1) / norm
        at_small, at_large = error[positions <= 3].max(), error[positions >= 4097].max()
        assert at_small < small
        if large:
            assert at_large > large
        else:
            assert at_large < 2 * 2**-8


def test_probe_is_one_call():
    calls = []

    def counting(x, p):
        calls.append(tuple(x.shape))
        return kernel(sign=-1.0)(x, p)

    assert likely_cause(ctx_for(counting, "float32")) is not None
    assert len(calls) == 1
    batch, seq, heads, head_dim = calls[0]
    assert batch == 2 and head_dim == 128
    positions = probe_positions(2**24)
    assert positions.shape == (2, seq) and (positions[0] != positions[1]).any()
    assert {0, 1, 2, 3, 100, 1000, 4097}.issubset(set(positions[0].tolist()))
    assert positions.max() >= 2**20


def test_probe_respects_max_position():
    positions = probe_positions(4096)
    assert positions.max() == 4096 and 4097 not in positions
    ctx = ctx_for(kernel(sign=-1.0), "float32", max_position=4096)
    assert named(ctx) == ("clockwise", "")


# --- declared position scaling ------------------------------------------------------------

def _declared(target, scaling):
    from dataclasses import replace
    from ropecheck.reference.scaling import parse
    return target.with_(convention=replace(target.convention, scaling=parse(scaling)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("declared,target_scaling,expected", [
    ("linear:factor=8", None, ("scaling-not-applied", "")),
    ("yarn:factor=4,original_max_position_embeddings=256", None, ("scaling-not-applied", "")),
    ("linear:factor=8", "linear:factor=4", ("linear-scale", "4")),
])
def test_declared_scaling_defects(declared, target_scaling, expected, dtype):
    from ropecheck.reference.scaling import parse
    scaling = parse(target_scaling) if target_scaling else parse("default")
    target = _declared(builtin("rotate-half", scaling=scaling), declared)
    assert named(Context(target, dtype)) == expected


@pytest.mark.parametrize("spec", ["yarn:factor=4,original_max_position_embeddings=256",
                                  "dynamic:factor=4,max_position_embeddings=256"])
def test_defect_under_declared_scaling(spec):
    from ropecheck.reference.scaling import parse
    target = builtin("rotate-half", scaling=parse(spec))
    shifted = target.with_(fn=lambda x, p, rope=target.fn: rope(x, p + 1))
    assert named(Context(shifted, "float32")) == ("offset", "+1")
