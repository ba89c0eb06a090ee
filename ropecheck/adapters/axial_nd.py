"""2-D RoPE of vision libraries as N-D targets: timm's rotary embedding classes and
rotary-embedding-torch's axial frequencies.

These libraries build their sin/cos for a whole image grid (H, W): row r, column c gets
the embedding of grid cell r * W + c. To judge them at arbitrary positions the adapters
build the library's own table for the smallest grid holding every position of the call
(H = largest row + 1, W = largest column + 1) and pick each token's row of it, as timm's
token-dropping path (``apply_keep_indices_nlc``) does. A grid grows with the square of the
largest position, so these targets declare ``max_position`` (511 per axis, a 512 x 512
grid): the checks then draw inputs up to 255 and shift them up to 511, past bfloat16's
exact integers (256).

Position axis 0 is the grid row (height), axis 1 the column (width). Schemes whose
positions are not integers (timm's default ``in_pixels=True`` and DINOv3 grids, and
rotary-embedding-torch ``freqs_for='pixel'``: coordinates spread over [-1, 1] by the grid
size) are not RoPE at integer positions and are not adapted here; timm's DINOv3 and EVA-02 at
their models' configurations, on coordinates, are in ``vision_nd``.
"""

from __future__ import annotations

from ropecheck.adapters.others import import_timm_sincos
from ropecheck.adapters.registry import Adapter, per_head_dim, register

GRID_MAX_POSITION = 511
MIXED_HEADS = 2  # the checks draw 1 or 2 heads; each head has its own mixed frequencies
TIMM_INSTALL = "pip install --no-deps timm==1.0.31"
RET_INSTALL = "pip install rotary-embedding-torch==0.9.1 torch==2.13.0"


def grid_cells(positions):
    """(grid shape [H, W], flat cell index (batch, seq)) for positions (batch, seq, 2)."""
    if positions.shape[-1] != 2:
        raise ValueError(f"this 2-D target takes positions (batch, seq, 2), got {tuple(positions.shape)}")
    if int(positions.min()) < 0:
        raise ValueError("grid positions must be >= 0")
    rows, cols = int(positions[..., 0].max()) + 1, int(positions[..., 1].max()) + 1
    return [rows, cols], positions[..., 0] * cols + positions[..., 1]


# --- timm ---------------------------------------------------------------------------


def build_timm_cat():
    """``RotaryEmbeddingCat(in_pixels=False)`` (EVA-02's language-style bands, integer grid):
    axial, interleaved, base 10000, half of the head per axis."""
    sincos = import_timm_sincos()
    module = per_head_dim(lambda d: sincos.RotaryEmbeddingCat(d, in_pixels=False, temperature=10000.0).eval())

    def rope(x, positions):
        shape, cells = grid_cells(positions)
        table = module(x.shape[-1], x.device).get_embed(shape)  # (H W, 2 head_dim): sin | cos
        return sincos.apply_rot_embed_cat(x, table[cells][:, :, None, :])

    return rope


def build_timm_mixed():
    """``RotaryEmbeddingMixed`` (RoPE-Mixed, Heo et al. 2024): pair p turns by
    fx_p col + fy_p row with per-head frequencies, random at initialisation (seeded here):
    a commuting 2-D rotation with no fixed convention, judged by the spec-free checks."""
    import torch

    sincos = import_timm_sincos()

    def make(head_dim):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            module = sincos.RotaryEmbeddingMixed(head_dim * MIXED_HEADS, depth=1, num_heads=MIXED_HEADS)
        return module.eval().requires_grad_(False)

    module = per_head_dim(make)

    def rope(x, positions):
        if x.shape[2] > MIXED_HEADS:
            raise ValueError(f"this adapter has {MIXED_HEADS} heads of frequencies, x has {x.shape[2]}")
        shape, cells = grid_cells(positions)
        table = module(x.shape[-1], x.device).get_embed(shape)[0, : x.shape[2]]  # (heads, H W, 2 head_dim)
        return sincos.apply_rot_embed_cat(x, table[:, cells].permute(1, 2, 0, 3))

    return rope


# --- rotary-embedding-torch ---------------------------------------------------------


def _ret_module(**kwargs):
    from rotary_embedding_torch import RotaryEmbedding

    # two axes share the head: each gets head_dim / 2 features, i.e. dim = head_dim / 2
    return per_head_dim(lambda d: RotaryEmbedding(dim=d // 2, freqs_for="lang", **kwargs))


def build_ret_axial():
    """``RotaryEmbedding(freqs_for='lang').get_axial_freqs(H, W)`` + ``apply_rotary_emb``:
    axial, interleaved, base 10000."""
    from rotary_embedding_torch import apply_rotary_emb

    module = _ret_module()

    def rope(x, positions):
        shape, _ = grid_cells(positions)
        freqs = module(x.shape[-1], x.device).get_axial_freqs(*shape)  # (H, W, head_dim)
        return apply_rotary_emb(freqs[positions[..., 0], positions[..., 1]][:, :, None, :], x)

    return rope


def build_ret_axial_offsets():
    """The same, one token at a time through ``get_axial_freqs(1, 1, offsets=(row, col))``,
    the library's way to place a grid anywhere (default ``cache_if_possible=True``)."""
    import torch
    from rotary_embedding_torch import apply_rotary_emb

    module = _ret_module()

    def rope(x, positions):
        emb = module(x.shape[-1], x.device)
        rows = [emb.get_axial_freqs(1, 1, offsets=tuple(int(v) for v in p))[0, 0] for p in positions.reshape(-1, 2)]
        freqs = torch.stack(rows).reshape(*positions.shape[:2], 1, -1)
        return apply_rotary_emb(freqs, x)

    return rope


AXIAL_2D = {"axes": 2, "layout": "interleaved"}  # the --family axial parameters they imply

register(
    Adapter(
        name="timm-rope-cat",
        library="timm",
        build=build_timm_cat,
        convention=None,
        description="timm RotaryEmbeddingCat(in_pixels=False) + apply_rot_embed_cat (2-D axial)",
        modules=("timm",),
        install=TIMM_INSTALL,
        max_position=GRID_MAX_POSITION,
        notes="N-D target: positions (batch, seq, 2) = (row, column) on a grid",
        family="axial",
        implies=AXIAL_2D,
    )
)

register(
    Adapter(
        name="timm-rope-mixed",
        library="timm",
        build=build_timm_mixed,
        convention=None,
        description="timm RotaryEmbeddingMixed (RoPE-Mixed, seeded frequencies; spec-free 2-D)",
        modules=("timm",),
        install=TIMM_INSTALL,
        max_position=GRID_MAX_POSITION,
        notes="N-D target: positions (batch, seq, 2); no reference (learnable frequencies)",
        family="nd",
        implies={"axes": 2},
    )
)

register(
    Adapter(
        name="rotary-embedding-torch-axial",
        library="rotary-embedding-torch",
        build=build_ret_axial,
        convention=None,
        description="rotary-embedding-torch get_axial_freqs(H, W) + apply_rotary_emb (2-D axial, freqs_for='lang')",
        modules=("rotary_embedding_torch",),
        install=RET_INSTALL,
        max_position=GRID_MAX_POSITION,
        notes="N-D target: positions (batch, seq, 2) on a grid",
        family="axial",
        implies=AXIAL_2D,
    )
)

register(
    Adapter(
        name="rotary-embedding-torch-axial-offsets",
        library="rotary-embedding-torch",
        build=build_ret_axial_offsets,
        convention=None,
        description="rotary-embedding-torch get_axial_freqs(1, 1, offsets=(row, col)) per token (2-D axial)",
        modules=("rotary_embedding_torch",),
        install=RET_INSTALL,
        max_position=GRID_MAX_POSITION,
        notes="N-D target: positions (batch, seq, 2), the offsets path",
        family="axial",
        implies=AXIAL_2D,
    )
)
