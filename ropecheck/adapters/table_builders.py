"""Table builders of the libraries installed here (--family table-builder, cache-builder):
the half of a production RoPE that turns positions into cos/sin, judged on its own.

- ``hf-rotary-*``: transformers' rotary module (``LlamaRotaryEmbedding(config)``) at every
  rope type, called as a model calls it, ``module(x, position_ids)`` with a float32 x
  (only its dtype and device are read): cos[0], sin[0] (n, r), each frequency twice
  (cat(f, f): --layout half), times the attention factor; one module for the whole run
  (dynamic NTK's state is exercised);
- ``hf-rope-init-*``: ``ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=...)`` ->
  (inv_freq, attention_factor), its float32 inv_freq made a per-frequency table in float64
  (A cos(m inv_freq), A sin(m inv_freq)): the frequencies alone are judged;
- cache builders: flash-attn's ``RotaryEmbedding._update_cos_sin_cache`` (its cos/sin
  cache, float32 and bfloat16), torchtune's ``build_rope_cache`` (RotaryPositionalEmbeddings
  and Llama3ScaledRoPE) and megatron-core's ``RotaryEmbedding.get_cos_sin`` (default,
  linear interpolation, Llama 3 scaling), each as cos_sin_cache = cat(cos, sin).

Configs are built in code, never from the hub; each record implies its flags (``ropecheck
list`` shows them).
"""

from __future__ import annotations

from ropecheck.adapters.hf import INSTALL as HF_INSTALL
from ropecheck.adapters.hf import LLAMA_SCALINGS, LONGROPE
from ropecheck.adapters.others import TORCHTUNE_INSTALL, _pin
from ropecheck.adapters.registry import Adapter, register
from ropecheck.adapters.triton_kernels import FLASH_INSTALL, _flash_rotary
from ropecheck.reference.scaling import Linear, Llama3, Scaling, YaRN

R = 64  # the rotary dim of every record here (the HF partial one: a head of 128, factor 0.5)


def _config(rope_parameters: dict, head_dim: int, max_position_embeddings: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def _hf_rotary(rope_parameters: dict, head_dim: int, max_position_embeddings: int):
    """build(positions) -> cos[0], sin[0] of ``LlamaRotaryEmbedding(config)(x, positions[None])``."""

    def build():
        import torch
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        module = LlamaRotaryEmbedding(_config(rope_parameters, head_dim, max_position_embeddings))
        x = torch.zeros(1, dtype=torch.float32)  # only its dtype and device are read

        def table(positions):
            cos, sin = module(x, positions[None])
            return cos[0], sin[0]

        return table

    return build


def _hf_init(rope_parameters: dict, head_dim: int, max_position_embeddings: int):
    """build(positions) -> A cos(m inv_freq), A sin(m inv_freq) in float64, (inv_freq, A) from
    ``ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=largest position + 1)``."""

    def build():
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        config = _config(rope_parameters, head_dim, max_position_embeddings)
        kind = rope_parameters["rope_type"]
        init = ROPE_INIT_FUNCTIONS[kind] if kind != "default" else LlamaRotaryEmbedding.compute_default_rope_parameters

        def table(positions):
            inv_freq, factor = init(config, device="cpu", seq_len=int(positions.max()) + 1)
            phi = positions.double()[:, None] * inv_freq.double()
            return phi.cos() * factor, phi.sin() * factor

        return table

    return build


def _record(name: str, library: str, build, family: str, description: str, scaling: Scaling, base: float, **kw):
    implies = {"rotary_dim": R, "base": base, **({"layout": "half"} if family == "table-builder" else {})}
    if scaling.rope_type != "default":
        implies["scaling"] = scaling
    return register(
        Adapter(
            name,
            library,
            build,
            None,
            description,
            dtypes=("-",),
            backward=False,
            family=family,
            call="table" if family == "table-builder" else "cache",
            implies=implies,
            **kw,
        )
    )


HF = dict(modules=("transformers",), install=HF_INSTALL)
HF_BUILDERS = {  # suffix: (rope_parameters, Scaling, base, max_position_embeddings)
    name.removeprefix("hf-llama").lstrip("-") or "default": (params, scaling, base, 4096)
    for name, (params, scaling, base) in LLAMA_SCALINGS.items()
}
HF_BUILDERS["longrope"] = (LONGROPE.parameters(), LONGROPE, 10000.0, 131072)
for _suffix, (_params, _scaling, _base, _length) in HF_BUILDERS.items():
    _rope = {"rope_theta": _base, **_params}
    _tail = "" if _suffix == "default" else f"-{_suffix}"
    _record(
        f"hf-rotary{_tail}",
        "transformers",
        _hf_rotary(_rope, R, _length),
        "table-builder",
        f"LlamaRotaryEmbedding(config)(x, position_ids) -> cos, sin ({_params['rope_type']})",
        _scaling,
        _base,
        **HF,
    )
    _record(
        f"hf-rope-init{_tail}",
        "transformers",
        _hf_init(_rope, R, _length),
        "table-builder",
        f"ROPE_INIT_FUNCTIONS[{_params['rope_type']!r}](config, device, seq_len) -> inv_freq, attention factor "
        "(a float64 table of its float32 inv_freq)",
        _scaling,
        _base,
        **HF,
    )

_PARTIAL = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "partial_rotary_factor": 0.5}
_record(
    "hf-rotary-partial",
    "transformers",
    _hf_rotary({"rope_theta": 10000.0, **_PARTIAL}, 2 * R, 4096),
    "table-builder",
    "LlamaRotaryEmbedding (yarn, partial_rotary_factor 0.5 of a head of 128) -> cos, sin of 64 features",
    YaRN(4.0, 1024),
    10000.0,
    **HF,
)


def _flash_cache(dtype: str):
    """build(P) -> cat(_cos_cached, _sin_cached)[:P] after ``_update_cos_sin_cache(P)`` (one
    module for the run: its cache grows and is sliced, as its forward slices it)."""

    def build():
        import torch

        module = _flash_rotary().RotaryEmbedding(R, base=10000.0)
        dt = getattr(torch, dtype)

        def cache(max_position):
            module._update_cos_sin_cache(max_position, device=torch.device("cpu"), dtype=dt)
            return torch.cat((module._cos_cached[:max_position], module._sin_cached[:max_position]), dim=-1)

        return cache

    return build


for _dtype in ("float32", "bfloat16"):
    _record(
        "flash-attn-rotary-cache" + ("" if _dtype == "float32" else "-bf16"),
        "flash-attn",
        _flash_cache(_dtype),
        "cache-builder",
        f"flash_attn.layers.rotary.RotaryEmbedding._update_cos_sin_cache(P, dtype={_dtype}) -> cos/sin cache",
        Scaling(),
        10000.0,
        modules=("flash_attn", "triton", "einops"),
        install=FLASH_INSTALL,
    )


def _torchtune_cache(class_path: str, **kwargs):
    """build(P) -> cat(cache[..., 0], cache[..., 1]) after ``module.build_rope_cache(P)``."""

    def build():
        import importlib

        import torch

        module_name, _, class_name = class_path.rpartition(".")
        module = getattr(importlib.import_module(module_name), class_name)(dim=R, max_seq_len=16, **kwargs)

        def cache(max_position):
            module.build_rope_cache(max_position)
            return torch.cat((module.cache[..., 0], module.cache[..., 1]), dim=-1)

        return cache

    return build


TORCHTUNE = dict(modules=("torchtune", "torchao"), install=TORCHTUNE_INSTALL)
_record(
    "torchtune-rope-cache",
    "torchtune",
    _torchtune_cache("torchtune.modules.RotaryPositionalEmbeddings"),
    "cache-builder",
    "RotaryPositionalEmbeddings.build_rope_cache(P) -> cache (P, r/2, 2)",
    Scaling(),
    10000.0,
    **TORCHTUNE,
)
_record(
    "torchtune-llama3-scaled-cache",
    "torchtune",
    _torchtune_cache("torchtune.models.llama3_1.Llama3ScaledRoPE", base=500000.0),
    "cache-builder",
    "Llama3ScaledRoPE.build_rope_cache(P) (factor 8, low 1, high 4, old context 8192)",
    Llama3(8.0, 1.0, 4.0, 8192),
    500000.0,
    **TORCHTUNE,
)


def _megatron_cache(**kwargs):
    """build(P) -> cat(*RotaryEmbedding(...).get_cos_sin(P)) (its get_emb moves inv_freq to CUDA)."""

    def build():
        import torch
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        module = RotaryEmbedding(R, 1.0, use_cpu_initialization=True, **kwargs)

        def cache(max_position):
            return torch.cat(module.get_cos_sin(max_position), dim=-1)

        return cache

    return build


MEGATRON = dict(modules=("megatron.core",), install=_pin("megatron-core==0.16.1"))
for _suffix, _kwargs, _scaling, _base in (
    ("", {}, Scaling(), 10000.0),
    ("-linear", {"seq_len_interpolation_factor": 4.0}, Linear(4.0), 10000.0),
    ("-llama3", {"rope_scaling": True, "rotary_base": 500000}, Llama3(8.0, 1.0, 4.0, 8192), 500000.0),
):
    _record(
        f"megatron-core-cos-sin{_suffix}",
        "megatron-core",
        _megatron_cache(**_kwargs),
        "cache-builder",
        f"RotaryEmbedding({', '.join(f'{k}={v}' for k, v in _kwargs.items()) or 'kv_channels, 1.0'}).get_cos_sin(P)",
        _scaling,
        _base,
        **MEGATRON,
    )
