"""diffusers' image and video RoPE as N-D targets: each model's own position embedder
(FluxPosEmbed, Flux2PosEmbed, HunyuanVideoRotaryPosEmbed, WanRotaryPosEmbed, CogVideoX's
``get_3d_rotary_pos_embed``, QwenEmbedRope, LTXVideoRotaryPosEmbed, CosmosRotaryPosEmbed)
built at its model's configuration, its table applied with the function that model applies
it with; and diffusers' ``apply_rotary_emb`` itself through ``--api diffusers``.

Each configuration is the default of the model class in diffusers 0.42.1 (the
``__init__`` of ``FluxTransformer2DModel``, ``HunyuanVideoTransformer3DModel``, ... and the
line that builds its embedder), or the pipeline's argument where the model takes it from
the pipeline (CogVideoX, Cosmos' fps); each builder below says which. Nothing of the
library is copied: the adapters call it.

Flux, Flux 2 and LTX-Video take per-token coordinates (``ids``, ``video_coords``). The
others build their table for a whole (frames, rows, columns) grid from a shape: these
adapters build it for the smallest grid holding every position of the call and pick each
token's row (as ``axial_nd`` does for timm). Such a grid grows with the product of the three
largest positions, so these targets declare positions 0 .. 31 per axis (``GRID_MAX``: a
grid of at most 32768 tokens); the models themselves take any grid up to their tables
(Wan's ``rope_max_seq_len`` 1024, Cosmos' ``max_size`` 128 x 120 x 120, Qwen-Image 4096).
"""

from __future__ import annotations

import math

from ropecheck.adapters.registry import Adapter, register
from ropecheck.reference.nd import from_table

INSTALL = "pip install diffusers==0.42.1 torch==2.13.0"
GRID_MAX = 31  # largest position per axis of the grid-built tables (a grid of 32^3 tokens at most)
# Qwen-Image's centred grid (scale_rope): frames 0 .., rows and columns -h/2 .. h/2 - 1, within
# the same 32^3 cells (the declared range is the domain every checked position lies in)
QWEN_RANGES = ("0:15", "-16:15", "-16:15")
TRANSFORMERS = "diffusers.models.transformers."

# --- the models' configurations (diffusers 0.42.1 defaults, file by file) -------------------
# FluxTransformer2DModel: attention_head_dim 128, axes_dims_rope (16, 56, 56), and
# ``FluxPosEmbed(theta=10000, axes_dim=axes_dims_rope)`` (transformer_flux.py)
FLUX_AXES = (16, 56, 56)
# Flux2Transformer2DModel: attention_head_dim 128, axes_dims_rope (32, 32, 32, 32), rope_theta 2000
FLUX2_AXES, FLUX2_THETA = (32, 32, 32, 32), 2000
# HunyuanVideoTransformer3DModel: attention_head_dim 128, patch_size 2, patch_size_t 1,
# rope_theta 256.0, rope_axes_dim (16, 56, 56)
HUNYUAN_AXES, HUNYUAN_THETA, HUNYUAN_PATCH = (16, 56, 56), 256.0, (1, 2, 2)
# WanTransformer3DModel: attention_head_dim 128, patch_size (1, 2, 2), rope_max_seq_len 1024,
# ``WanRotaryPosEmbed(attention_head_dim, patch_size, rope_max_seq_len)`` (theta 10000); its
# split: h = w = 2 (128 // 6) = 42 features, t the rest, 44
WAN_HEAD, WAN_PATCH, WAN_MAX_SEQ = 128, (1, 2, 2), 1024
WAN_AXES = (WAN_HEAD - 4 * (WAN_HEAD // 6), 2 * (WAN_HEAD // 6), 2 * (WAN_HEAD // 6))
# CogVideoXTransformer3DModel: attention_head_dim 64; the pipeline's
# ``get_3d_rotary_pos_embed(embed_dim=attention_head_dim, ...)`` (theta 10000) splits it
# t = 64 // 4, h = w = 64 // 8 * 3
COGVIDEOX_HEAD = 64
COGVIDEOX_AXES = (COGVIDEOX_HEAD // 4, COGVIDEOX_HEAD // 8 * 3, COGVIDEOX_HEAD // 8 * 3)
# QwenImageTransformer2DModel: attention_head_dim 128, axes_dims_rope (16, 56, 56),
# ``QwenEmbedRope(theta=10000, axes_dim=list(axes_dims_rope), scale_rope=True)``
QWEN_AXES = (16, 56, 56)
# LTXVideoTransformer3DModel: 32 heads of 64, patch sizes 1, and
# ``LTXVideoRotaryPosEmbed(dim=inner_dim, base_num_frames=20, base_height=2048, base_width=2048,
# ..., theta=10000.0)`` over the 2048 features of a token before the head split
LTX_HEADS, LTX_HEAD_DIM, LTX_BASES, LTX_THETA = 32, 64, (20.0, 2048.0, 2048.0), 10000.0
# CosmosTransformer3DModel: attention_head_dim 128, max_size (128, 240, 240), patch_size (1, 2, 2),
# rope_scale (2.0, 1.0, 1.0) -> ``CosmosRotaryPosEmbed(hidden_size=attention_head_dim, ...)``;
# the text-to-world pipeline's fps 30 (pipeline_cosmos_text2world.py), base_fps 24
COSMOS_HEAD, COSMOS_MAX_SIZE, COSMOS_PATCH, COSMOS_SCALE = 128, (128, 240, 240), (1, 2, 2), (2.0, 1.0, 1.0)
COSMOS_FPS, COSMOS_BASE_FPS = 30, 24
COSMOS_AXES = (COSMOS_HEAD - 2 * (COSMOS_HEAD // 6 * 2), COSMOS_HEAD // 6 * 2, COSMOS_HEAD // 6 * 2)
# its NTK factors rope_scale_a ^ (dim_a / (dim_a - 2)) times 10000: the frame axis' base
COSMOS_BASES = tuple(10000.0 * s ** (d / (d - 2)) for s, d in zip(COSMOS_SCALE, COSMOS_AXES))


def _import(module: str):
    """A diffusers model file (``diffusers.models.transformers.<module>``)."""
    import importlib

    return importlib.import_module(TRANSFORMERS + module)


def _embeddings():
    from diffusers.models import embeddings

    return embeddings


def grid_cells(positions):
    """(grid shape [F, H, W], flat cell index (batch, seq)) for positions (batch, seq, 3) >= 0:
    the smallest grid holding them, laid out as the models lay their tokens out (the last axis
    fastest)."""
    if positions.shape[-1] != 3:
        raise ValueError(f"this 3-D target takes positions (batch, seq, 3), got {tuple(positions.shape)}")
    if int(positions.min()) < 0:
        raise ValueError("grid positions must be >= 0")
    f, h, w = (int(positions[..., a].max()) + 1 for a in range(3))
    return [f, h, w], (positions[..., 0] * h + positions[..., 1]) * w + positions[..., 2]


def _latent(x, grid, patch):
    """A (1, 1, frames, height, width) stand-in for the latent the embedders read the shape
    (and device) of: the grid times the patch size, no memory."""
    return x.new_zeros(()).expand(1, 1, *(n * p for n, p in zip(grid, patch)))


def _per_row(x, cells, apply):
    """apply(x[i:i+1], cells[i]) for each batch row (diffusers' tables are (seq, dim), one
    for the batch; rows of a check may hold different positions)."""
    import torch

    return torch.cat([apply(x[i : i + 1], cells[i]) for i in range(x.shape[0])])


# --- Flux, Flux 2: a table per token from its ids --------------------------------------------


def build_flux():
    """``FluxPosEmbed(ids)`` -> (cos, sin), applied as FluxAttnProcessor applies them:
    ``apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)`` on (B, S, H, D)."""
    embeddings = _embeddings()
    module = _import("transformer_flux").FluxPosEmbed(theta=10000, axes_dim=list(FLUX_AXES))

    def rope(x, positions):  # positions (b, s, 3): float ids
        import torch

        rows = [embeddings.apply_rotary_emb(x[i : i + 1], module(positions[i]), sequence_dim=1) for i in range(len(x))]
        return torch.cat(rows)

    return rope


def build_flux2():
    """``Flux2PosEmbed(ids)`` with 4 axes (T, H, W, L; the pipelines' int64 ids), applied with
    ``apply_rotary_emb(..., sequence_dim=1)`` as Flux2AttnProcessor."""
    embeddings = _embeddings()
    module = _import("transformer_flux2").Flux2PosEmbed(theta=FLUX2_THETA, axes_dim=list(FLUX2_AXES))

    def rope(x, positions):  # positions (b, s, 4) int64
        import torch

        rows = [embeddings.apply_rotary_emb(x[i : i + 1], module(positions[i]), sequence_dim=1) for i in range(len(x))]
        return torch.cat(rows)

    return rope


# --- tables built for a whole grid -----------------------------------------------------------


def build_hunyuan_video():
    """``HunyuanVideoRotaryPosEmbed(latent)`` for the grid -> (cos, sin) per cell, applied with
    ``apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)`` (HunyuanVideoAttnProcessor2_0)."""
    embeddings = _embeddings()
    module = _import("transformer_hunyuan_video").HunyuanVideoRotaryPosEmbed(
        HUNYUAN_PATCH[1], HUNYUAN_PATCH[0], list(HUNYUAN_AXES), HUNYUAN_THETA
    )

    def rope(x, positions):
        grid, cells = grid_cells(positions)
        cos, sin = module(_latent(x, grid, HUNYUAN_PATCH))
        return _per_row(x, cells, lambda xi, c: embeddings.apply_rotary_emb(xi, (cos[c], sin[c]), sequence_dim=1))

    return rope


def build_wan():
    """``WanRotaryPosEmbed(latent)`` -> cos, sin (1, cells, 1, D). Wan applies them with a
    function defined inside ``WanAttnProcessor.__call__`` (adjacent pairs, ``cos[..., 0::2]``,
    ``sin[..., 1::2]``), which cannot be called on its own: applied here with diffusers'
    ``apply_rotary_emb`` in the same layout (``use_real_unbind_dim=-1``, (B, S, H, D))."""
    embeddings = _embeddings()
    module = _import("transformer_wan").WanRotaryPosEmbed(WAN_HEAD, WAN_PATCH, WAN_MAX_SEQ)

    def rope(x, positions):
        grid, cells = grid_cells(positions)
        cos, sin = (t[0, :, 0] for t in module.to(x.device)(_latent(x, grid, WAN_PATCH)))
        return _per_row(
            x,
            cells,
            lambda xi, c: embeddings.apply_rotary_emb(xi, (cos[c], sin[c]), use_real_unbind_dim=-1, sequence_dim=1),
        )

    return rope


def _cogvideox(grid_type: str):
    """CogVideoX's ``get_3d_rotary_pos_embed`` as its pipeline calls it, applied as
    CogVideoXAttnProcessor2_0 does: ``apply_rotary_emb(query[:, :, text:], image_rotary_emb)``
    on (B, H, S, D) (sequence_dim 2, use_real_unbind_dim -1)."""
    embeddings = _embeddings()

    def rope(x, positions):
        (f, h, w), cells = grid_cells(positions)
        if grid_type == "linspace":  # CogVideoX 1.0 at its base resolution: the crop is the whole grid
            cos, sin = embeddings.get_3d_rotary_pos_embed(COGVIDEOX_HEAD, ((0, 0), (h, w)), (h, w), f, device=x.device)
        else:  # CogVideoX 1.5: arange grids cut from max_size (here the grid itself: the same rows)
            cos, sin = embeddings.get_3d_rotary_pos_embed(
                COGVIDEOX_HEAD, None, (h, w), f, grid_type="slice", max_size=(h, w), device=x.device
            )
        bhsd = x.transpose(1, 2)
        out = _per_row(bhsd, cells, lambda xi, c: embeddings.apply_rotary_emb(xi, (cos[c], sin[c])))
        return out.transpose(1, 2)

    return rope


def build_cogvideox():
    return _cogvideox("linspace")


def build_cogvideox15():
    return _cogvideox("slice")


def qwen_cells(positions):
    """(video_fhw (F, H, W), flat cell index) for QwenEmbedRope's centred grid (scale_rope):
    frames 0 .. F - 1, rows -(H/2) .. H/2 - 1, columns likewise (H, W even: the smallest
    centred grid holding the positions)."""
    if positions.shape[-1] != 3:
        raise ValueError(f"this 3-D target takes positions (batch, seq, 3), got {tuple(positions.shape)}")
    t, r, c = (positions[..., a] for a in range(3))
    if int(t.min()) < 0:
        raise ValueError("Qwen-Image's frame positions are >= 0 (the image index and its frames)")
    half_h = max(int(r.max()) + 1, -int(r.min()), 1)
    half_w = max(int(c.max()) + 1, -int(c.min()), 1)
    f, h, w = int(t.max()) + 1, 2 * half_h, 2 * half_w
    return (f, h, w), (t * h + r + half_h) * w + c + half_w


def build_qwen_image():
    """``QwenEmbedRope(video_fhw)`` -> complex freqs per cell of its centred grid, applied with
    ``apply_rotary_emb_qwen(query, img_freqs, use_real=False)`` on (B, S, H, D)."""
    qwen = _import("transformer_qwenimage")
    module = qwen.QwenEmbedRope(theta=10000, axes_dim=list(QWEN_AXES), scale_rope=True)

    def rope(x, positions):
        fhw, cells = qwen_cells(positions)
        freqs, _ = module([fhw], device=x.device, max_txt_seq_len=0)
        return _per_row(x, cells, lambda xi, c: qwen.apply_rotary_emb_qwen(xi, freqs[c], use_real=False))

    return rope


def build_cosmos():
    """``CosmosRotaryPosEmbed(latent, fps=30)`` -> cos, sin per cell (frames t / fps * 24,
    NTK bases), applied as CosmosAttnProcessor2_0: ``apply_rotary_emb(query, image_rotary_emb,
    use_real=True, use_real_unbind_dim=-2)`` on (B, H, S, D)."""
    embeddings = _embeddings()
    module = _import("transformer_cosmos").CosmosRotaryPosEmbed(
        hidden_size=COSMOS_HEAD, max_size=COSMOS_MAX_SIZE, patch_size=COSMOS_PATCH, rope_scale=COSMOS_SCALE
    )

    def rope(x, positions):
        grid, cells = grid_cells(positions)
        cos, sin = module(_latent(x, grid, COSMOS_PATCH), fps=COSMOS_FPS)
        bhsd = x.transpose(1, 2)
        out = _per_row(
            bhsd,
            cells,
            lambda xi, c: embeddings.apply_rotary_emb(xi, (cos[c], sin[c]), use_real=True, use_real_unbind_dim=-2),
        )
        return out.transpose(1, 2)

    return rope


# --- LTX-Video: per-token coordinates, one rotation over all heads --------------------------


def ltx_frequencies(dim: int = LTX_HEADS * LTX_HEAD_DIM) -> list:
    """The dim // 6 frequencies of LTXVideoRotaryPosEmbed in float64: theta ^ t for t evenly
    from 0 to 1, times pi / 2."""
    n = dim // 6
    return [LTX_THETA ** (k / (n - 1)) * math.pi / 2 for k in range(n)]


def ltx_table(heads: int = LTX_HEADS, head_dim: int = LTX_HEAD_DIM) -> dict:
    """The pair table of LTX-Video's rotation (``--family pairs``): pair k of the rotated ones
    turns by f_k (2 x_a / base_a - 1), a = k mod 3, x_a the ``video_coords`` of that axis: its
    frequency f_k applied to the coordinate scaled by 2 / base_a and offset by -1 (the
    ``coord_scale`` and ``coord_offset`` the record implies); the first (dim mod 6) / 2 pairs
    pass through."""
    dim = heads * head_dim
    freqs = ltx_frequencies(dim)
    pad = dim // 2 - 3 * len(freqs)
    pairs = [[2 * (pad + k), 2 * (pad + k) + 1, k % 3, freqs[k // 3]] for k in range(3 * len(freqs))]
    return {
        "heads": heads,
        "head_dim": head_dim,
        "n_axes": 3,
        "pairs": pairs,
        "description": f"LTX-Video: {len(pairs)} pairs over {heads} x {head_dim} features",
    }


def build_ltx():
    """``LTXVideoRotaryPosEmbed(x, video_coords=...)`` -> cos, sin over a token's 2048
    features, applied before the head split with transformer_ltx's own ``apply_rotary_emb``."""
    ltx = _import("transformer_ltx")
    module = ltx.LTXVideoRotaryPosEmbed(
        dim=LTX_HEADS * LTX_HEAD_DIM,
        base_num_frames=int(LTX_BASES[0]),
        base_height=int(LTX_BASES[1]),
        base_width=int(LTX_BASES[2]),
        patch_size=1,
        patch_size_t=1,
        theta=LTX_THETA,
    )

    def rope(x, positions):  # x (b, s, 32, 64), positions (b, s, 3): frames, pixels, pixels
        b, s, h, d = x.shape
        freqs = module(x, video_coords=positions.transpose(1, 2))
        return ltx.apply_rotary_emb(x.reshape(b, s, h * d), freqs).reshape(b, s, h, d)

    return rope


# --- diffusers' applier itself ---------------------------------------------------------------


def build_apply_rotary_emb():
    return _embeddings().apply_rotary_emb


# --- the records -----------------------------------------------------------------------------


def _axial(axes, base, **more) -> dict:
    """--family axial parameters: interleaved blocks per axis (what repeat_interleave'd tables
    and complex pairs give) unless ``more`` says otherwise."""
    implies = {"axes": len(axes), "split": list(axes), "layout": "interleaved"}
    implies.update({"nd_base": list(base)} if isinstance(base, tuple) else {"base": base})
    implies.update(more)
    return implies


GRID_NOTES = (
    f"N-D target: positions (batch, seq, 3) = (frame, row, column), 0 .. {GRID_MAX} (a table for the whole grid)"
)

_RECORDS = (
    (
        "diffusers-flux-rope",
        build_flux,
        "diffusers FluxPosEmbed(theta 10000, axes (16, 56, 56)) + apply_rotary_emb (Flux.1, head 128)",
        _axial(FLUX_AXES, 10000.0, positions="float", coord_range=["0:512"]),
        None,
        "N-D target: positions (batch, seq, 3) = float ids (index, row, column), any value",
    ),
    (
        "diffusers-flux2-rope",
        build_flux2,
        "diffusers Flux2PosEmbed(theta 2000, axes (32, 32, 32, 32)) + apply_rotary_emb (Flux.2, head 128)",
        _axial(FLUX2_AXES, float(FLUX2_THETA)),
        None,
        "N-D target: positions (batch, seq, 4) = int ids (T, H, W, L)",
    ),
    (
        "diffusers-hunyuan-video-rope",
        build_hunyuan_video,
        "diffusers HunyuanVideoRotaryPosEmbed(theta 256, axes (16, 56, 56)) + apply_rotary_emb (head 128)",
        _axial(HUNYUAN_AXES, HUNYUAN_THETA),
        GRID_MAX,
        GRID_NOTES,
    ),
    (
        "diffusers-wan-rope",
        build_wan,
        f"diffusers WanRotaryPosEmbed(head 128: axes {WAN_AXES}, theta 10000) applied as Wan's processor "
        "applies it (its own function is local to WanAttnProcessor: diffusers' apply_rotary_emb, the same layout)",
        _axial(WAN_AXES, 10000.0),
        GRID_MAX,
        GRID_NOTES + f"; its table holds {WAN_MAX_SEQ} per axis",
    ),
    (
        "diffusers-cogvideox-rope",
        build_cogvideox,
        f"diffusers get_3d_rotary_pos_embed (CogVideoX 1.0: linspace grid, head 64, axes {COGVIDEOX_AXES}) "
        "+ apply_rotary_emb on (B, H, S, D)",
        _axial(COGVIDEOX_AXES, 10000.0),
        GRID_MAX,
        GRID_NOTES + "; the crop region is the whole grid (the model's base resolution: integer coordinates)",
    ),
    (
        "diffusers-cogvideox15-rope",
        build_cogvideox15,
        f"diffusers get_3d_rotary_pos_embed (CogVideoX 1.5: grid_type 'slice', head 64, axes {COGVIDEOX_AXES}) "
        "+ apply_rotary_emb on (B, H, S, D)",
        _axial(COGVIDEOX_AXES, 10000.0),
        GRID_MAX,
        GRID_NOTES,
    ),
    (
        "diffusers-qwenimage-rope",
        build_qwen_image,
        "diffusers QwenEmbedRope(theta 10000, axes (16, 56, 56), scale_rope) + apply_rotary_emb_qwen "
        "(complex, head 128)",
        _axial(QWEN_AXES, 10000.0, coord_range=QWEN_RANGES),
        GRID_MAX,
        "N-D target: positions (batch, seq, 3) = (frame, row, column) in its centred grid's domain "
        f"{', '.join(QWEN_RANGES)} (frames from 0, rows and columns centred on 0)",
    ),
    (
        "diffusers-cosmos-rope",
        build_cosmos,
        f"diffusers CosmosRotaryPosEmbed(head 128, rope_scale (2, 1, 1), fps {COSMOS_FPS}) + apply_rotary_emb "
        "(unbind -2: pairs across the head)",
        _axial(
            COSMOS_AXES,
            COSMOS_BASES,
            layout="half",
            pair_span="head",
            coord_scale=[COSMOS_BASE_FPS / COSMOS_FPS, 1.0, 1.0],
        ),
        GRID_MAX,
        GRID_NOTES + f"; frames turn by t / {COSMOS_FPS} x {COSMOS_BASE_FPS}",
    ),
)

for _name, _build, _description, _implies, _max, _notes in _RECORDS:
    register(
        Adapter(
            name=_name,
            library="diffusers",
            build=_build,
            convention=None,
            description=_description,
            modules=("diffusers",),
            install=INSTALL,
            max_position=_max,
            notes=_notes,
            family="axial",
            implies=_implies,
        )
    )

register(
    Adapter(
        name="diffusers-ltx-video-rope",
        library="diffusers",
        build=build_ltx,
        convention=from_table(ltx_table(), "LTX-Video's pair table"),
        description="diffusers LTXVideoRotaryPosEmbed(video_coords) + transformer_ltx.apply_rotary_emb over a "
        "token's 32 x 64 features (before the head split)",
        modules=("diffusers",),
        install=INSTALL,
        notes="N-D target: x (batch, seq, 32, 64), positions (batch, seq, 3) = float video_coords (frames, "
        "pixels, pixels), any value; a pair table across heads (--family pairs)",
        family="pairs",
        implies={
            "positions": "float",
            "coord_range": ["0:20", "0:2048", "0:2048"],
            "coord_scale": [2 / b for b in LTX_BASES],
            "coord_offset": [-1.0],
        },
    )
)

for _name, _implies, _what in (
    ("diffusers-apply-rotary-emb", _axial(FLUX_AXES, 10000.0), "adjacent pairs (Flux's axes; unbind -1)"),
    (
        "diffusers-apply-rotary-emb-half",
        _axial(COSMOS_AXES, 10000.0, layout="half", pair_span="head"),
        "pairs half a head apart (Cosmos' split; unbind -2)",
    ),
):
    register(
        Adapter(
            name=_name,
            library="diffusers",
            build=build_apply_rotary_emb,
            convention=None,
            description=f"diffusers apply_rotary_emb(x, (cos, sin), use_real=True, ...) as the library itself, "
            f"through --api diffusers: {_what}",
            modules=("diffusers",),
            install=INSTALL,
            notes="its tables made by ropecheck from the declared rotation, x as (B, H, S, D) and (B, S, H, D)",
            family="axial",
            call="diffusers",
            implies=_implies,
        )
    )
