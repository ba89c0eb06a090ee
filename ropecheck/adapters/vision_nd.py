"""Vision encoders' 2-D RoPE as N-D targets, each at its model's configuration: transformers'
Qwen2.5-VL vision tower and Pixtral (per-token (row, column) patch indices), timm's EVA-02
(a cached grid table with its ``ref_feat_shape`` scaling) and timm's DINOv3 port
(coordinates in [-1, 1]).

Each builds the library's own module as the model builds it and applies its table with the
function that model applies it with; nothing of the library is copied. Configurations:
transformers 5.23.0 and timm 1.0.31, each cited beside its constants. Position axis 0 is the
patch row (height), axis 1 the column (width).
"""

from __future__ import annotations

import math

from ropecheck.adapters.others import import_timm_sincos
from ropecheck.adapters.registry import Adapter, register
from ropecheck.reference.nd import from_table

HF_INSTALL = "pip install transformers==5.23.0 torch==2.13.0"
TIMM_INSTALL = "pip install --no-deps timm==1.0.31"

# --- the models' configurations --------------------------------------------------------------
# Qwen2.5-VL (Qwen/Qwen2.5-VL-7B-Instruct config.json, "vision_config"): hidden_size 1280,
# num_heads 16 -> head 80; Qwen2_5_VLVisionConfig's rope_parameters default: axial, theta 10000.
# Qwen2_5_VLVisionRotaryEmbedding: inv_freq over head / 2 = 40 features (20 frequencies), the
# h angles then the w angles, cat twice: rotate_half over the head, pairs (p, p + 40), p < 20
# turned by h, 20 <= p < 40 by w (--pair-span head --split 40,40).
QWEN25VL_HIDDEN, QWEN25VL_HEADS, QWEN25VL_THETA = 1280, 16, 10000.0
QWEN25VL_HEAD = QWEN25VL_HIDDEN // QWEN25VL_HEADS
# Pixtral-12B (PixtralVisionConfig defaults = mistral-community/pixtral-12b "vision_config"):
# hidden_size 1024, 16 heads -> head 64, rope theta 10000, image_size 1024, patch_size 16
# (64 patches per side). PixtralVisionRotaryEmbedding: inv_freq f_k = theta^(-2k/64), k < 32;
# h takes the even ones f_0, f_2, ..., w the odd ones f_1, f_3, ... (its
# ``cat([inv_freq[0::2], inv_freq[1::2]])`` and ``recomposition_frequencies``), cat twice:
# rotate_half over the head.
PIXTRAL_HIDDEN, PIXTRAL_HEADS, PIXTRAL_THETA = 1024, 16, 10000.0
PIXTRAL_HEAD = PIXTRAL_HIDDEN // PIXTRAL_HEADS
PIXTRAL_SIDE = 1024 // 16  # patches per side: positions 0 .. 63
# timm eva02_large_patch14_448 (timm/models/eva.py): img_size 448, patch_size 14 (a 32 x 32
# grid), embed_dim 1024, 16 heads (head 64), ref_feat_shape (16, 16), rope_type 'cat'
# (Eva: ``RotaryEmbeddingCat(in_pixels=False, temperature=10000, feat_shape=grid,
# ref_feat_shape, grid_offset=0, grid_indexing='ij', rotate_half=False)``): its cached table's
# cell (r, c) turns by (r, c) x 16 / 32.
EVA02_EMBED, EVA02_HEADS, EVA02_GRID, EVA02_REF = 1024, 16, (32, 32), (16, 16)
EVA02_HEAD = EVA02_EMBED // EVA02_HEADS
EVA02_SCALE = EVA02_REF[0] / EVA02_GRID[0]
# timm vit_large_patch16_dinov3 (timm/models/eva.py): embed_dim 1024, 16 heads (head 64),
# rope_type 'dinov3', rope_temperature 100, rope_rotate_half True; RotaryEmbeddingDinoV3's
# periods 100^(2j / 32), j < 16, angles 2 pi x / period, h's then w's, rotate_half over the head.
DINOV3_EMBED, DINOV3_HEADS, DINOV3_TEMPERATURE = 1024, 16, 100.0
DINOV3_HEAD = DINOV3_EMBED // DINOV3_HEADS


def _flat(positions):
    """(batch, seq, 2) -> (batch * seq, 2): the (N, 2) position_ids / coordinates the modules take."""
    if positions.shape[-1] != 2:
        raise ValueError(f"this 2-D target takes positions (batch, seq, 2), got {tuple(positions.shape)}")
    return positions.reshape(-1, 2)


# --- transformers ----------------------------------------------------------------------------


def build_qwen25vl_vision():
    """``Qwen2_5_VLVisionRotaryEmbedding(x, position_ids)`` -> cos, sin (N, 80) from (N, 2)
    (h, w) patch indices (what ``get_vision_position_ids`` gives the tower), applied with
    ``apply_rotary_pos_emb_vision(q, k, cos, sin)`` on (seq, heads, head_dim) as
    Qwen2_5_VLVisionAttention does (in float32, cast back)."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

    config = m.Qwen2_5_VLVisionConfig(hidden_size=QWEN25VL_HIDDEN, num_heads=QWEN25VL_HEADS)
    module = m.Qwen2_5_VLVisionRotaryEmbedding(config)

    def rope(x, positions):
        b, s = x.shape[:2]
        cos, sin = module.to(x.device)(x, _flat(positions))
        q = x.reshape(b * s, *x.shape[2:])
        out, _ = m.apply_rotary_pos_emb_vision(q, q, cos, sin)
        return out.reshape(x.shape)

    return rope


def pixtral_table(head_dim: int = PIXTRAL_HEAD, theta: float = PIXTRAL_THETA) -> dict:
    """Pixtral's rotation as a pair table (``--family pairs``): pair (p, p + head/2); the first
    head/4 pairs turn by h at the even frequencies theta^(-2 (2i) / head), the next head/4 by w
    at the odd ones theta^(-2 (2i + 1) / head). No axial flag says this: an axis' frequencies
    are base^(-2j / split_a) from 1, and w's start at theta^(-2 / head)."""
    half, quarter = head_dim // 2, head_dim // 4
    pairs = [[i, i + half, 0, theta ** (-2 * (2 * i) / head_dim)] for i in range(quarter)]
    pairs += [[quarter + i, quarter + i + half, 1, theta ** (-2 * (2 * i + 1) / head_dim)] for i in range(quarter)]
    return {
        "heads": None,
        "head_dim": head_dim,
        "n_axes": 2,
        "pairs": pairs,
        "description": f"Pixtral: rotate_half over {head_dim}, h at the even frequencies, w at the odd",
    }


def build_pixtral():
    """``PixtralVisionRotaryEmbedding(x, position_ids)`` -> cos, sin (N, 64) in x's dtype from
    (N, 2) (h, w) patch indices (PixtralTransformer's meshgrid), applied per image as
    PixtralAttention does: ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=0)`` on
    (heads, patches, head_dim)."""
    import torch
    from transformers.models.pixtral import modeling_pixtral as m

    module = m.PixtralVisionRotaryEmbedding(m.PixtralVisionConfig())

    def rope(x, positions):
        rows = []
        for i in range(x.shape[0]):
            cos, sin = module.to(x.device)(x, positions[i])
            q = x[i].transpose(0, 1)  # (heads, seq, head_dim)
            out, _ = m.apply_rotary_pos_emb(q, q, cos, sin, unsqueeze_dim=0)
            rows.append(out.transpose(0, 1))
        return torch.stack(rows)

    return rope


# --- timm ------------------------------------------------------------------------------------


def eva_rope(rope_type: str, embed_dim: int, num_heads: int, **kwargs):
    """The rope module as timm's ``Eva.__init__`` builds it (``create_rope_embed``, with its
    grid_indexing 'ij' and grid_offset 0), in eval mode."""
    sincos = import_timm_sincos()
    module = sincos.create_rope_embed(
        rope_type=rope_type, dim=embed_dim, num_heads=num_heads, grid_indexing="ij", grid_offset=0.0, **kwargs
    )
    return module.eval()


def eva02_module():
    """EVA-02 L/448's: ``rope_type='cat'`` with ``in_pixels=False``, its grid and ref_feat_shape."""
    return eva_rope(
        "cat",
        EVA02_EMBED,
        EVA02_HEADS,
        feat_shape=list(EVA02_GRID),
        ref_feat_shape=list(EVA02_REF),
        temperature=10000.0,
        rotate_half=False,
        in_pixels=False,
    )


def build_eva02():
    """The model's cached table ``get_embed()`` (its 32 x 32 grid), each token picking the row
    of its cell (r, c), applied with ``apply_rot_embed_cat(q, rope, half=False)`` as
    EvaAttention does."""
    sincos = import_timm_sincos()
    module = eva02_module()

    def rope(x, positions):
        flat = _flat(positions)
        if int(flat.min()) < 0 or int(flat.max()) >= EVA02_GRID[0]:
            raise ValueError(f"EVA-02 L/448's grid holds rows and columns 0 .. {EVA02_GRID[0] - 1}")
        table = module.to(x.device).get_embed()  # (32 * 32, 2 * 64): sin | cos
        cells = positions[..., 0] * EVA02_GRID[1] + positions[..., 1]
        return sincos.apply_rot_embed_cat(x, table[cells][:, :, None, :], half=False)

    return rope


def dinov3_module():
    """DINOv3 L/16's: ``rope_type='dinov3'``, temperature 100, rotate_half (no fixed grid:
    dynamic_img_size)."""
    return eva_rope("dinov3", DINOV3_EMBED, DINOV3_HEADS, temperature=DINOV3_TEMPERATURE, rotate_half=True)


def build_dinov3():
    """RotaryEmbeddingDinoV3's sin, cos of per-token coordinates (its
    ``_get_pos_embed_from_coords``, the step after its grid: ``get_embed(shape)`` takes only
    the centred grid (i + 0.5) / H x 2 - 1), applied with ``apply_rot_embed_cat(q, rope,
    half=True)`` as EvaAttention does."""
    import torch

    sincos = import_timm_sincos()
    module = dinov3_module()

    def rope(x, positions):
        sin, cos = module.to(x.device)._get_pos_embed_from_coords(_flat(positions))
        table = torch.cat([sin, cos], -1).reshape(*x.shape[:2], 1, -1)
        return sincos.apply_rot_embed_cat(x, table, half=True)

    return rope


# --- the records -----------------------------------------------------------------------------

_RECORDS = (  # name, library, build, convention, description, notes, family, implies, max_position
    (
        "hf-qwen25vl-vision-rope",
        "transformers",
        build_qwen25vl_vision,
        None,
        "HF Qwen2_5_VLVisionRotaryEmbedding + apply_rotary_pos_emb_vision (Qwen2.5-VL vision tower: head 80, "
        "theta 10000)",
        "N-D target: positions (batch, seq, 2) = (h, w) patch indices, any value (per-token position_ids)",
        "axial",
        {"axes": 2, "layout": "half", "pair_span": "head", "split": [QWEN25VL_HEAD // 2] * 2},
        None,
    ),
    (
        "hf-pixtral-rope",
        "transformers",
        build_pixtral,
        from_table(pixtral_table(), "Pixtral's pair table"),
        "HF PixtralVisionRotaryEmbedding + apply_rotary_pos_emb (Pixtral-12B vision: head 64, theta 10000)",
        f"N-D target: positions (batch, seq, 2) = (h, w) patch indices 0 .. {PIXTRAL_SIDE - 1} (1024 / 16 "
        "patches per side); a pair table (--family pairs): h at the even frequencies, w at the odd, which no "
        "axial flag expresses",
        "pairs",
        {"coord_range": [f"0:{PIXTRAL_SIDE - 1}"]},
        None,
    ),
    (
        "timm-eva02-rope",
        "timm",
        build_eva02,
        None,
        "timm RotaryEmbeddingCat as eva02_large_patch14_448 builds it (32 x 32 grid, ref_feat_shape 16 x 16, "
        "head 64) + apply_rot_embed_cat",
        f"N-D target: positions (batch, seq, 2) = (row, column) of its {EVA02_GRID[0]} x {EVA02_GRID[1]} grid; "
        f"each turns by {EVA02_SCALE:g} x its index (ref_feat_shape / feat_shape)",
        "axial",
        {"axes": 2, "layout": "interleaved", "split": [EVA02_HEAD // 2] * 2, "coord_scale": [EVA02_SCALE]},
        EVA02_GRID[0] - 1,
    ),
    (
        "timm-dinov3-rope",
        "timm",
        build_dinov3,
        None,
        "timm RotaryEmbeddingDinoV3 as vit_large_patch16_dinov3 builds it (temperature 100, head 64, rotate_half) "
        "+ apply_rot_embed_cat",
        "N-D target: positions (batch, seq, 2) = float32 coordinates (h, w) in [-1, 1] (the model's centred grid, "
        "(i + 0.5) / H x 2 - 1, is such coordinates)",
        "axial",
        {
            "axes": 2,
            "layout": "half",
            "pair_span": "head",
            "split": [DINOV3_HEAD // 2] * 2,
            "base": DINOV3_TEMPERATURE,
            "positions": "float",
            "coord_range": ["-1:1"],
            "coord_scale": [2 * math.pi],
        },
        None,
    ),
)

for _name, _library, _build, _conv, _description, _notes, _family, _implies, _max in _RECORDS:
    register(
        Adapter(
            name=_name,
            library=_library,
            build=_build,
            convention=_conv,
            description=_description,
            modules=(_library,),
            install=HF_INSTALL if _library == "transformers" else TIMM_INSTALL,
            max_position=_max,
            notes=_notes,
            family=_family,
            implies=_implies,
        )
    )
