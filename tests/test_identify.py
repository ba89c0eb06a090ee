"""``ropecheck identify``: every built-in and a set of inline correct variants are named
exactly; maps that are not rotary embeddings are refused with their reason; the CLI's
exit statuses and messages.

The inline targets are plain functions under the contract, each forming its angles in
float32 as real implementations do (so the probes meet the float32 angle error)."""

from __future__ import annotations

import json
import math
import shlex
import textwrap

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ropecheck.targets.builtins import BUILTIN_FORMS, BUILTINS, builtin
from ropecheck.cli import main
from ropecheck.identification.engine import identify
from ropecheck.identification.result import Identification
from ropecheck.identification.inference import round_within
from ropecheck.targets.target import Target
from ropecheck.properties.inputs.strategies import FREE_HEAD_DIMS
from ropecheck.reference.scaling import parse


# --- inline targets ------------------------------------------------------------------

def _theta(r, base=10000.0):
    return 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float32) / r)


def _rotate_pairs(x, first, second, phi):
    """Rotate features (first[k], second[k]) by phi[..., k] (batch, seq, r/2), CCW."""
    cos, sin = phi.cos()[:, :, None, :], phi.sin()[:, :, None, :]
    xf = x.to(torch.float32)
    a, b = xf[..., first], xf[..., second]
    y = xf.clone()
    y[..., first] = a * cos - b * sin
    y[..., second] = a * sin + b * cos
    return y.to(x.dtype)


def make_rope(layout="half", base=10000.0, rotary_dim=None, scale=1.0, amplitude=1.0,
              pairs=None, theta_fn=None, sign=1.0):
    """A family of correct (and deliberately odd) RoPE variants."""

    def rope(x, positions):
        r = rotary_dim or x.shape[-1]
        theta = theta_fn(r, positions) if theta_fn else _theta(r, base) / scale
        if pairs is not None:
            first, second = pairs(r)
        elif layout == "half":
            first, second = list(range(r // 2)), list(range(r // 2, r))
        else:
            first, second = list(range(0, r, 2)), list(range(1, r, 2))
        phi = sign * positions.to(torch.float32)[..., None] * theta
        y = _rotate_pairs(x, first, second, phi)
        y[..., :r] = (y[..., :r].to(torch.float32) * amplitude).to(x.dtype)
        return y

    return rope


def _llama3_theta(r, positions, factor=8.0, low=1.0, high=4.0, old_context=8192):
    theta = _theta(r, 500000.0).double()
    wavelen = 2 * math.pi / theta
    smooth = (old_context / wavelen - low) / (high - low)
    mid = (1 - smooth) * theta / factor + smooth * theta
    out = torch.where(wavelen > old_context / low, theta / factor, theta)
    inside = (wavelen <= old_context / low) & (wavelen >= old_context / high)
    return torch.where(inside, mid, out).float()


def _dynamic_theta(r, positions, base=10000.0, factor=2.0, max_positions=2048):
    seq_len = int(positions.max()) + 1
    if seq_len > max_positions:
        base = base * ((factor * seq_len / max_positions) - (factor - 1)) ** (r / (r - 2))
    return _theta(r, base)


def _mirror_pairs(r):
    """Pairs (i, r - 1 - i): neither layout."""
    return list(range(r // 2)), list(range(r - 1, r // 2 - 1, -1))


CORRECT = {
    "interleaved-500000": (make_rope("interleaved", 500000.0),
                           dict(layout="interleaved", base=500000.0, rotary_dim=64)),
    "half-partial-16": (make_rope("half", rotary_dim=16),
                        dict(layout="half", base=10000.0, rotary_dim=16)),
    "interleaved-partial-32-base-1e6": (make_rope("interleaved", 1e6, rotary_dim=32),
                                        dict(layout="interleaved", base=1e6, rotary_dim=32)),
    "linear-scale-4": (make_rope("half", scale=4.0),
                       dict(layout="half", base=10000.0, scale=4.0)),
}


def _run(fn, name="inline", **options) -> Identification:
    return identify(Target(name=name, fn=fn, **options), timeout=20)


def _assert_named(ident: Identification, layout, base, rotary_dim=None, scale=1.0):
    assert ident.rotary, ident.reasons
    assert (ident.layout, ident.base, ident.scale) == (layout, base, scale), ident
    assert ident.direction == "counter-clockwise"
    assert ident.geometric and not ident.dynamic
    if rotary_dim is not None:
        assert ident.rotary_dim == rotary_dim
    assert ident.confidence == "high", ident.evidence
    assert ident.worst_ratio <= 1.0


# --- built-ins ------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in BUILTINS if n not in BUILTIN_FORMS])  # rope(x, positions)
@pytest.mark.parametrize("base, rotary_dim", [(10000.0, None), (500000.0, 32), (1e6, 16)])
def test_builtin_identified(name, base, rotary_dim):
    ident = identify(builtin(name, base=base, rotary_dim=rotary_dim))
    _assert_named(ident, BUILTINS[name][0], base, rotary_dim or ident.head_dim)
    expected = f"--layout {BUILTINS[name][0]} --base {base:g}"
    assert ident.flags == expected + (f" --rotary-dim {rotary_dim}" if rotary_dim else "")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_builtin_identified_in_low_precision(dtype):
    """Probing in the only dtype a target declares: large positions pin the base even
    when the matrices carry bfloat16 noise."""
    target = builtin("rotate-half", base=500000.0).with_(dtypes=(dtype,))
    ident = identify(target)
    assert ident.dtype == dtype
    assert (ident.layout, ident.base) == ("half", 500000.0), ident


# --- correct inline variants ------------------------------------------------------------

@pytest.mark.parametrize("name", list(CORRECT))
def test_inline_variant_identified(name):
    fn, expected = CORRECT[name]
    _assert_named(_run(fn, name), expected["layout"], expected["base"],
                  expected.get("rotary_dim"), expected.get("scale", 1.0))


def test_custom_permutation_listed_exactly():
    ident = _run(make_rope(pairs=_mirror_pairs))
    assert ident.rotary and ident.layout is None and ident.flags == ""
    d = ident.head_dim
    assert ident.pairs == [(i, d - 1 - i) for i in range(d // 2)]
    assert ident.base == 10000.0 and ident.geometric


def test_clockwise_reported():
    ident = _run(make_rope("interleaved", sign=-1.0))
    assert ident.rotary and ident.direction == "clockwise (negated angles)"
    assert (ident.layout, ident.base) == ("interleaved", 10000.0)


def test_linear_scaling_named_as_a_check_flag():
    ident = _run(make_rope("half", scale=4.0))
    assert ident.scaling == "--scaling linear:factor=4"
    assert ident.flags == "--layout half --base 10000 --scaling linear:factor=4"


def test_yarn_like_amplitude_reported():
    """Linear interpolation with an attention factor: no --scaling value has both (YaRN's
    factor comes with its ramp), so none is suggested and the note says what was measured."""
    ident = _run(make_rope("half", scale=8.0, amplitude=0.1 * math.log(8.0) + 1.0))
    assert ident.rotary and ident.scaled_amplitude
    assert ident.amplitude == pytest.approx(0.1 * math.log(8.0) + 1.0, rel=1e-6)
    assert (ident.base, ident.scale) == (10000.0, 8.0)
    assert ident.scaling == "" and "--scaling" not in ident.flags
    notes = " ".join(ident.notes)
    assert "linear:factor=8" in notes and "1.20794" in notes and "no --scaling value" in notes


def test_per_frequency_scaling_reported_as_table():
    ident = _run(make_rope("interleaved", theta_fn=_llama3_theta), dtypes=("float32",))
    assert ident.rotary and ident.layout == "interleaved" and not ident.geometric
    assert ident.scaling.startswith("--scaling llama3:")
    np.testing.assert_allclose(ident.theta, _llama3_theta(ident.head_dim, None).double().numpy(),
                               rtol=1e-5)


def test_dynamic_base_detected():
    ident = _run(make_rope("half", theta_fn=_dynamic_theta))
    assert ident.rotary and ident.dynamic
    assert (ident.layout, ident.base) == ("half", 10000.0)
    r = ident.head_dim
    grown = 10000.0 * (2.0 * (2**20 + 1) / 2048 - 1.0) ** (r / (r - 2))
    assert ident.dynamic_base == pytest.approx(grown, rel=1e-3)


# --- named scalings: Llama 3, YaRN (inline float32 implementations) ------------------------

def _f32_inv_freq(r, base):
    return 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float32) / r)


def _llama3_f32(r, base, factor, low, high, original):
    """Llama 3.1 frequency bands, every step in float32 (as HF's llama3 init)."""
    theta = _f32_inv_freq(r, base)
    wavelength = 2 * math.pi / theta
    kept = (original / wavelength - low) / (high - low)  # 0 at the long edge, 1 at the short
    mixed = (1 - kept) * theta / factor + kept * theta
    out = torch.where(wavelength > original / low, theta / factor, theta)
    band = (wavelength <= original / low) & (wavelength >= original / high)
    return torch.where(band, mixed, out)


def _yarn_f32(r, base, factor, original, beta_fast=32.0, beta_slow=1.0):
    """YaRN's ramp over the pair index between floor(d(beta_fast)) and ceil(d(beta_slow)),
    d(beta) = r ln(original / (2 pi beta)) / (2 ln base), in float32."""
    def d(beta):
        return r * math.log(original / (beta * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(d(beta_fast)), 0), min(math.ceil(d(beta_slow)), r - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(r // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    theta = _f32_inv_freq(r, base)
    return theta / factor * ramp + theta * (1 - ramp)


def _mscale(factor, m=1.0):
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _torchtitan_style(base, factor, low, high, original, table=2**17):
    """torchtitan's way: a complex freqs_cis table (torch.polar of t * freqs, complex64) for
    positions 0 .. table-1, scaled frequencies with the band chosen by inclusive wavelength
    bounds, gathered by position and multiplied into (x0 + i x1) pairs (interleaved)."""
    cache = {}

    def rope(x, positions):
        r = x.shape[-1]
        if r not in cache:
            theta = _f32_inv_freq(r, base)
            wavelength = 2 * torch.pi / theta
            stepped = torch.where(wavelength > original / low, theta / factor, theta)
            kept = (original / wavelength - low) / (high - low)
            band = (wavelength >= original / high) & (wavelength <= original / low)
            theta = torch.where(band, (1 - kept) * stepped / factor + kept * stepped, stepped)
            angles = torch.outer(torch.arange(table), theta).float()
            cache[r] = torch.polar(torch.ones_like(angles), angles)
        cis = cache[r][positions][:, :, None, :]  # IndexError past the table, as torchtitan
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], r // 2, 2).contiguous())
        return torch.view_as_real(pairs * cis).flatten(-2).to(x.dtype)

    return rope


# name: (target, expected base, the target's float64 scaling as a --scaling value, amplitude)
LLAMA31 = "llama3:factor=8,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192"
LLAMA3_OTHER = "llama3:factor=16,low_freq_factor=2,high_freq_factor=8,original_max_position_embeddings=4096"
SCALED = {
    "llama3.1": (make_rope("half", theta_fn=lambda r, p: _llama3_f32(r, 500000.0, 8.0, 1.0, 4.0, 8192)),
                 500000.0, LLAMA31, 1.0),
    "llama3-16-2-8-4096": (make_rope("half", theta_fn=lambda r, p: _llama3_f32(r, 500000.0, 16.0, 2.0, 8.0,
                                                                              4096)),
                           500000.0, LLAMA3_OTHER, 1.0),
    "llama3-base-1e4-factor-4-5000": (
        make_rope("interleaved", theta_fn=lambda r, p: _llama3_f32(r, 10000.0, 4.0, 1.0, 3.0, 5000)),
        10000.0, "llama3:factor=4,low_freq_factor=1,high_freq_factor=3,original_max_position_embeddings=5000",
        1.0),
    "torchtitan-llama3": (_torchtitan_style(500000.0, 8.0, 1.0, 4.0, 8192), 500000.0, LLAMA31, 1.0),
    "yarn": (make_rope("half", theta_fn=lambda r, p: _yarn_f32(r, 10000.0, 4.0, 1024), amplitude=_mscale(4.0)),
             10000.0, "yarn:factor=4,original_max_position_embeddings=1024", _mscale(4.0)),
    "deepseek-v3-yarn": (  # factor 40, mscale = mscale_all_dim = 1: attention factor 1
        make_rope("interleaved", theta_fn=lambda r, p: _yarn_f32(r, 10000.0, 40.0, 4096),
                  amplitude=_mscale(40.0, 1.0) / _mscale(40.0, 1.0)),
        10000.0, "yarn:factor=40,original_max_position_embeddings=4096,mscale=1,mscale_all_dim=1", 1.0),
    "yarn-beta-8-2-base-5e5": (
        make_rope("half", theta_fn=lambda r, p: _yarn_f32(r, 500000.0, 6.0, 3000, 8.0, 2.0),
                  amplitude=_mscale(6.0)),
        500000.0, "yarn:factor=6,original_max_position_embeddings=3000,beta_fast=8,beta_slow=2", _mscale(6.0)),
}


_IDENTIFIED: dict = {}


def _scaled(name) -> Identification:
    """The identification of SCALED[name], probed once per test session."""
    if name not in _IDENTIFIED:
        _IDENTIFIED[name] = _run(SCALED[name][0], name)
    return _IDENTIFIED[name]


def _assert_suggestions_parse(ident: Identification):
    """Every --scaling value identify suggests is one that ropecheck check accepts."""
    for value in ident.named_scalings:
        parse(value)
    if ident.scaling:
        words = shlex.split(ident.scaling)
        assert words[0] == "--scaling" and len(words) == 2
        parse(words[1])
        assert ident.scaling in ident.flags or not ident.flags


@pytest.mark.parametrize("name", list(SCALED))
def test_named_scaling_identified(name):
    _, base, truth, amplitude = SCALED[name]
    ident = _scaled(name)
    assert ident.rotary and not ident.geometric and not ident.dynamic, ident.reasons
    assert ident.base == base and ident.base_pairs >= 3
    assert any(f"base: fitted on {ident.base_pairs} of" in n for n in ident.notes), ident.notes
    assert ident.named_scalings, ident.notes
    family = truth.split(":")[0]
    assert ident.named_scalings[0].startswith(family + ":"), ident.named_scalings
    _assert_suggestions_parse(ident)
    expected, suggested = parse(truth), parse(ident.named_scalings[0])
    for r in (2 * len(ident.pairs),) + FREE_HEAD_DIMS + (256,):  # check draws FREE_HEAD_DIMS
        np.testing.assert_allclose(suggested.inv_freq(r, ident.base), expected.inv_freq(r, base),
                                   rtol=1e-5, err_msg=f"rotary dim {r}")
    assert suggested.attention_factor() == pytest.approx(amplitude, rel=1e-6)
    assert ident.flags.startswith(f"--layout {ident.layout} --base {base:g} --scaling {family}:")
    assert ident.confidence == "high" and ident.worst_ratio <= 1.0, ident.evidence


def test_llama3_parameters_equivalent_when_not_unique():
    """Only original/low and original/high are measurable: the Llama 3.1 set is found as
    itself, the (16, 2, 8, 4096) set as the equivalent one with low_freq_factor 1."""
    assert _scaled("llama3.1").named_scalings[0] == LLAMA31
    assert _scaled("llama3-16-2-8-4096").named_scalings[0] == (
        "llama3:factor=16,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=2048")


def test_deepseek_yarn_attention_factor_one():
    ident = _scaled("deepseek-v3-yarn")
    assert ident.named_scalings[0] == "yarn:factor=40,original_max_position_embeddings=4096,attention_factor=1"
    assert not ident.scaled_amplitude


def test_scaling_named_from_one_head_dim():
    """A target that takes head_dim 64 only: the scaling is fitted and verified there, and
    the other head dims are reported as not measured."""
    fn = SCALED["llama3.1"][0]

    def only_64(x, positions):
        if x.shape[-1] != 64:
            raise ValueError("head_dim must be 64")
        return fn(x, positions)

    ident = _run(only_64)
    assert ident.named_scalings == [LLAMA31] and ident.base == 500000.0
    assert any(n.startswith("head dims: not measured at 256") for n in ident.notes), ident.notes
    assert any("verified at rotary dims 64:" in n for n in ident.notes), ident.notes


def test_every_suggested_scaling_parses():
    """The --scaling values suggested for every inline target of this file parse."""
    targets = [fn for fn, _ in CORRECT.values()] + [
        make_rope("half", scale=8.0, amplitude=1.2), make_rope("interleaved", theta_fn=_llama3_theta),
        make_rope("half", theta_fn=_dynamic_theta), make_rope("half", amplitude=1.1)]
    idents = [_run(fn) for fn in targets] + [_scaled(name) for name in SCALED]
    for ident in idents:
        _assert_suggestions_parse(ident)
    assert sum(len(ident.named_scalings) for ident in idents) >= len(SCALED) + 2


def test_unnamed_per_frequency_scaling_has_no_flag():
    """Frequencies divided by an arbitrary per-pair factor: the base from the unscaled head,
    no --scaling value, the reason in the notes."""
    def theta_fn(r, positions):
        theta = _f32_inv_freq(r, 10000.0)
        factors = 1.0 + torch.arange(r // 2, dtype=torch.float32) ** 2 / 40.0
        factors[:4] = 1.0
        return theta / factors

    ident = _run(make_rope("half", theta_fn=theta_fn))
    assert ident.rotary and not ident.geometric and ident.named_scalings == []
    assert ident.scaling == "" and ident.flags == ""
    assert ident.base == 10000.0 and ident.base_pairs == 4
    assert any("no named scaling" in n for n in ident.notes), ident.notes


def test_max_position_respected():
    """A cos/sin table of 4097 positions (IndexError past it): with max_position 4096 no
    probe goes past 4096 and nothing fails; without it the large probe falls back."""
    seen = []
    table = _torchtitan_style(10000.0, 1.0, 1.0, 4.0, 8192, table=4097)

    def rope(x, positions):
        seen.append(int(positions.max()))
        return table(x, positions)

    ident = identify(Target("table", rope), timeout=20, max_position=4096)
    assert ident.rotary and (ident.layout, ident.base) == ("interleaved", 10000.0), ident.reasons
    assert max(seen) == 4096 and ident.max_position == 4096
    assert not any("failed" in note for note in ident.notes), ident.notes
    seen.clear()
    ident = identify(Target("table", rope), timeout=20)
    assert max(seen) == 2**20 and ident.max_position == 4096
    assert any("positions up to 1048576 failed" in note and "IndexError" in note for note in ident.notes)


def test_max_position_below_small_probe():
    seen = []

    def rope(x, positions):
        seen.append(int(positions.max()))
        return make_rope("half")(x, positions)

    ident = identify(Target("small", rope), timeout=20, max_position=100)
    assert ident.rotary and (ident.layout, ident.base) == ("half", 10000.0)
    assert max(seen) <= 100 and ident.max_position == 64
    assert any("not probed" in note for note in ident.notes)


# --- maps that are not rotary embeddings -------------------------------------------------

def _sinusoidal(x, positions):
    d = x.shape[-1]
    phi = positions.to(torch.float32)[..., None] * _theta(d)
    p = torch.cat((phi.sin(), phi.cos()), -1)[:, :, None, :]
    return (x.to(torch.float32) + p).to(x.dtype)


def _xpos(x, positions):
    d = x.shape[-1]
    zeta = (torch.arange(0, d, 2, dtype=torch.float32) + 0.4 * d) / (1.4 * d)
    decay = zeta ** (positions.to(torch.float32)[..., None] / 512)
    y = make_rope("interleaved")(x, positions).to(torch.float32)
    return (y * decay.repeat_interleave(2, -1)[:, :, None, :]).to(x.dtype)


def _rotated_basis(x, positions):
    """Q^T R_m Q: a rotation for every m, but not of feature pairs."""
    d = x.shape[-1]
    q = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64))[0].to(x.dtype)
    y = make_rope("half")(x @ q.T, positions)
    return y @ q


def _random_orthogonal(x, positions):
    d = x.shape[-1]
    q = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(2),
                                    dtype=torch.float64))[0].to(x.dtype)
    return make_rope("half")(x, positions) @ q


def _nonlinear(x, positions):
    return make_rope("half")(torch.tanh(x), positions)


def _offset(x, positions):
    return make_rope("half")(x, positions + 1)


NOT_ROTARY = {
    "additive sinusoidal": (_sinusoidal, ["f(0, m) = p_m", "additive"]),
    "xPos": (_xpos, ["changes with the position", "xPos"]),
    "identity": (lambda x, positions: x.clone(), ["does not depend on the position"]),
    "rotation in another basis": (_rotated_basis, ["mix together", "not made of 2x2 rotations"]),
    "random orthogonal": (_random_orthogonal, ["f(x, 0) is not a multiple of x"]),
    "non-linear": (_nonlinear, ["not linear"]),
    "positions off by one": (_offset, ["position 0 must be the identity"]),
}


@pytest.mark.parametrize("name", list(NOT_ROTARY))
def test_not_rotary_refused(name):
    fn, words = NOT_ROTARY[name]
    ident = _run(fn, name)
    assert not ident.rotary and ident.confidence == "none"
    message = " ".join(ident.reasons)
    for word in words:
        assert word in message, message
    assert ident.flags == ""


def _bf16_cos_sin(x, positions):
    """A correct float32 angle, but cos and sin stored in bfloat16 (for a float32/64 input)."""
    r = x.shape[-1]
    phi = positions.to(torch.float32)[..., None] * _theta(r)
    cos = phi.cos().to(torch.bfloat16).float()[:, :, None, :]
    sin = phi.sin().to(torch.bfloat16).float()[:, :, None, :]
    a, b = x.float()[..., : r // 2], x.float()[..., r // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(x.dtype)


def _angle_mismatch(x, positions):
    """cos from m theta, sin from m theta' with theta' = theta rounded to bfloat16 (two
    caches built differently): each pair's block is c R, but c^2 + s^2 != 1."""
    r = x.shape[-1]
    theta = _theta(r)
    m = positions.to(torch.float32)[..., None]
    cos = (m * theta).cos()[:, :, None, :]
    sin = (m * theta.to(torch.bfloat16).float()).sin()[:, :, None, :]
    a, b = x.float()[..., : r // 2], x.float()[..., r // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(x.dtype)


@pytest.mark.parametrize("fn, dtypes, words", [
    (_bf16_cos_sin, ("float64",), ["every entry of M_m is a bfloat16 number"]),
    (_bf16_cos_sin, ("float32",), ["every entry of M_m is a bfloat16 number"]),
    (_angle_mismatch, ("float64", "float32"), []),
])
def test_norm_changes_not_called_xpos(fn, dtypes, words):
    """Norms that change without following the position are measured and said so; only a
    norm that is a power of the position (log-norm linear in m) is called xPos-like."""
    ident = _run(fn, dtypes=dtypes)
    message = " ".join(ident.reasons)
    assert not ident.rotary and "changes with the position" in message, message
    assert "xPos" not in message, message
    assert "not as a power of the position" in message and "residuals" in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("dtypes", [("float64",), ("float32",)])
def test_xpos_named_xpos_like(dtypes):
    ident = _run(_xpos, dtypes=dtypes)
    message = " ".join(ident.reasons)
    assert not ident.rotary and "(xPos-like)" in message, message
    assert "as a power of the position" in message and "not as a power" not in message


def test_round_within_picks_fewest_digits():
    assert round_within(10000.0 * (1 + 3e-6), 1e-5) == 10000.0
    assert round_within(499998.0, 1e-5) == 500000.0
    assert round_within(12345.678, 1e-9) == 12345.678


# --- CLI ----------------------------------------------------------------------------------

GOOD = textwrap.dedent('''
    import torch

    def rope(x, positions):
        r = x.shape[-1]
        theta = 1.0 / 500000.0 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
        phi = positions.float()[..., None, None] * theta
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], r // 2, 2).contiguous())
        out = torch.view_as_real(pairs * torch.polar(torch.ones_like(phi), phi))
        return out.flatten(-2).to(x.dtype)
''')
ADDITIVE = textwrap.dedent('''
    import torch

    def rope(x, positions):
        d = x.shape[-1]
        phi = positions.float()[..., None] / 10000.0 ** (torch.arange(0, d, 2).float() / d)
        return x + torch.cat((phi.sin(), phi.cos()), -1)[:, :, None, :].to(x.dtype)
''')
RAISES = "def rope(x, positions):\n    raise RuntimeError('no kernel for this input')\n"


def _cli(tmp_path, source, *args):
    path = tmp_path / "target.py"
    path.write_text(source)
    return CliRunner().invoke(main, ["identify", f"{path}:rope", *args])


def test_cli_identifies_and_writes_json(tmp_path):
    out = tmp_path / "id.json"
    result = _cli(tmp_path, GOOD, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert "flags: --layout interleaved --base 500000" in result.output
    assert "confidence: high" in result.output
    data = json.loads(out.read_text())["identification"]
    assert data["layout"] == "interleaved" and data["base"] == 500000.0 and data["rotary"]


def test_cli_refuses_additive_encoding(tmp_path):
    result = _cli(tmp_path, ADDITIVE)
    assert result.exit_code == 1, result.output
    assert "not a rotary embedding" in result.output and "additive" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("source, spec_suffix, words", [
    (RAISES, "", ["cannot identify target", "RuntimeError: no kernel for this input"]),
    ("def rope(x, positions):\n    return x\n", ":missing", ["has no attribute"]),
    ("def rope(x):\n    return x\n", "", ["must accept rope(x, positions)"]),
    ("def rope(x, positions)\n", "", ["SyntaxError"]),
])
def test_cli_unusable_target_exits_2(tmp_path, source, spec_suffix, words):
    path = tmp_path / "target.py"
    path.write_text(source)
    spec = f"{path}:rope" if not spec_suffix else f"{path}{spec_suffix}"
    result = CliRunner().invoke(main, ["identify", spec])
    assert result.exit_code == 2, result.output
    for word in words:
        assert word in result.output, result.output
    assert "Traceback" not in result.output


TABLE_4097 = textwrap.dedent('''
    import torch

    def rope(x, positions):
        if int(positions.max()) > 4096:
            raise IndexError("index out of range: the cos/sin table has 4097 positions")
        r = x.shape[-1]
        theta = 1.0 / 10000.0 ** (torch.arange(0, r, 2, dtype=torch.float32) / r)
        phi = positions.float()[..., None, None] * theta
        a, b = x.float()[..., : r // 2], x.float()[..., r // 2:]
        out = torch.cat((a * phi.cos() - b * phi.sin(), a * phi.sin() + b * phi.cos()), -1)
        return out.to(x.dtype)
''')


def test_cli_max_position(tmp_path):
    result = _cli(tmp_path, TABLE_4097, "--max-position", "4096")
    assert result.exit_code == 0, result.output
    assert "positions up to 4096" in result.output and "failed" not in result.output
    assert "flags: --layout half --base 10000" in result.output
    result = _cli(tmp_path, TABLE_4097)
    assert result.exit_code == 0 and "positions up to 1048576 failed" in result.output


def test_cli_names_scaling_as_check_flag(tmp_path):
    source = GOOD.replace("theta = 1.0 / 500000.0", "theta = 1.0 / 4.0 / 500000.0")
    result = _cli(tmp_path, source)
    assert result.exit_code == 0, result.output
    assert "flags: --layout interleaved --base 500000 --scaling linear:factor=4" in result.output


def test_cli_builtin_by_name():
    result = CliRunner().invoke(main, ["identify", "cached"])
    assert result.exit_code == 0, result.output
    assert "flags: --layout half --base 10000" in result.output
