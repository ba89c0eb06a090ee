"""HF transformers' own rotary modules at the settings real models ship (issue 23): head
size, rope_theta, scaling and sections from each model's published config, built from
config objects (never from the hub). The toy adapters (``hf.py``, ``transformers_nd.py``)
run the same code at small settings; these run it where false alarms and slips showed:
high bases, low frequencies, large heads, the real scaling factors and switch lengths.

Each target rotates the first ``head_dim`` features of its input with the model's rotary
module and ``apply_rotary_pos_emb`` on the (batch, heads, seq, head_dim) views HF's
attention passes, and passes any further features through (the checks draw heads of
head_dim, head_dim + 48, ...). ``ropecheck list`` shows each with the flags it implies.
"""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, register
from ropecheck.properties.convention import Convention
from ropecheck.reference.scaling import Scaling, from_parameters

INSTALL = "pip install transformers==5.23.0 torch==2.13.0"

# Phi-3.5-mini-instruct's rope_scaling (config.json), 48 factors each
PHI35_LONG = (
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
    1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
    4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
    17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
    50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
    62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
    63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
    64.51000213623047, 64.52999877929688, 64.83999633789062,
)  # fmt: skip
PHI35_SHORT = (
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979, 1.0999999046325684,
    1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533, 2.729999542236328,
    2.749999523162842, 2.8399994373321533,
)  # fmt: skip

LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
PHI35 = {
    "rope_type": "longrope",
    "short_factor": list(PHI35_SHORT),
    "long_factor": list(PHI35_LONG),
    "original_max_position_embeddings": 4096,
}
DEEPSEEK_V3 = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
GPT_OSS = {
    "rope_type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
}
# Gemma 4's rope parameters (Gemma4TextConfig's defaults, transformers 5.23)
GEMMA4 = {
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
}


def _rotated(apply, head_dim: int, interleave_out: bool = False):
    """rope(x, cos_sin(q, positions)) on the first head_dim features of x (b, s, h, d) as
    (b, h, s, head_dim) views; ``interleave_out``: the applier returns its pairs (2i, 2i + 1)
    de-interleaved (DeepSeek's apply_rotary_pos_emb_interleave writes the rotated evens, then
    the odds: q and k permuted alike, which attention scores do not see); they are put back."""
    import torch

    def rope_with(cos_sin):
        def rope(x, positions):
            q = x[..., :head_dim].transpose(1, 2)
            cos, sin = cos_sin(q, positions)
            out, _ = apply(q, q, cos, sin)
            out = out.transpose(1, 2)
            if interleave_out:
                out = torch.stack((out[..., : head_dim // 2], out[..., head_dim // 2 :]), dim=-1).flatten(-2)
            return torch.cat((out, x[..., head_dim:]), dim=-1)

        return rope

    return rope_with


def _one_layer(head_dim: int, rope_parameters: dict) -> dict:
    """A text config of one small layer at the model's real head size and rope parameters."""
    return dict(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=head_dim,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=1000,
        rope_parameters=rope_parameters,
    )


def _text_model(module: str, config: str, rotary: str, head_dim: int, rope_parameters: dict, **extra):
    """The model's config (one layer, its real head size and rope parameters) and rotary module."""
    import importlib

    import transformers

    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    settings = {**_one_layer(head_dim, rope_parameters), "max_position_embeddings": 131072, **extra}  # extra overrides
    cfg = getattr(transformers, config)(**settings)
    return modeling, getattr(modeling, rotary)(cfg)


def _one_d(module, config, rotary, head_dim, rope_parameters, apply="apply_rotary_pos_emb", **extra):
    def build():
        modeling, emb = _text_model(module, config, rotary, head_dim, rope_parameters, **extra)
        return _rotated(getattr(modeling, apply), head_dim, apply.endswith("interleave"))(emb)

    return build


def _gemma3(layer_type: str):
    """Gemma3RotaryEmbedding(x, position_ids, layer_type): one module, two rope settings."""

    def build():
        modeling, emb = _text_model(
            "gemma3",
            "Gemma3TextConfig",
            "Gemma3RotaryEmbedding",
            256,
            {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
            layer_types=[layer_type],
        )
        return _rotated(modeling.apply_rotary_pos_emb, 256)(lambda q, p: emb(q, p, layer_type))

    return build


def _gemma4_global():
    """Gemma4TextRotaryEmbedding(x, position_ids, "full_attention"): p-RoPE (rope_type
    proportional, partial_rotary_factor 0.25, rope_theta 1e6) over the full-attention layers'
    global_head_dim of 512, applied by Gemma 4's apply_rotary_pos_emb(x, cos, sin)."""

    def build():
        modeling, emb = _text_model(
            "gemma4",
            "Gemma4TextConfig",
            "Gemma4TextRotaryEmbedding",
            256,
            GEMMA4,
            layer_types=["full_attention"],
            global_head_dim=512,
        )

        def apply(q, k, cos, sin):
            return modeling.apply_rotary_pos_emb(q, cos, sin), None

        return _rotated(apply, 512)(lambda q, p: emb(q, p, "full_attention"))

    return build


def _mrope(module, config, rotary, head_dim, rope_parameters, text=True):
    """A VL model's text rotary module: position_ids (3, b, s) from positions (b, s, 3)."""

    def build():
        import importlib

        import transformers

        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        text_config = _one_layer(head_dim, rope_parameters)
        cfg = getattr(transformers, config)(text_config=text_config).get_text_config()
        emb = getattr(modeling, rotary)(cfg)
        return _rotated(modeling.apply_rotary_pos_emb, head_dim)(lambda q, p: emb(q, p.permute(2, 0, 1)))

    return build


def _convention(layout: str, base: float, head_dim: int, scaling: dict | None = None) -> Convention:
    return Convention(layout, base, head_dim, from_parameters(scaling) if scaling else Scaling())


def _real(name, build, description, convention=None, head_dim=None, **capabilities):
    register(
        Adapter(
            name=name,
            library="transformers",
            build=build,
            convention=convention,
            description=description,
            modules=("transformers",),
            install=INSTALL,
            rotary_dim=head_dim,
            **capabilities,
        )
    )


_real(
    "hf-llama31",
    _one_d("llama", "LlamaConfig", "LlamaRotaryEmbedding", 128, {"rope_theta": 500000.0, **LLAMA31}),
    "Llama-3.1 8B/70B/405B: LlamaRotaryEmbedding at head 128, rope_theta 5e5, llama3 scaling factor 8",
    _convention("half", 500000.0, 128, LLAMA31),
    128,
)
_real(
    "hf-llama32",
    _one_d("llama", "LlamaConfig", "LlamaRotaryEmbedding", 64, {"rope_theta": 500000.0, **LLAMA31, "factor": 32.0}),
    "Llama-3.2 1B/3B: LlamaRotaryEmbedding at head 64, rope_theta 5e5, llama3 scaling factor 32",
    _convention("half", 500000.0, 64, {**LLAMA31, "factor": 32.0}),
    64,
)
_real(
    "hf-phi35-longrope",
    _one_d(
        "phi3",
        "Phi3Config",
        "Phi3RotaryEmbedding",
        96,
        {"rope_theta": 10000.0, **PHI35},
        original_max_position_embeddings=4096,
    ),
    "Phi-3.5-mini: Phi3RotaryEmbedding at head 96, its 48 short/long LongRoPE factors, switched past 4096 tokens",
    _convention("half", 10000.0, 96, {**PHI35, "max_position_embeddings": 131072}),
    96,
)
_real(
    "hf-deepseek-v3-yarn",
    _one_d(
        "deepseek_v3",
        "DeepseekV3Config",
        "DeepseekV3RotaryEmbedding",
        64,
        {"rope_theta": 10000.0, **DEEPSEEK_V3},
        apply="apply_rotary_pos_emb_interleave",
        qk_rope_head_dim=64,
        max_position_embeddings=163840,
    ),
    "DeepSeek-V3: DeepseekV3RotaryEmbedding (YaRN factor 40, mscale 1/1) + apply_rotary_pos_emb_interleave on "
    "the 64 rope features, its de-interleaved output put back in pairs",
    _convention("interleaved", 10000.0, 64, DEEPSEEK_V3),
    64,
)
_real(
    "hf-gpt-oss-yarn",
    _one_d("gpt_oss", "GptOssConfig", "GptOssRotaryEmbedding", 64, {"rope_theta": 150000.0, **GPT_OSS}),
    "gpt-oss: GptOssRotaryEmbedding (YaRN factor 32, not truncated, rope_theta 150000) + apply_rotary_pos_emb",
    _convention("half", 150000.0, 64, GPT_OSS),
    64,
)
_real(
    "hf-gemma3-global",
    _gemma3("full_attention"),
    "Gemma 3 global layers: Gemma3RotaryEmbedding at head 256, rope_theta 1e6, linear factor 8",
    _convention("half", 1000000.0, 256, {"rope_type": "linear", "factor": 8.0}),
    256,
)
_real(
    "hf-gemma3-local",
    _gemma3("sliding_attention"),
    "Gemma 3 local (sliding-window) layers: Gemma3RotaryEmbedding at head 256, rope_theta 1e4",
    _convention("half", 10000.0, 256),
    256,
)
_real(
    "hf-gemma4-global",
    _gemma4_global(),
    "Gemma 4 global layers: Gemma4TextRotaryEmbedding at global_head_dim 512, p-RoPE (proportional, 0.25 of "
    "the pairs turning), rope_theta 1e6",
    Convention("half", 1000000.0, 512, rotated_fraction=0.25),
    512,
)

MROPE = "N-D target: positions (batch, seq, 3)"
_real(
    "hf-qwen2vl-mrope-real",
    _mrope(
        "qwen2_vl",
        "Qwen2VLConfig",
        "Qwen2VLRotaryEmbedding",
        128,
        {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    ),
    "Qwen2-VL / Qwen2.5-VL: Qwen2VLRotaryEmbedding at head 128, mrope_section [16, 24, 24], rope_theta 1e6",
    notes=MROPE,
    family="mrope",
    implies={"sections": [16, 24, 24], "layout": "half", "base": 1000000.0},
)
_real(
    "hf-qwen3vl-mrope-real",
    _mrope(
        "qwen3_vl",
        "Qwen3VLConfig",
        "Qwen3VLTextRotaryEmbedding",
        128,
        {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    ),
    "Qwen3-VL: Qwen3VLTextRotaryEmbedding at head 128, interleaved mrope_section [24, 20, 20], rope_theta 5e6",
    notes=MROPE,
    family="mrope",
    implies={"sections": [24, 20, 20], "layout": "half", "base": 5000000.0, "mrope_interleaved": True},
)
_real(
    "hf-glm4v-mrope",
    _mrope(
        "glm4v",
        "Glm4vConfig",
        "Glm4vTextRotaryEmbedding",
        128,
        {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5},
    ),
    "GLM-4.1V / GLM-4.5V: Glm4vTextRotaryEmbedding at head 128 (partial_rotary_factor 0.5: 64 rotated, "
    "pairs (2i, 2i + 1)), mrope_section [8, 12, 12], rope_theta 1e4",
    notes=MROPE,
    family="mrope",
    implies={"sections": [8, 12, 12], "layout": "interleaved", "base": 10000.0, "rotary_dim": 64},
)
