"""Vision encoders' 2-D RoPE as N-D targets (ropecheck/adapters/vision_nd.py): each adapter
passes the N-D checks in float32, and for each convention the module's own table misapplied
(axes exchanged, the other pairing, the grid's scale dropped, the axial declaration Pixtral
does not follow) fails the reference. In process, few examples."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import ropecheck
from ropecheck.adapters import ADAPTERS
from ropecheck.targets.target import Target

HAS = {lib: importlib.util.find_spec(lib) is not None for lib in ("transformers", "timm")}
NAMES = ["hf-pixtral-rope", "hf-qwen25vl-vision-rope", "timm-dinov3-rope", "timm-eva02-rope"]
QUICK = {"profile": "ci", "dtypes": ["float32"], "max_examples": 4}


def _needs(name):
    lib = ADAPTERS[name].library
    return pytest.mark.skipif(not HAS[lib], reason=f"{lib} is not installed")


def test_every_vision_module_has_an_adapter():
    from ropecheck.adapters import vision_nd

    assert sorted(n for n, a in ADAPTERS.items() if a.build.__module__ == vision_nd.__name__) == NAMES


@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in NAMES])
def test_adapter_passes(name):
    report = ropecheck.check(name, in_process=True, **QUICK)
    assert report.passed, report.summary()


# --- broken variants: the module's real table, misapplied ------------------------------------


def _axes_exchanged(name):
    """The adapter's module handed (w, h) for (h, w)."""

    def make():
        rope = _builder(name)()
        return lambda x, positions: rope(x, positions[..., [1, 0]])

    return make


def _qwen25vl_interleaved():
    """Qwen2.5-VL's cos, sin (half layout) applied with adjacent pairs (timm's ``rot``)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

    from ropecheck.adapters import vision_nd as v

    sincos = v.import_timm_sincos()
    config = m.Qwen2_5_VLVisionConfig(hidden_size=v.QWEN25VL_HIDDEN, num_heads=v.QWEN25VL_HEADS)
    module = m.Qwen2_5_VLVisionRotaryEmbedding(config)

    def rope(x, positions):
        cos, sin = module(x, positions.reshape(-1, 2))
        shape = (*x.shape[:2], 1, -1)
        return sincos.apply_rot_embed(x, sin.reshape(shape), cos.reshape(shape), half=False)

    return rope


def _eva02_without_ref_feat_shape():
    """EVA-02's grid table built without ``ref_feat_shape`` (cells turn by their index, not by
    16 / 32 of it)."""
    from ropecheck.adapters import vision_nd as v

    sincos = v.import_timm_sincos()
    module = v.eva_rope(
        "cat", v.EVA02_EMBED, v.EVA02_HEADS, feat_shape=list(v.EVA02_GRID), temperature=10000.0, in_pixels=False
    )

    def rope(x, positions):
        table = module.get_embed()[positions[..., 0] * v.EVA02_GRID[1] + positions[..., 1]]
        return sincos.apply_rot_embed_cat(x, table[:, :, None, :], half=False)

    return rope


def _dinov3_interleaved():
    """DINOv3's half-layout table applied with timm's interleaved ``rot()`` (timm PR #2692)."""
    from ropecheck.adapters import vision_nd as v

    sincos = v.import_timm_sincos()
    module = v.dinov3_module()

    def rope(x, positions):
        sin, cos = module._get_pos_embed_from_coords(positions.reshape(-1, 2))
        table = torch.cat([sin, cos], -1).reshape(*x.shape[:2], 1, -1)
        return sincos.apply_rot_embed_cat(x, table, half=False)

    return rope


def _builder(name):
    from ropecheck.adapters import vision_nd as v

    return {
        "hf-qwen25vl-vision-rope": v.build_qwen25vl_vision,
        "hf-pixtral-rope": v.build_pixtral,
        "timm-eva02-rope": v.build_eva02,
        "timm-dinov3-rope": v.build_dinov3,
    }[name]


# Pixtral's module judged against the axial declaration of Qwen2.5-VL's kind (h then w blocks,
# each axis' frequencies from 1): its w pairs are at the odd frequencies, so it fails.
PIXTRAL_AS_AXIAL = {"axes": 2, "layout": "half", "pair_span": "head", "split": [32, 32], "coord_range": ["0:63"]}

BROKEN = {  # what: (its builder, the adapter whose declaration it is checked against, other flags)
    "qwen2.5-vl h and w exchanged": (_axes_exchanged("hf-qwen25vl-vision-rope"), "hf-qwen25vl-vision-rope", None),
    "qwen2.5-vl table, adjacent pairs": (_qwen25vl_interleaved, "hf-qwen25vl-vision-rope", None),
    "pixtral h and w exchanged": (_axes_exchanged("hf-pixtral-rope"), "hf-pixtral-rope", None),
    "pixtral as axial blocks": (lambda: _builder("hf-pixtral-rope")(), "hf-pixtral-rope", PIXTRAL_AS_AXIAL),
    "eva02 without ref_feat_shape": (_eva02_without_ref_feat_shape, "timm-eva02-rope", None),
    "eva02 rows and columns exchanged": (_axes_exchanged("timm-eva02-rope"), "timm-eva02-rope", None),
    "dinov3 table, adjacent pairs": (_dinov3_interleaved, "timm-dinov3-rope", None),
    "dinov3 h and w exchanged": (_axes_exchanged("timm-dinov3-rope"), "timm-dinov3-rope", None),
}


@pytest.mark.parametrize("what", [pytest.param(w, marks=_needs(BROKEN[w][1])) for w in sorted(BROKEN)])
def test_a_misapplied_table_fails_the_reference(what):
    build, name, flags = BROKEN[what]
    adapter = ADAPTERS[name]
    family = "axial" if flags else adapter.family
    own = adapter.convention if family == "pairs" else None
    target = Target(what, build(), own, family=family, call=adapter.call, max_position=adapter.max_position)
    report = ropecheck.check(target, properties=["reference"], family=family, **(flags or adapter.implies), **QUICK)
    assert not report.passed and report.verdict == "failed", report.summary()


@pytest.mark.skipif(not HAS["timm"], reason="timm is not installed")
def test_dinov3_per_token_coordinates_are_its_grid_arithmetic():
    """The adapter's per-token path (``_get_pos_embed_from_coords``) gives the model's own grid
    table (``get_embed(shape)``) on the grid's coordinates, bit for bit."""
    from ropecheck.adapters import vision_nd as v

    sincos = v.import_timm_sincos()
    module = v.dinov3_module()
    coords = sincos.make_coords_dinov3(7, 12)
    sin, cos = module._get_pos_embed_from_coords(coords)
    assert torch.equal(torch.cat([sin, cos], -1), module.get_embed((7, 12)))
