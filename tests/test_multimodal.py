"""Multimodal position builders: the seed's formulas, and the builder checks on right and wrong builders."""
import pytest

from ropecheck.properties.builder_checks import BUILDER_PROPERTIES, family
from ropecheck.targets.target import Target
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.reference import multimodal as mm

SEQ = [("text", 3), ("image", 2, 3), ("text", 2)]  # L = 2, h = 2, w = 3


def test_rope_tie_seed_example():
    p = mm.rope_tie_positions(SEQ)
    assert p[:3].tolist() == [[0, 0], [1, 1], [2, 2]]
    assert p[3].tolist() == [2 + 4, 2 + 3] and p[8].tolist() == [2 + 2 * 4, 2 + 3 * 3]  # (L + i(w+1), L + j(h+1))
    assert p[9].tolist() == [2 + 4 * 3] * 2  # L + (w+1)(h+1)


def test_rope_tv_equivalence_symmetry_and_half_integers():
    p = mm.rope_tv_positions(SEQ)
    assert p[9].tolist() == [2 + 6 + 1] * 2  # L + wh + 1
    assert (p[3] - p[2]).tolist() == (p[9] - p[8]).tolist()  # symmetry
    assert p[3].tolist() == [2 + (6 - 2) / 2 + 1, 2 + (6 - 3) / 2 + 1]  # beta + 1, beta2 half-integer
    v = mm.rope_tv_positions([("text", 1), ("video", 2, 1, 3), ("text", 1)], n_axes=3)
    assert v[-1].tolist() == [0 + 6 + 1] * 3 and (v[1] - v[0]).tolist() == (v[-1] - v[-2]).tolist()


def test_qwen2vl_rope_index_semantics():
    p = mm.qwen2vl_positions([("text", 2), ("video", 3, 1, 2), ("text", 1)])
    assert p[2].tolist() == [2, 2, 2] and p[3].tolist() == [2, 2, 3] and p[4].tolist() == [3, 2, 2]
    assert p[-1].tolist() == [5, 5, 5]  # max (t = 4) + 1
    assert mm.qwen2vl_positions([("text", 4)]).tolist() == mm.flat_positions([("text", 4)], 3).tolist()


def test_bad_segments():
    with pytest.raises(mm.SegmentError):
        mm.rope_tie_positions([("image", 0, 2)])
    with pytest.raises(mm.SegmentError):
        mm.rope_tie_positions([("video", 1, 1, 1)])


def _nudge_media_column(segments, p):
    """RoPE-TV with beta2 off by a half: every patch's column position + 0.5."""
    p = p.copy()
    for kind, a, b in mm.media_spans(segments):
        if kind != "text":
            p[a:b, 1] += 0.5
    return p


def _shift_text_after_media(segments, p):
    p = p.copy()
    spans = mm.media_spans(segments)
    for k, (kind, a, b) in enumerate(spans):
        if kind != "text" and k + 1 < len(spans):
            p[b:] += 1
            break
    return p


@pytest.mark.parametrize("name,fam,good,bad,catches", [
    ("rope-tie", ("rope-tie",), mm.rope_tie_positions, lambda s: _shift_text_after_media(s, mm.rope_tie_positions(s)),
     "text-after-media"),
    ("rope-tv", ("rope-tv",), mm.rope_tv_positions, lambda s: _nudge_media_column(s, mm.rope_tv_positions(s)), "symmetry"),
    ("mrope", ("mrope",), mm.qwen2vl_positions, lambda s: _shift_text_after_media(s, mm.qwen2vl_positions(s)),
     "text-after-media"),
])
def test_builder_checks_pass_good_and_catch_bad(name, fam, good, bad, catches):
    f, options = family(*fam), RunOptions(profile="ci")
    right, wrong = (Target(name, fn, f, family=f"{f.name}-builder", call="segments", dtypes=("-",), backward=False,
                           n_axes=f.n_axes) for fn in (good, bad))
    for prop in BUILDER_PROPERTIES.values():
        assert run_property(prop, right, "-", options).status in ("passed", "skipped")
    assert run_property(BUILDER_PROPERTIES[catches], wrong, "-", options).status == "failed"
    assert run_property(BUILDER_PROPERTIES["reference"], wrong, "-", options).status == "failed"
