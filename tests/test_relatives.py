"""Relatives: references against independent forms, and each family's promises judged on a
correct and a deliberately broken variant."""
import numpy as np
import pytest

from ropecheck.properties.relative_checks import conforms, judge
from ropecheck.reference import relatives as rel
from ropecheck.reference.rope import apply_rope
from ropecheck.reference.sinusoidal import apply_sinusoidal


def _xpos_scores(q, k, pq, pk, broken=False):
    qq = rel.apply_xpos(q, pq, role="query")
    kk = rel.apply_xpos(k, pk, role="query" if broken else "key")  # broken: keys scaled like queries
    return qq @ kk.T


def _rope_scores(q, k, pq, pk):
    return apply_rope(q, pq, layout="half") @ apply_rope(k, pk, layout="half").T


def _sin_scores(q, k, pq, pk):
    return apply_sinusoidal(q, pq) @ apply_sinusoidal(k, pk).T


def test_xpos_zeta_and_seed_form():
    z = rel.xpos_zeta(8)
    np.testing.assert_allclose(z, [(2 * i / 8 + 0.4) / 1.4 for i in range(4)])
    np.testing.assert_allclose(rel.xpos_zeta(8, seed_form=True), [1.4 / (2 * n / 8 + 0.4) for n in range(1, 5)])


def test_families_keep_their_promises_and_broken_variants_fail():
    assert conforms("rope", {"relativity": _rope_scores, "norm": lambda x, p: apply_rope(x, p, layout="half")})
    xpos_enc = lambda x, p: rel.apply_xpos(x, p, role="query")
    assert conforms("xpos", {"relativity": _xpos_scores, "norm": xpos_enc})
    assert not conforms("xpos", {"relativity": lambda *a: _xpos_scores(*a, broken=True), "norm": xpos_enc})
    assert judge("sinusoidal", {"relativity": _sin_scores, "norm": apply_sinusoidal}) == {
        "norm": (False, True), "relativity": (False, True)}
    assert not conforms("sinusoidal", {"relativity": _rope_scores, "norm": lambda x, p: apply_rope(x, p, layout="half")})


def test_relative_biases():
    assert conforms("alibi", {"relative-bias": lambda a, b: rel.alibi_bias(a, b, 6)})
    assert not conforms("alibi", {"relative-bias": lambda a, b: rel.alibi_bias(a, b, 6) - 1e-3 * a[:, None]})
    table = np.random.default_rng(0).standard_normal((32, 2))
    for causal in (False, True):
        assert conforms("t5", {"relative-bias": lambda a, b: rel.t5_bias(a, b, table, bidirectional=not causal)})
    assert not conforms("t5", {"relative-bias": lambda a, b: table[rel.t5_bucket(b[None, :] - 0 * a[:, None]), 0]})
    d, rng = 8, np.random.default_rng(1)
    w, u, v = rng.standard_normal((d, d)), rng.standard_normal(d), rng.standard_normal(d)
    q, k = rng.standard_normal((8, d)), rng.standard_normal((8, d))
    assert conforms("transformer-xl", {"relative-bias": lambda a, b: rel.transformer_xl_scores(q, k, a, b, w, u, v)})
    assert not conforms("transformer-xl", {"relative-bias": lambda a, b: rel.transformer_xl_scores(q, k, a, 0 * b, w, u, v)})
    assert conforms("deberta", {"relative-bias": lambda a, b: rel.deberta_relative(a, b, 4)})
    assert not conforms("deberta", {"relative-bias": lambda a, b: np.clip(a[:, None] - b[None], -4, 3) + a[:, None] % 2})


def test_alibi_slopes_and_t5_buckets():
    np.testing.assert_allclose(rel.alibi_slopes(8), [2.0 ** -(i + 1) for i in range(8)])
    assert len(rel.alibi_slopes(12)) == 12 and rel.alibi_slopes(12)[8] == pytest.approx(2 ** -0.5)
    assert rel.t5_bucket(np.array([0, 1, -1, 200, -200])).tolist() == [0, 17, 1, 31, 15]
    assert rel.t5_bucket(np.array([0, 3, -3, -500]), bidirectional=False).tolist() == [0, 0, 3, 31]
    assert rel.deberta_relative(np.array([0]), np.array([10, 0, -10]), 4).tolist() == [[0, 4, 7]]


def test_linear_attention_forms_and_shift():
    impl = (rel.linear_attention_linear, rel.linear_attention_quadratic)
    assert conforms("linear-attention", {"linear-equals-quadratic": impl, "shift-invariance": impl})
    broken = lambda q, k, v, p: rel.linear_attention_linear(q, k, v, p + np.arange(len(p)) % 2)
    assert not conforms("linear-attention", {"linear-equals-quadratic": (broken, impl[1]), "shift-invariance": impl})


def test_decay_bound_decays():
    b = rel.decay_bound(np.array([0, 10, 100, 1000, 10000]))
    assert b[0] == pytest.approx(np.mean(np.arange(1, 65))) and all(np.diff(b) < 0)
