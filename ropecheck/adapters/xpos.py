"""xPos adapters (``ropecheck check NAME``, family ``xpos``): each library's own xPos call
brought to ``xpos(q, k, positions) -> (q_out, k_out)`` (``properties.xpos_checks``).

What the libraries compute (read from their code, rotary-embedding-torch 0.9.1 and
x-transformers 2.31.10): both pair features interleaved (2i, 2i+1), take theta_i =
1/10000^(2i/d) and zeta_i = (2i + 0.4 d)/(1.4 d) (the paper's, gamma 0.4) in float32, scale
q by zeta^p and k by zeta^-p (a float32 pow, then ``** -1``), and rotate in float32 for
bfloat16 input (the float32 cos/sin promote the product); they differ in:

- rotary-embedding-torch ``RotaryEmbedding(d, use_xpos=True).rotate_queries_and_keys(q, k)``
  takes no positions and no offset: it uses 0 .. seq_len-1, built as ``arange`` in *q's
  dtype*, centres on seq_len // 2 (p = (t - seq_len // 2)/s, in q's dtype), rounds the scale to
  q's dtype and keeps a float32 cache of angles and scales (8192 positions) that a shorter
  later call slices. The adapter therefore only calls it with consecutive positions: it
  places each token at its position in a zero sequence of length max(positions) + 1 (a token
  that repeats a position in its row goes to a further copy of the row), calls the library
  once, and reads each token back from its position. One module per (head_dim, dtype), as a
  model keeps its own, caches on.
- x-transformers ``RotaryEmbedding(d, use_xpos=True, scale_base=s)(positions)`` takes
  positions (batch, seq) and returns float32 angles and scales centred on
  (max position + 1) // 2 of the call (all rows); ``apply_rotary_pos_emb(t, freqs, scale)``
  with t (batch, heads, seq, dim), the key with ``scale ** -1``, as its Attention does.
"""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, per_head_dim, register
from ropecheck.reference.relatives import XPOS_SCALE_BASE

SCALE_BASE = int(XPOS_SCALE_BASE)


def _slots(positions):
    """(row, position) slot of each token in a zero sequence of length max + 1: a token whose
    position already occurs earlier in its row goes to a further copy of that row."""
    import torch

    seq = positions.shape[1]
    earlier = torch.ones(seq, seq, dtype=torch.bool).tril(-1)
    repeat = ((positions[:, :, None] == positions[:, None, :]) & earlier).sum(-1)  # (batch, seq)
    copies = int(repeat.max()) + 1
    rows = torch.arange(positions.shape[0])[:, None] * copies + repeat
    return rows, positions, copies


def build_rotary_embedding_torch():
    from rotary_embedding_torch import RotaryEmbedding

    module = per_head_dim(lambda key: RotaryEmbedding(key[0], use_xpos=True, xpos_scale_base=SCALE_BASE))

    def xpos(q, k, positions):
        rows, cols, copies = _slots(positions)
        length = int(positions.max()) + 1

        def spread(t):  # (batch, seq, h, d) -> (batch * copies, length, h, d), zeros between tokens
            full = t.new_zeros((t.shape[0] * copies, length) + tuple(t.shape[2:]))
            full[rows, cols] = t
            return full

        emb = module((q.shape[-1], q.dtype), q.device)
        q_out, k_out = emb.rotate_queries_and_keys(spread(q), spread(k), seq_dim=-3)
        return q_out[rows, cols], k_out[rows, cols]

    return xpos


def build_x_transformers():
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

    module = per_head_dim(lambda head_dim: RotaryEmbedding(head_dim, use_xpos=True, scale_base=SCALE_BASE))

    def xpos(q, k, positions):
        freqs, scale = module(q.shape[-1], q.device)(positions)  # (batch, seq, d) each, float32
        q_out = apply_rotary_pos_emb(q.transpose(1, 2), freqs, scale)
        k_out = apply_rotary_pos_emb(k.transpose(1, 2), freqs, scale**-1.0)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return xpos


register(
    Adapter(
        name="rotary-embedding-torch-xpos",
        library="rotary-embedding-torch",
        build=build_rotary_embedding_torch,
        convention=None,
        description="RotaryEmbedding(use_xpos=True).rotate_queries_and_keys (xPos: --family xpos)",
        modules=("rotary_embedding_torch",),
        install="pip install rotary-embedding-torch==0.9.1 torch==2.13.0",
        notes="xPos target: consecutive positions 0 .. max(positions) only (no offsets); "
        "tokens are read back from their positions",
        family="xpos",
        call="qk",
        implies={"layout": "interleaved"},
    )
)
register(
    Adapter(
        name="x-transformers-xpos",
        library="x-transformers",
        build=build_x_transformers,
        convention=None,
        description="RotaryEmbedding(use_xpos=True)(positions) + apply_rotary_pos_emb (xPos: --family xpos)",
        modules=("x_transformers",),
        install="pip install x-transformers==2.31.10 torch==2.13.0",
        notes="xPos target: xpos(q, k, positions) -> (q_out, k_out)",
        family="xpos",
        call="qk",
        implies={"layout": "interleaved"},
    )
)
