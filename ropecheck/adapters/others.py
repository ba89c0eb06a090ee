"""Adapters for torchtune, rotary-embedding-torch, x-transformers, megatron-core and timm.

Each brings the library's own call to ``rope(x, positions)``: x (batch, seq, heads,
head_dim), positions int64 (batch, seq) (megatron's thd path: the packed form
``rope(x, cu_seqlens, positions)``). Where a library takes only a start offset, the
adapter calls it once per token at that token's position (its own offset path), so any
positions can be checked."""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, import_bare, per_head_dim, register
from ropecheck.calling.roles import RankGroup
from ropecheck.properties.convention import Convention
from ropecheck.reference.scaling import Llama3


def _pin(package: str) -> str:
    return f"pip install {package} torch==2.13.0"


# --- torchtune ----------------------------------------------------------------------

TORCHTUNE_CACHE = 2**16
TORCHTUNE_INSTALL = "pip install torchtune==0.6.1 torchao==0.15.0 torch==2.13.0"


def _torchtune(class_path: str, **kwargs):
    """``module(x, input_pos=positions)``, its real call: x (b, s, n_h, h_d) as torchtune's
    attention passes it, input_pos (b, s), each row its own positions (its packed-samples
    path; it indexes its cos/sin cache with them)."""

    def build():
        import importlib

        module_name, _, class_name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module_name), class_name)
        module = per_head_dim(lambda head_dim: cls(dim=head_dim, max_seq_len=TORCHTUNE_CACHE, **kwargs))

        def rope(x, positions):
            return module(x.shape[-1], x.device)(x, input_pos=positions)

        return rope

    return build


register(
    Adapter(
        "torchtune-rope",
        "torchtune",
        _torchtune("torchtune.modules.RotaryPositionalEmbeddings"),
        Convention("interleaved", 10000.0),
        "RotaryPositionalEmbeddings(x, input_pos=...)",
        modules=("torchtune", "torchao"),
        install=TORCHTUNE_INSTALL,
        max_position=TORCHTUNE_CACHE - 1,
        notes=f"cos/sin cache of max_seq_len = {TORCHTUNE_CACHE} positions",
    )
)

register(
    Adapter(
        "torchtune-llama3-scaled",
        "torchtune",
        _torchtune("torchtune.models.llama3_1.Llama3ScaledRoPE", base=500000.0),
        Convention("interleaved", 500000.0, None, Llama3(8.0, 1.0, 4.0, 8192)),
        "Llama3ScaledRoPE (factor 8, low 1, high 4, old context 8192), input_pos",
        modules=("torchtune", "torchao"),
        install=TORCHTUNE_INSTALL,
        max_position=TORCHTUNE_CACHE - 1,
        notes=f"cos/sin cache of max_seq_len = {TORCHTUNE_CACHE} positions",
    )
)


# --- rotary-embedding-torch -----------------------------------------------------------


def _ret_module():
    from rotary_embedding_torch import RotaryEmbedding

    return per_head_dim(lambda head_dim: RotaryEmbedding(dim=head_dim, cache_if_possible=False))


def _ret_offsets():
    """``rotate_queries_or_keys(t, offset=m)`` once per token: positions are built by the
    library (arange + offset, in the input's dtype)."""

    def build():
        module = _ret_module()

        def rope(x, positions):
            import torch

            emb = module(x.shape[-1], x.device)
            rows = []
            for b in range(x.shape[0]):
                tokens = [
                    emb.rotate_queries_or_keys(x[b, t : t + 1].transpose(0, 1), offset=int(m)).transpose(0, 1)
                    for t, m in enumerate(positions[b].tolist())
                ]
                rows.append(torch.cat(tokens, dim=0))
            return torch.stack(rows)

        return rope

    return build


def _ret_explicit():
    """The explicit-positions path: ``freqs = emb(positions)`` (float32 positions) then
    ``apply_rotary_emb(freqs, t)``."""

    def build():
        import torch
        from rotary_embedding_torch import apply_rotary_emb

        module = _ret_module()

        def rope(x, positions):
            emb = module(x.shape[-1], x.device)
            rows = [
                apply_rotary_emb(emb(positions[b].to(torch.float32)), x[b].transpose(0, 1)).transpose(0, 1)
                for b in range(x.shape[0])
            ]
            return torch.stack(rows)

        return rope

    return build


for _name, _build, _what in (
    ("rotary-embedding-torch", _ret_offsets(), "RotaryEmbedding.rotate_queries_or_keys(t, offset=m) per token"),
    ("rotary-embedding-torch-positions", _ret_explicit(), "RotaryEmbedding(float32 positions) + apply_rotary_emb"),
):
    register(
        Adapter(
            _name,
            "rotary-embedding-torch",
            _build,
            Convention("interleaved", 10000.0),
            _what,
            modules=("rotary_embedding_torch",),
            install=_pin("rotary-embedding-torch==0.9.1"),
        )
    )


# --- x-transformers -------------------------------------------------------------------


def _x_transformers():
    def build():
        from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb

        module = per_head_dim(RotaryEmbedding)

        def rope(x, positions):
            freqs, scale = module(x.shape[-1], x.device)(positions)  # per-row positions (batch, seq)
            return apply_rotary_pos_emb(x.transpose(1, 2), freqs, scale).transpose(1, 2)

        return rope

    return build


register(
    Adapter(
        "x-transformers",
        "x-transformers",
        _x_transformers(),
        Convention("interleaved", 10000.0),
        "RotaryEmbedding(positions) + apply_rotary_pos_emb",
        modules=("x_transformers",),
        install=_pin("x-transformers==2.31.10"),
    )
)


# --- megatron-core --------------------------------------------------------------------


def _megatron(interleaved: bool, packed: bool = False):
    """Megatron's dispatcher ``apply_rotary_pos_emb(t, freqs, config, cu_seqlens=None)``
    with apply_rope_fusion off (the fused path needs Transformer Engine) and a one-rank
    context-parallel group. freqs are the angles as its ``get_emb`` forms them (outer
    product of the positions with ``RotaryEmbedding(use_cpu_initialization=True).inv_freq``,
    repeated per layout; ``get_emb`` itself moves inv_freq to CUDA). Not packed: t is sbhd,
    the engine's (batch, seq, heads, dim) tensor transposed as a view (an sbhd-stored x
    reaches it sbhd-contiguous), freqs (seq, batch, 1, dim). Packed: t (total, heads, dim)
    with cu_seqlens on its thd path, freqs (total, 1, 1, dim), one row per token (its
    exact-mapping mode: each sequence takes the rows of its own tokens)."""

    def build():
        import torch
        from megatron.core.models.common.embeddings import rope_utils
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            num_layers=1, hidden_size=64, num_attention_heads=4, apply_rope_fusion=False, rotary_interleaved=interleaved
        )
        module = per_head_dim(
            lambda head_dim: RotaryEmbedding(head_dim, 1.0, rotary_interleaved=interleaved, use_cpu_initialization=True)
        )

        def emb(positions, head_dim):
            inv_freq = module(head_dim).inv_freq
            freqs = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (..., r/2)
            if interleaved:
                return torch.stack((freqs, freqs), dim=-1).flatten(-2)
            return torch.cat((freqs, freqs), dim=-1)

        def rope(x, positions):
            freqs = emb(positions, x.shape[-1]).transpose(0, 1)[:, :, None, :]  # (s, b, 1, d)
            out = rope_utils.apply_rotary_pos_emb(x.transpose(0, 1), freqs, config, cp_group=RankGroup())
            return out.transpose(0, 1)

        def rope_packed(x, cu_seqlens, positions):
            freqs = emb(positions, x.shape[-1])[:, None, None, :]  # (total, 1, 1, d)
            return rope_utils.apply_rotary_pos_emb(x, freqs, config, cu_seqlens=cu_seqlens, cp_group=RankGroup())

        return rope_packed if packed else rope

    return build


for _name, _interleaved in (("megatron-core", False), ("megatron-core-interleaved", True)):
    _layout = "interleaved" if _interleaved else "half"
    _flag = " (rotary_interleaved)" if _interleaved else ""
    register(
        Adapter(
            _name,
            "megatron-core",
            _megatron(_interleaved),
            Convention(_layout, 10000.0),
            "apply_rotary_pos_emb(t, freqs, config) on sbhd t" + _flag,
            modules=("megatron.core",),
            install=_pin("megatron-core==0.16.1"),
            notes="unfused path (the fused one needs Transformer Engine); freqs formed "
            "as get_emb does (it moves inv_freq to CUDA)",
        )
    )
    register(
        Adapter(
            f"{_name}-packed",
            "megatron-core",
            _megatron(_interleaved, packed=True),
            Convention(_layout, 10000.0),
            "apply_rotary_pos_emb(t, freqs, config, cu_seqlens=) on packed thd t, one freqs row per token" + _flag,
            call="packed",
            modules=("megatron.core",),
            install=_pin("megatron-core==0.16.1"),
            notes="unfused thd path, one-rank context parallelism; freqs formed as get_emb does",
        )
    )


# --- timm -----------------------------------------------------------------------------


def import_timm_sincos():
    """timm.layers.pos_embed_sincos without ``import timm`` (which needs torchvision)."""
    return import_bare("timm.layers.pos_embed_sincos")


def _timm():
    """timm's 1-D pieces: ``freq_bands(dim/2... )`` in float32 and ``apply_rot_embed``."""

    def build():
        import torch

        sincos = import_timm_sincos()

        def rope(x, positions):
            bands = sincos.freq_bands(x.shape[-1], temperature=10000.0, step=2)
            phi = positions.to(torch.float32)[..., None] * bands  # (b, s, r/2)
            sin = phi.sin().repeat_interleave(2, -1)[:, :, None, :]
            cos = phi.cos().repeat_interleave(2, -1)[:, :, None, :]
            return sincos.apply_rot_embed(x, sin, cos)

        return rope

    return build


register(
    Adapter(
        "timm",
        "timm",
        _timm(),
        Convention("interleaved", 10000.0),
        "timm.layers.pos_embed_sincos freq_bands + apply_rot_embed (1-D)",
        modules=("timm",),
        install="pip install --no-deps timm==1.0.31",
        notes="`import timm` needs torchvision; the module is loaded on its own",
    )
)
