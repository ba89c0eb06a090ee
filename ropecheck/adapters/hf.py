"""HF transformers: Llama ``rotate_half`` with every rope type, Phi-3 LongRoPE, GPT-NeoX
partial rotary, GPT-J interleaved. Modules are built from config objects, never from the
hub; one rotary module per head size is kept for the whole run, as a model keeps its own
(so state that HF keeps between calls, dynamic NTK's cache, is exercised)."""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, per_head_dim, register
from ropecheck.properties.convention import Convention
from ropecheck.reference.scaling import DynamicNTK, Linear, Llama3, LongRoPE, Scaling, YaRN

INSTALL = "pip install transformers==5.23.0 torch==2.13.0"


def _rotary(config_class, rotary_class, rope_parameters, max_position_embeddings):
    """rotary(head_dim) -> HF rotary module whose cos/sin cover ``head_dim`` features."""

    def make(head_dim):
        config = config_class(
            hidden_size=4 * head_dim,
            num_attention_heads=4,
            head_dim=head_dim,
            max_position_embeddings=max_position_embeddings,
            rope_parameters=dict(rope_parameters),
        )
        return rotary_class(config)

    return per_head_dim(make)


def _hf_rotate_half(module, rope_parameters, max_position_embeddings=4096, rotary_dim=None, call="x"):
    """``<module>RotaryEmbedding(x, position_ids) -> cos, sin`` and
    ``apply_rotary_pos_emb(q, k, cos, sin)`` with q, k as (batch, heads, seq, head_dim), the
    transposed views HF's attention makes of its (batch, seq, heads, head_dim) projections.
    ``call="x"``: the canonical call, x as both q and k; ``call="qk"``: the engine's q and
    k (GQA: k has fewer heads, cos/sin broadcast over heads with unsqueeze_dim=1). With
    ``rotary_dim``, cos/sin cover only the first rotary_dim features (NeoX and Phi-3 pass
    the rest through)."""

    def build():
        import importlib

        import transformers

        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        prefix = {"llama": "Llama", "gpt_neox": "GPTNeoX", "phi3": "Phi3"}[module]
        config_class = getattr(transformers, f"{prefix}Config")
        rotary = _rotary(
            config_class, getattr(modeling, f"{prefix}RotaryEmbedding"), rope_parameters, max_position_embeddings
        )

        def rope_qk(q, k, positions):
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            cos, sin = rotary(rotary_dim or q.shape[-1], q.device)(q, positions)
            q_out, k_out = modeling.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
            return q_out.transpose(1, 2), k_out.transpose(1, 2)

        def rope(x, positions):
            q = x.transpose(1, 2)
            cos, sin = rotary(rotary_dim or x.shape[-1], x.device)(q, positions)
            out, _ = modeling.apply_rotary_pos_emb(q, q, cos, sin)
            return out.transpose(1, 2)

        return rope_qk if call == "qk" else rope

    return build


def _gptj(rotary_dim, table_length):
    """GPT-J: a sin/cos table of ``table_length`` positions gathered by position_ids,
    ``apply_rotary_pos_emb(tensor, sin, cos)`` (sin first) on the first rotary_dim features
    of (batch, seq, heads, head_dim); the result is cast back to x's dtype (GPT-J's own
    product promotes to the table's float32)."""

    def build():
        import torch
        from transformers.models.gptj import modeling_gptj as gptj

        table = gptj.create_sinusoidal_positions(table_length, rotary_dim)

        def rope(x, positions):
            sincos = table[positions]
            sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
            rot = gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
            return torch.cat((rot.to(x.dtype), x[..., rotary_dim:]), dim=-1)

        return rope

    return build


def _hf(name, build, convention, description, **capabilities):
    return register(
        Adapter(
            name=name,
            library="transformers",
            build=build,
            convention=convention,
            description=description,
            modules=("transformers",),
            install=INSTALL,
            **capabilities,
        )
    )


LLAMA_SCALINGS: dict[str, tuple[dict, Scaling, float]] = {
    "hf-llama": ({"rope_type": "default"}, Scaling(), 10000.0),
    "hf-llama-linear": ({"rope_type": "linear", "factor": 4.0}, Linear(4.0), 10000.0),
    "hf-llama-dynamic": ({"rope_type": "dynamic", "factor": 2.0}, DynamicNTK(2.0, 4096), 10000.0),
    "hf-llama-yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        YaRN(4.0, 1024),
        10000.0,
    ),
    "hf-llama-llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        Llama3(8.0, 1.0, 4.0, 8192),
        500000.0,
    ),
}

for _name, (_params, _scaling, _base) in LLAMA_SCALINGS.items():
    _hf(
        _name,
        _hf_rotate_half("llama", {"rope_theta": _base, **_params}),
        Convention("half", _base, None, _scaling),
        f"LlamaRotaryEmbedding ({_params['rope_type']}) + apply_rotary_pos_emb",
    )

_hf(
    "hf-llama-qk",
    _hf_rotate_half("llama", {"rope_theta": 10000.0, "rope_type": "default"}, call="qk"),
    Convention("half", 10000.0),
    "LlamaRotaryEmbedding + apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) on q and "
    "GQA k as HF's attention passes them",
    call="qk",
)

LONGROPE_DIM = 64
LONGROPE = LongRoPE(
    short_factor=tuple(1.0 + i / 128 for i in range(LONGROPE_DIM // 2)),
    long_factor=tuple(1.0 + i / 4 for i in range(LONGROPE_DIM // 2)),
    original_max_position_embeddings=4096,
    max_position_embeddings=131072,
)
_hf(
    "hf-phi3-longrope",
    _hf_rotate_half(
        "phi3",
        {"rope_theta": 10000.0, **LONGROPE.parameters()},
        max_position_embeddings=131072,
        rotary_dim=LONGROPE_DIM,
    ),
    Convention("half", 10000.0, LONGROPE_DIM, LONGROPE),
    "Phi3RotaryEmbedding (longrope: short/long factors switched past 4096) + apply_rotary_pos_emb",
    rotary_dim=LONGROPE_DIM,
)

_hf(
    "hf-gpt-neox",
    _hf_rotate_half(
        "gpt_neox", {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}, rotary_dim=32
    ),
    Convention("half", 10000.0, 32),
    "GPTNeoXRotaryEmbedding + apply_rotary_pos_emb, partial rotary (first 32 features)",
    rotary_dim=32,
)

GPTJ_TABLE = 2**16
_hf(
    "hf-gptj",
    _gptj(64, GPTJ_TABLE),
    Convention("interleaved", 10000.0, 64),
    "GPT-J create_sinusoidal_positions table + rotate_every_two, first 64 features",
    rotary_dim=64,
    max_position=GPTJ_TABLE - 1,
    notes=f"sin/cos table of {GPTJ_TABLE} positions (GPT-J's own is max_position_embeddings long)",
)
