"""diffusers' image and video RoPE modules as N-D targets (ropecheck/adapters/diffusers_nd.py):
each adapter passes the N-D checks in float32, and for each convention the module's own
table misapplied (the other pairing, axes exchanged, a coordinate scale dropped, the grid not
centred, a rotation across heads applied per head) fails the reference. In process, few
examples: diffusers takes seconds to import, once."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import ropecheck
from ropecheck.adapters import ADAPTERS
from ropecheck.targets.target import Target

pytestmark = pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="diffusers is not installed")

NAMES = sorted(name for name, a in ADAPTERS.items() if a.library == "diffusers")
QUICK = {"profile": "ci", "dtypes": ["float32"], "max_examples": 4}


def test_every_diffusers_module_has_an_adapter():
    assert NAMES == [
        "diffusers-apply-rotary-emb",
        "diffusers-apply-rotary-emb-half",
        "diffusers-cogvideox-rope",
        "diffusers-cogvideox15-rope",
        "diffusers-cosmos-rope",
        "diffusers-flux-rope",
        "diffusers-flux2-rope",
        "diffusers-hunyuan-video-rope",
        "diffusers-ltx-video-rope",
        "diffusers-qwenimage-rope",
        "diffusers-wan-rope",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_adapter_passes(name):
    report = ropecheck.check(name, in_process=True, **QUICK)
    assert report.passed, report.summary()


# --- broken variants: the module's real table, misapplied ------------------------------------


def _flux_other_unbind():
    """Flux's interleaved table applied with the half-head rotation (use_real_unbind_dim=-2)."""
    from ropecheck.adapters import diffusers_nd as d

    embeddings = d._embeddings()
    module = d._import("transformer_flux").FluxPosEmbed(theta=10000, axes_dim=list(d.FLUX_AXES))

    def rope(x, positions):
        rows = [
            embeddings.apply_rotary_emb(x[i : i + 1], module(positions[i]), use_real_unbind_dim=-2, sequence_dim=1)
            for i in range(len(x))
        ]
        return torch.cat(rows)

    return rope


def _hunyuan_rows_and_columns_exchanged():
    from ropecheck.adapters.diffusers_nd import build_hunyuan_video

    rope = build_hunyuan_video()
    return lambda x, positions: rope(x, positions[..., [0, 2, 1]])


def _cosmos(**kwargs):
    """Cosmos' table applied with ``use_real_unbind_dim`` (default -1: adjacent pairs, not the
    model's -2) at ``fps`` (default the declared 30)."""
    from ropecheck.adapters import diffusers_nd as d

    embeddings = d._embeddings()
    module = d._import("transformer_cosmos").CosmosRotaryPosEmbed(
        hidden_size=d.COSMOS_HEAD, max_size=d.COSMOS_MAX_SIZE, patch_size=d.COSMOS_PATCH, rope_scale=d.COSMOS_SCALE
    )
    unbind, fps = kwargs.get("unbind", -1), kwargs.get("fps", d.COSMOS_FPS)

    def rope(x, positions):
        grid, cells = d.grid_cells(positions)
        cos, sin = module(d._latent(x, grid, d.COSMOS_PATCH), fps=fps)
        bhsd = x.transpose(1, 2)
        out = d._per_row(
            bhsd, cells, lambda xi, c: embeddings.apply_rotary_emb(xi, (cos[c], sin[c]), use_real_unbind_dim=unbind)
        )
        return out.transpose(1, 2)

    return rope


def _qwen_not_centred():
    """QwenEmbedRope without scale_rope (rows 0 .. H - 1) where the model centres its grid."""
    from ropecheck.adapters import diffusers_nd as d

    qwen = d._import("transformer_qwenimage")
    module = qwen.QwenEmbedRope(theta=10000, axes_dim=list(d.QWEN_AXES), scale_rope=False)

    def rope(x, positions):
        fhw, cells = d.qwen_cells(positions)
        freqs, _ = module([fhw], device=x.device, max_txt_seq_len=0)
        return d._per_row(x, cells, lambda xi, c: qwen.apply_rotary_emb_qwen(xi, freqs[c], use_real=False))

    return rope


def _ltx_per_head():
    """LTX's rotation of one head's 64 features applied to each head after the split."""
    from ropecheck.adapters import diffusers_nd as d

    ltx = d._import("transformer_ltx")
    module = ltx.LTXVideoRotaryPosEmbed(dim=d.LTX_HEAD_DIM, theta=d.LTX_THETA)

    def rope(x, positions):
        b, s, h, dim = x.shape
        heads = x.transpose(1, 2).reshape(b * h, s, dim)
        freqs = module(heads, video_coords=positions.repeat_interleave(h, 0).transpose(1, 2))
        return ltx.apply_rotary_emb(heads, freqs).reshape(b, h, s, dim).transpose(1, 2)

    return rope


def _apply_rotary_emb_unbind_ignored(x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
    from diffusers.models.embeddings import apply_rotary_emb

    return apply_rotary_emb(x, freqs_cis, use_real, -1, sequence_dim)


BROKEN = {  # name: (its builder, the adapter whose declaration it is checked against)
    "flux table, other unbind dim": (_flux_other_unbind, "diffusers-flux-rope"),
    "hunyuan rows and columns exchanged": (_hunyuan_rows_and_columns_exchanged, "diffusers-hunyuan-video-rope"),
    "cosmos table, adjacent pairs": (_cosmos, "diffusers-cosmos-rope"),
    "cosmos frames without the fps scale": (lambda: _cosmos(unbind=-2, fps=None), "diffusers-cosmos-rope"),
    "qwen-image grid not centred": (_qwen_not_centred, "diffusers-qwenimage-rope"),
    "ltx rotation per head": (_ltx_per_head, "diffusers-ltx-video-rope"),
    "apply_rotary_emb, unbind ignored": (lambda: _apply_rotary_emb_unbind_ignored, "diffusers-apply-rotary-emb-half"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_misapplied_table_fails_the_reference(what):
    build, name = BROKEN[what]
    adapter = ADAPTERS[name]
    own = adapter.convention if adapter.family == "pairs" else None
    target = Target(what, build(), own, family=adapter.family, call=adapter.call, max_position=adapter.max_position)
    report = ropecheck.check(target, properties=["reference"], family=adapter.family, **adapter.implies, **QUICK)
    assert not report.passed and report.verdict == "failed", report.summary()


def test_qwen_image_takes_its_centred_grid_negative_rows_and_columns():
    """The checks draw positions >= 0 (a grid target's token indices); the centred grid's
    negative rows and columns (-H/2 .. -1) against the float64 reference directly."""
    from ropecheck.adapters import diffusers_nd as d
    from ropecheck.reference.nd import axial

    rope = d.build_qwen_image()
    positions = torch.tensor([[[0, -7, 5], [2, 3, -11], [1, -1, -1], [0, 0, 0]]])
    x = torch.randn(1, 4, 2, 128, generator=torch.Generator().manual_seed(0))
    got = rope(x, positions).double().numpy()
    conv = axial(128, 3, layout="interleaved", split=list(d.QWEN_AXES))
    expected = conv.apply(x.double().numpy(), positions.numpy())
    assert np.abs(got - expected).max() < 1e-5
    assert np.abs(d.build_qwen_image()(x, positions[..., [0, 2, 1]]).double().numpy() - expected).max() > 0.1
