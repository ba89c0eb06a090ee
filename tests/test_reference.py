"""Tests of the float64 reference package: the seeds' forms agree, R_m = expm(m B) is a group of
rotations, half = P^T interleaved P, mpmath bounds the reference's own error, sympy proves the
identities, and the sinusoidal negative control is rejected.

Every equality check is paired with a deliberately wrong variant that must NOT pass it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ropecheck.reference import (
    LAYOUTS,
    angles,
    apply_rope,
    apply_rope_mpmath,
    apply_sinusoidal,
    generator,
    inv_freq,
    pair_indices,
    pair_norms,
    rope_complex_form,
    rope_elementwise_form,
    rope_matrix_form,
    rope_rotate_half_form,
    rotation_matrix,
    rotation_matrix_expm,
    sinusoidal_encoding,
    symbolic,
)

EPS = np.finfo(np.float64).eps
FAST = settings(max_examples=25, deadline=None)


# --------------------------------------------------------------------------- helpers


def normalised_error(actual, expected, x) -> tuple[float, tuple]:
    """max over vectors of |actual - expected|_2 / |x|_2, and the index of that vector."""
    err = np.linalg.norm(np.asarray(actual) - expected, axis=-1)
    scale = np.maximum(np.linalg.norm(np.broadcast_to(x, err.shape + x.shape[-1:]), axis=-1), np.finfo(float).tiny)
    ratio = np.atleast_1d(err / scale)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    return float(ratio[worst]), tuple(int(i) for i in worst)


def assert_matches(actual, expected, *, x, tol: float, what: str) -> None:
    """actual has expected's dtype and shape and is within tol of it, relative to |x| per vector."""
    __tracebackhide__ = True
    actual = np.asarray(actual)
    assert actual.dtype == np.float64, f"out.dtype={actual.dtype}, but should be float64 [{what}]"
    assert actual.shape == expected.shape, f"out.shape={actual.shape}, but should be {expected.shape} [{what}]"
    err, where = normalised_error(actual, expected, x)
    assert err <= tol, f"normalised error {err:.3g} at vector {where}, allowed {tol:.3g} [{what}]"


def assert_differs(actual, expected, *, x, tol: float, what: str) -> None:
    """A deliberately wrong variant must fail assert_matches' criterion: the check can fail."""
    __tracebackhide__ = True
    err, _ = normalised_error(actual, expected, x)
    assert err > tol, f"a wrong variant passes: normalised error {err:.3g} <= {tol:.3g} [{what}]"


def angle_budget(*positions) -> float:
    """Float64 error allowance for maps built from the angles m * theta_i (theta_i <= 1).

    Each fl(m theta) is off by at most |m| theta eps / 2; cos, sin and the pair arithmetic add
    a few eps.
    """
    return EPS * (sum(abs(int(p)) for p in positions) + 8)


def permutation_half_to_interleaved(head_dim: int, rotary_dim: int) -> np.ndarray:
    """P with (P x)[2i] = x[i], (P x)[2i+1] = x[i + r/2]; identity on the pass-through features."""
    p = np.zeros((head_dim, head_dim))
    half = rotary_dim // 2
    for i in range(half):
        p[2 * i, i] = 1.0
        p[2 * i + 1, i + half] = 1.0
    for k in range(rotary_dim, head_dim):
        p[k, k] = 1.0
    return p


# --------------------------------------------------------------------------- strategies


@dataclass
class Case:
    x: np.ndarray  # (batch, seq, heads, head_dim)
    positions: np.ndarray  # (batch, seq) int64
    layout: str
    base: float
    rotary_dim: int

    @property
    def kwargs(self) -> dict:
        return {"base": self.base, "rotary_dim": self.rotary_dim}


@st.composite
def dims(draw, *, partial_rotary: bool | None = None):
    """(head_dim, rotary_dim): even rotary_dim <= head_dim; head_dim may be odd."""
    rotary_dim = 2 * draw(st.integers(1, 24), label="rotary_dim / 2")
    lo = 1 if partial_rotary else 0
    hi = 0 if partial_rotary is False else 9
    return rotary_dim + draw(st.integers(lo, hi), label="pass-through features"), rotary_dim


@st.composite
def cases(draw, *, max_position: int = 2**20, partial_rotary: bool | None = None) -> Case:
    head_dim, rotary_dim = draw(dims(partial_rotary=partial_rotary))
    batch, seq, heads = draw(
        st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 3)), label="batch, seq, heads"
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    positions = draw(
        st.lists(st.integers(-max_position, max_position), min_size=batch * seq, max_size=batch * seq),
        label="positions",
    )
    return Case(
        x=rng.standard_normal((batch, seq, heads, head_dim)),
        positions=np.array(positions, dtype=np.int64).reshape(batch, seq),
        layout=draw(st.sampled_from(LAYOUTS), label="layout"),
        base=draw(st.sampled_from([10000.0, 500000.0, 10.0]), label="base"),
        rotary_dim=rotary_dim,
    )


# The four forms, each with the layout it implements.  Forms broadcast m with numpy rules,
# so (batch, seq) positions become (batch, seq, 1) against x's (batch, seq, heads).
FORMS = {
    "matrix/interleaved": (partial(rope_matrix_form, layout="interleaved"), "interleaved"),
    "matrix/half": (partial(rope_matrix_form, layout="half"), "half"),
    "complex": (rope_complex_form, "interleaved"),
    "elementwise": (rope_elementwise_form, "interleaved"),
    "rotate_half": (rope_rotate_half_form, "half"),
}
FORM_TOL = 1e-13


# --------------------------------------------------------------------------- the four forms


@pytest.mark.parametrize("name", FORMS)
@FAST
@given(case=cases())
def test_forms_agree_with_apply_rope(name, case):
    form, layout = FORMS[name]
    m = case.positions[..., None]
    expected = apply_rope(case.x, case.positions, layout=layout, **case.kwargs)
    assert_matches(form(case.x, m, **case.kwargs), expected, x=case.x, tol=FORM_TOL, what=f"{name} vs apply_rope")


def _wrong_variants(x, m, layout, kw):
    """The bug classes of DESIGN.md, as outputs that a correct check must reject."""
    other = "half" if layout == "interleaved" else "interleaved"
    yield "sign of rotation", apply_rope(x, -m, layout=layout, **kw)
    yield "position off by one", apply_rope(x, m + 1, layout=layout, **kw)
    yield (
        "positions ignored (arange)",
        apply_rope(x, np.broadcast_to(np.arange(m.shape[1]), m.shape), layout=layout, **kw),
    )
    yield "positions of row 0 for all rows", apply_rope(x, np.broadcast_to(m[:1], m.shape), layout=layout, **kw)
    yield "wrong layout", apply_rope(x, m, layout=other, **kw)
    yield "wrong base", apply_rope(x, m, layout=layout, base=500000.0, rotary_dim=kw["rotary_dim"])
    yield (
        "frequency order reversed",
        apply_rope(x, m, layout=layout, theta=inv_freq(kw["rotary_dim"])[::-1].copy(), rotary_dim=kw["rotary_dim"]),
    )
    yield "no rotation", x.copy()


@pytest.mark.parametrize("name", FORMS)
def test_form_agreement_check_rejects_wrong_variants(name):
    form, layout = FORMS[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 16))
    m = np.array([[3, 17, 1000, 2**20, -5], [0, 1, 2, 3, 4]])
    kw = {"base": 10000.0, "rotary_dim": 16}
    y = form(x, m[..., None], **kw)
    assert_matches(y, apply_rope(x, m, layout=layout, **kw), x=x, tol=FORM_TOL, what=name)
    for bug, wrong in _wrong_variants(x, m, layout, kw):
        assert_differs(y, wrong, x=x, tol=FORM_TOL, what=f"{name} vs {bug}")


def test_forms_broadcast_scalar_position():
    x = np.random.default_rng(1).standard_normal((3, 8))
    expected = apply_rope(x, np.full(3, 7), layout="interleaved")
    for name, (form, layout) in FORMS.items():
        if layout == "interleaved":
            assert_matches(form(x, 7), expected, x=x, tol=FORM_TOL, what=f"{name}, scalar m")


# --------------------------------------------------------------------------- matrix form: R_m = expm(m B)


@FAST
@given(
    hd=dims(), layout=st.sampled_from(LAYOUTS), m=st.integers(-(2**12), 2**12), base=st.sampled_from([10000.0, 10.0])
)
def test_rotation_matrix_is_expm_of_skew_symmetric_generator(hd, layout, m, base):
    head_dim, rotary_dim = hd
    kw = {"layout": layout, "base": base, "rotary_dim": rotary_dim}
    b = generator(head_dim, **kw)
    np.testing.assert_array_equal(b.T, -b, err_msg="generator B is not skew-symmetric")
    assert np.count_nonzero(b) == rotary_dim, "B must couple exactly the rotated pairs"
    rot = rotation_matrix(m, head_dim, **kw)
    # scipy's expm (scaling and squaring) is off by up to ~93 |m| eps (measured, m <= 2^20)
    tol = 256 * EPS * (1 + abs(m))
    eye = np.eye(head_dim)
    assert_matches(rot, rotation_matrix_expm(m, head_dim, **kw), x=eye, tol=tol, what="R_m vs expm(m B)")
    assert_differs(
        rotation_matrix(m + 1, head_dim, **kw),
        rotation_matrix_expm(m, head_dim, **kw),
        x=eye,
        tol=tol,
        what="R_{m+1} vs expm(m B)",
    )
    assert_differs(
        rotation_matrix(-m if m else 1, head_dim, **kw),
        rotation_matrix_expm(m, head_dim, **kw),
        x=eye,
        tol=tol,
        what="R_{-m} vs expm(m B)",
    )


@FAST
@given(hd=dims(), layout=st.sampled_from(LAYOUTS), m=st.integers(-(2**20), 2**20), n=st.integers(-(2**20), 2**20))
def test_rotation_matrix_is_orthogonal_and_relative(hd, layout, m, n):
    head_dim, rotary_dim = hd
    kw = {"layout": layout, "rotary_dim": rotary_dim}
    r_m, r_n = rotation_matrix(m, head_dim, **kw), rotation_matrix(n, head_dim, **kw)
    eye = np.eye(head_dim)
    assert_matches(r_m.T @ r_m, eye, x=eye, tol=8 * EPS, what="R_m^T R_m vs I")
    tol = angle_budget(m, n, n - m)
    assert_matches(r_m.T @ r_n, rotation_matrix(n - m, head_dim, **kw), x=eye, tol=tol, what="R_m^T R_n vs R_{n-m}")
    if m != n:
        assert_differs(r_m.T @ r_n, rotation_matrix(m - n, head_dim, **kw), x=eye, tol=tol, what="R_m^T R_n vs R_{m-n}")


@FAST
@given(hd=dims(), m=st.integers(-(2**20), 2**20))
def test_half_layout_is_permuted_interleaved(hd, m):
    head_dim, rotary_dim = hd
    p = permutation_half_to_interleaved(head_dim, rotary_dim)
    np.testing.assert_array_equal(p @ p.T, np.eye(head_dim), err_msg="P is not a permutation")
    r_half = rotation_matrix(m, head_dim, layout="half", rotary_dim=rotary_dim)
    r_int = rotation_matrix(m, head_dim, layout="interleaved", rotary_dim=rotary_dim)
    # the same cos / sin values land in permuted places: exact equality
    np.testing.assert_array_equal(r_half, p.T @ r_int @ p, err_msg="R_half != P^T R_interleaved P")
    x = np.random.default_rng(abs(m)).standard_normal((1, 2, head_dim))
    pos = np.array([m])
    np.testing.assert_array_equal(
        apply_rope(x, pos, layout="half", rotary_dim=rotary_dim),
        apply_rope(x @ p.T, pos, layout="interleaved", rotary_dim=rotary_dim) @ p,
    )
    if rotary_dim >= 4 and m != 0:  # r = 2: both layouts pair (0, 1)
        assert not np.allclose(r_half, r_int, rtol=0, atol=1e-12), "layouts must differ without P"


# --------------------------------------------------------------------------- apply_rope itself


@FAST
@given(case=cases(max_position=2**31))
def test_inverse_restores_input(case):
    kw = {"layout": case.layout, **case.kwargs}
    y = apply_rope(case.x, case.positions, **kw)
    # phi(-m) = -phi(m) exactly, so the round trip costs a few eps at any position
    assert_matches(apply_rope(y, -case.positions, **kw), case.x, x=case.x, tol=16 * EPS, what="f(f(x, m), -m) vs x")
    assert_matches(
        pair_norms(y, layout=case.layout, rotary_dim=case.rotary_dim),
        pair_norms(case.x, layout=case.layout, rotary_dim=case.rotary_dim),
        x=case.x,
        tol=16 * EPS,
        what="pair norms",
    )
    if np.any(case.positions != 0):
        assert_differs(apply_rope(y, case.positions, **kw), case.x, x=case.x, tol=16 * EPS, what="f(f(x, m), m) vs x")


@FAST
@given(case=cases(partial_rotary=True))
def test_partial_rotary_leaves_tail_unchanged(case):
    r = case.rotary_dim
    outputs = {"apply_rope": apply_rope(case.x, case.positions, layout=case.layout, **case.kwargs)}
    outputs.update({name: form(case.x, case.positions[..., None], **case.kwargs) for name, (form, _) in FORMS.items()})
    for name, y in outputs.items():
        np.testing.assert_array_equal(y[..., r:], case.x[..., r:], err_msg=f"{name} changed pass-through features")
    # the check can fail: rotating all features (r = head_dim, when even) moves the tail
    d = case.x.shape[-1]
    if d % 2 == 0 and np.any(case.positions != 0):
        full = apply_rope(case.x, case.positions, layout="interleaved", base=case.base)
        assert not np.array_equal(full[..., r:], case.x[..., r:])


CALLS = {
    "apply_rope": lambda x, **kw: apply_rope(x, np.zeros(x.shape[0], dtype=np.int64), **kw),
    "apply_rope_mpmath": lambda x, **kw: apply_rope_mpmath(x, np.zeros(x.shape[0], dtype=np.int64), **kw),
    "rope_matrix_form": lambda x, **kw: rope_matrix_form(x, 0, **kw),
    "rotation_matrix": lambda x, **kw: rotation_matrix(0, x.shape[-1], **kw),
    "rotation_matrix_expm": lambda x, **kw: rotation_matrix_expm(0, x.shape[-1], **kw),
    "generator": lambda x, **kw: generator(x.shape[-1], **kw),
}
LAYOUT_FREE = {
    "rope_complex_form": rope_complex_form,
    "rope_elementwise_form": rope_elementwise_form,
    "rope_rotate_half_form": rope_rotate_half_form,
}
BAD = {
    "unknown layout": {"layout": "neox"},
    "odd rotary_dim": {"rotary_dim": 5},
    "rotary_dim > head_dim": {"rotary_dim": 10},
}


@pytest.mark.parametrize(
    "call, bad",
    [(c, b) for c in [*CALLS, *LAYOUT_FREE] for b in BAD if not (c in LAYOUT_FREE and b == "unknown layout")],
)
def test_invalid_arguments_raise_value_error(call, bad):
    x = np.ones((1, 8))
    kw = {"layout": "interleaved", **BAD[bad]}
    if call in LAYOUT_FREE:
        fn = partial(LAYOUT_FREE[call], m=0)
        kw.pop("layout")
    else:
        fn = CALLS[call]
    with pytest.raises(ValueError):
        fn(x, **kw)


# --------------------------------------------------------------------------- the reference's own accuracy (mpmath)


def reference_error_bound(x, positions, *, layout: str, rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """Per-feature bound on |apply_rope - exact| for the float64 reference.

    The angle fl(fl(theta_i) m) is off by <= |m| theta_i (eps + eps/2) (theta from np.power
    within one ulp, one product rounding); cos, sin and the pair arithmetic add a few eps.  Both
    features of a pair are bounded by |pair| (2 eps |m| theta_i + 4 eps).
    """
    phi = np.abs(angles(positions, inv_freq(rotary_dim, base)))  # |m| theta_i
    phi = phi.reshape(positions.shape + (1,) * (x.ndim - 1 - positions.ndim) + phi.shape[-1:])
    per_pair = pair_norms(x, layout=layout, rotary_dim=rotary_dim) * (2 * EPS * phi + 4 * EPS)
    bound = np.full(x.shape, 4 * EPS) * np.abs(x)  # pass-through: exact
    first, second = pair_indices(rotary_dim, layout)
    bound[..., first] = per_pair
    bound[..., second] = per_pair
    return bound


LARGE = [2**20, 2**20 + 1, 2**22 + 12345, 2**24 - 1, 2**24, -(2**24)]


def _unit(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@FAST
@given(
    extra=st.lists(st.integers(2**20, 2**24), min_size=2, max_size=2),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32 - 1),
)
def test_apply_rope_within_error_model_of_mpmath_at_large_positions(extra, layout, seed):
    positions = np.array([LARGE + extra])  # (1, 8)
    x = _unit((1, positions.shape[1], 2, 32), seed)
    exact = apply_rope_mpmath(x, positions, layout=layout)
    y = apply_rope(x, positions, layout=layout)
    bound = reference_error_bound(x, positions, layout=layout, rotary_dim=32)
    excess = np.abs(y - exact) / bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 1, (
        f"|y - exact| = {abs(y - exact)[worst]:.3g} at {worst} exceeds the model bound {bound[worst]:.3g}"
    )
    # far below what a float32-angle implementation can reach at these positions (ulp(2^24) = 2 in float32)
    assert np.abs(y - exact).max() < 1e-8
    # the check can fail: an off-by-one position, or theta rounded to float32
    assert np.any(np.abs(apply_rope(x, positions + 1, layout=layout) - exact) > bound)
    theta32 = inv_freq(32).astype(np.float32).astype(np.float64)
    assert np.any(np.abs(apply_rope(x, positions, layout=layout, theta=theta32) - exact) > bound)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_within_1e_12_of_mpmath_at_small_positions(layout):
    """|m| <= 2^12: the angle error |m| theta eps stays below 1e-12 for unit-norm x."""
    positions = np.array([[0, 1, 2, 3, 1000, 4095, 4096, -4096]])
    x = _unit((1, 8, 2, 64), 7)
    exact = apply_rope_mpmath(x, positions, layout=layout, rotary_dim=48)
    y = apply_rope(x, positions, layout=layout, rotary_dim=48)
    assert_matches(y, exact, x=x, tol=1e-12, what="apply_rope vs mpmath, |m| <= 2^12")
    assert_differs(
        apply_rope(x, positions, layout=layout, rotary_dim=48, base=10001.0),
        exact,
        x=x,
        tol=1e-12,
        what="base 10001 vs mpmath",
    )


def test_mpmath_theta_override_isolates_the_product_rounding():
    """With theta given exactly (the float64 values), only fl(m theta) separates the two: <= |m theta| eps/2."""
    positions = np.array([[2**24, 2**24 - 1, 2**20 + 1]])
    x = _unit((1, 3, 1, 16), 3)
    theta = inv_freq(16)
    exact = apply_rope_mpmath(x, positions, layout="half", theta=theta)
    y = apply_rope(x, positions, layout="half", theta=theta)
    # a power-of-two position makes the product exact: agreement to the last few bits
    assert_matches(y[:, :1], exact[:, :1], x=x[:, :1], tol=8 * EPS, what="m = 2^24, exact theta")
    assert_matches(y, exact, x=x, tol=EPS * 2**24, what="fl(m theta) rounding")


# --------------------------------------------------------------------------- sympy


def test_symbolic_block_relativity():
    assert symbolic.block_relativity_residual().is_zero_matrix


def test_symbolic_block_diagonal_relativity():
    residual = symbolic.block_diagonal_relativity_residual(3)
    assert residual.shape == (6, 6)
    assert residual.is_zero_matrix


def test_symbolic_exponential_of_generator():
    assert symbolic.exponential_residual().is_zero_matrix


def test_symbolic_simplification_rejects_wrong_identities():
    rot, t, m, n = symbolic.rotation_block, symbolic.theta, symbolic.m, symbolic.n
    wrong_sign = symbolic.simplify_trig(rot(t, m).T * rot(t, n) - rot(t, m - n))
    no_transpose = symbolic.simplify_trig(rot(t, m) * rot(t, n) - rot(t, n - m))
    assert not wrong_sign.is_zero_matrix
    assert not no_transpose.is_zero_matrix


# --------------------------------------------------------------------------- sinusoidal negative control


def test_sinusoidal_encoding_matches_formula():
    d, base = 10, 10000.0
    positions = np.array([0, 1, 5, 999, 2**20])
    p = sinusoidal_encoding(positions, d, base)
    assert p.shape == (5, d)
    for row, k in enumerate(positions.tolist()):
        for i in range(d // 2):
            w = k / base ** (2 * i / d)
            tol = 4 * EPS * (1 + abs(w))
            assert abs(p[row, 2 * i] - math.sin(w)) <= tol, (k, i)
            assert abs(p[row, 2 * i + 1] - math.cos(w)) <= tol, (k, i)
    with pytest.raises(ValueError):
        sinusoidal_encoding(positions, 7)


def test_sinusoidal_is_rejected_by_rotation_properties():
    """Additive encoding: not identity at 0, not norm-preserving, not relative; RoPE passes the same checks."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 6, 2, 16))
    q, k = x[:, :3], x[:, 3:]
    m, n, c = np.array([[0, 7, 300]]), np.array([[4, 2, 50]]), 1234
    for name, f, is_rotation in [
        ("rope", partial(apply_rope, layout="interleaved"), True),
        ("sinusoidal", apply_sinusoidal, False),
    ]:
        norm_change = np.abs(
            np.linalg.norm(f(x, np.array([[0, 1, 2, 3, 1000, 2**20]])), axis=-1) - np.linalg.norm(x, axis=-1)
        ).max()
        identity_at_0 = np.allclose(f(x, np.zeros((1, 6), dtype=np.int64)), x, rtol=0, atol=1e-12)
        scores = np.einsum("bshd,bshd->bsh", f(q, m), f(k, n))
        shifted = np.einsum("bshd,bshd->bsh", f(q, m + c), f(k, n + c))
        relative = np.allclose(scores, shifted, rtol=0, atol=1e-9)
        if is_rotation:
            assert norm_change < 1e-12 and identity_at_0 and relative, name
        else:
            assert norm_change > 1e-2, f"{name}: norm change {norm_change:.3g}"
            assert not identity_at_0, name
            assert not relative, name
