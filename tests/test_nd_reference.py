"""N-D reference: pair rotation = expm of its generators; generator validation; relativity."""
import numpy as np
import pytest

from ropecheck.reference.nd import GeneratorError, apply_sum_rotation, axial, mrope, rotation_expm, validate_generators
from ropecheck.reference.rope import apply_rope


@pytest.mark.parametrize("conv", [axial(8, 2, layout="interleaved"), axial(12, 3, layout="half"),
                                  axial(10, 2, layout="half", split=[4, 6], base=[10000, 100]),
                                  mrope([1, 2, 1], layout="half"), mrope([2, 1, 1], layout="interleaved"),
                                  mrope([4, 2, 2], interleaved=True)])
def test_pairs_equal_expm_and_relativity(conv):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(conv.head_dim)
    for _ in range(3):
        p, q = rng.integers(-50, 50, conv.n_axes), rng.integers(-50, 50, conv.n_axes)
        r_p, r_q = rotation_expm(p, conv.generators()), rotation_expm(q, conv.generators())
        np.testing.assert_allclose(conv.apply(x[None, None, None], p[None, None])[0, 0, 0], r_p @ x, atol=1e-12)
        np.testing.assert_allclose(r_p.T @ r_q, rotation_expm(q - p, conv.generators()), atol=1e-10)


def test_axial_is_1d_rope_per_block_and_mrope_text_is_1d():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 1, 8))
    p = np.array([[[3, 5], [7, 11]]])
    y = axial(8, 2, layout="interleaved").apply(x, p)
    np.testing.assert_allclose(y[..., :4], apply_rope(x[..., :4], p[..., 0], layout="interleaved"))
    np.testing.assert_allclose(y[..., 4:], apply_rope(x[..., 4:], p[..., 1], layout="interleaved"))
    t = np.array([[[9, 9, 9], [4, 4, 4]]])  # text: (n, n, n) gives exactly 1-D RoPE (compatibility)
    x16 = rng.standard_normal((1, 2, 1, 16))
    np.testing.assert_allclose(mrope([2, 3, 3]).apply(x16, t), apply_rope(x16, t[..., 0], layout="half"))


def test_interleaved_mrope_assigns_pairs_round_robin():
    axis = mrope([24, 20, 20], interleaved=True).arrays[2]  # Qwen3-VL, head_dim 128
    assert np.bincount(axis).tolist() == [24, 20, 20]
    assert axis[:6].tolist() == [0, 1, 2, 0, 1, 2] and axis[60:].tolist() == [0, 0, 0, 0]
    # HF cuts a section that does not fit below d/2 (here w's third pair would be pair 8 of 8)
    assert np.bincount(mrope([2, 3, 3], interleaved=True).arrays[2]).tolist() == [3, 3, 2]
    # chunked and interleaved agree on text (t = h = w), differ on an image position
    x = np.random.default_rng(2).standard_normal((1, 1, 1, 16))
    text, image = np.array([[[5, 5, 5]]]), np.array([[[5, 1, 2]]])
    chunked, inter = mrope([4, 2, 2]), mrope([4, 2, 2], interleaved=True)
    np.testing.assert_allclose(chunked.apply(x, text), inter.apply(x, text), atol=1e-12)
    assert np.abs(chunked.apply(x, image) - inter.apply(x, image)).max() > 0.1


def test_generator_validation():
    b1 = np.zeros((3, 3)); b1[1, 0], b1[0, 1] = 1, -1
    b2 = np.zeros((3, 3)); b2[2, 1], b2[1, 2] = 1, -1
    with pytest.raises(GeneratorError, match="do not commute"):
        validate_generators([b1, b2])
    with pytest.raises(GeneratorError, match="not skew-symmetric"):
        validate_generators([b1 + np.eye(3)])
    # without validation the non-commuting pair breaks relativity, shown with expm
    r = lambda p: rotation_expm(p, [b1, b2], validate=False)
    assert not np.allclose(r([1, 2]).T @ r([3, 5]), r([2, 3]), atol=1e-6)


def test_sum_rotation_is_relative_but_lossy():
    x = np.random.default_rng(2).standard_normal((1, 1, 1, 8))
    a, b = apply_sum_rotation(x, np.array([[[3, 5]]])), apply_sum_rotation(x, np.array([[[4, 4]]]))
    np.testing.assert_allclose(a, b)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="even blocks"):
        axial(10, 3)
    with pytest.raises(ValueError, match="sections"):
        mrope([0, 0])
