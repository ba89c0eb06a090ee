"""Real libraries' RoPE functions called through their own interfaces (``--api`` presets,
``ropecheck.calling.presets``): the library function itself is the target, with no
wrapper; ropecheck makes the table it is fed and calls it as the library's callers do.

- transformers' ``apply_rotary_pos_emb`` (``--api hf``): cos/sin (batch, seq, r) per token;
- liger-kernel's ``liger_rotary_pos_emb`` (``--api hf``, Triton: the interpreter on CPU);
- flash-attn's Triton ``apply_rotary_emb`` (``--api flash-attn``): cos/sin (P, r/2) rows by
  position, seqlen_offsets, cu_seqlens (the interpreter on CPU);
- megatron-core's ``apply_rotary_pos_emb`` (``--api megatron``): float32 angles per token,
  sbhd, and thd with cu_seqlens.
"""

from __future__ import annotations

from ropecheck.adapters.registry import Adapter, register
from ropecheck.adapters.triton_kernels import FLASH_INSTALL, _flash_rotary, _triton_ready
from ropecheck.properties.convention import Convention


def _hf():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    return apply_rotary_pos_emb


def _liger():
    _triton_ready()
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    return liger_rotary_pos_emb


def _flash():
    _triton_ready()
    return _flash_rotary().apply_rotary_emb


register(
    Adapter(
        "hf-apply-rotary-pos-emb",
        "transformers",
        _hf,
        Convention("half", 10000.0),
        "transformers' apply_rotary_pos_emb(q, k, cos, sin) as the library itself, through --api hf",
        modules=("transformers",),
        install="pip install transformers",
        api="hf",
    )
)

register(
    Adapter(
        "liger-rotary-pos-emb",
        "liger-kernel",
        _liger,
        Convention("half", 10000.0),
        "liger-kernel's liger_rotary_pos_emb(q, k, cos, sin) (Triton) as the library itself, through --api hf",
        modules=("liger_kernel", "triton"),
        install="pip install liger-kernel==0.8.5 triton==3.9.0 torch==2.13.0",
        dtypes=("float32", "float16"),
        api="hf",
        notes="without CUDA: Triton interpreter, float32/float16 only",
    )
)

register(
    Adapter(
        "flash-attn-apply-rotary-emb",
        "flash-attn",
        _flash,
        Convention("half", 10000.0),
        "flash-attn's apply_rotary_emb(x, cos, sin, ...) (Triton) as the library itself, through --api flash-attn",
        modules=("flash_attn", "triton", "einops"),
        install=FLASH_INSTALL,
        dtypes=("float32", "float16", "bfloat16"),
        api="flash-attn",
        notes="flash_attn/__init__ needs the CUDA extension, the rotary module is imported without it; without "
        "CUDA the Triton interpreter",
    )
)


def _megatron():
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    return apply_rotary_pos_emb


for _name, _call, _what in (
    ("megatron-core-apply-rotary-pos-emb", "x", "sbhd t, freqs (s, b, 1, r)"),
    ("megatron-core-apply-rotary-pos-emb-packed", "packed", "thd t with cu_seqlens, freqs (total, 1, 1, r)"),
):
    register(
        Adapter(
            _name,
            "megatron-core",
            _megatron,
            Convention("half", 10000.0),
            f"megatron-core's apply_rotary_pos_emb(t, freqs, config, ...) as the library itself, through --api "
            f"megatron: {_what}",
            call=_call,
            modules=("megatron.core",),
            install="pip install megatron-core==0.16.1 torch==2.13.0",
            api="megatron",
            notes="its unfused path (config.apply_rope_fusion off: the fused one is TransformerEngine's), a "
            "one-rank context-parallel group",
        )
    )


def _own():
    from ropecheck.kernels.cache_rope import rotary_embedding

    return rotary_embedding


for _name, _api, _what in (
    ("ropecheck-cache-rope", "vllm", "vLLM's ops.rotary_embedding"),
    ("ropecheck-cache-rope-flashinfer", "flashinfer-cos-sin-cache", "FlashInfer's float32 cos_sin_cache"),
):
    register(
        Adapter(
            _name,
            "ropecheck",
            _own,
            Convention("half", 10000.0),
            f"ropecheck's own table-fed Triton kernel (ropecheck/kernels/cache_rope.py) through --api {_api} ({_what})",
            modules=("triton",),
            install="pip install triton",
            dtypes=("float32", "bfloat16", "float16", "float64"),
            backward=False,
            api=_api,
            notes="without CUDA: the Triton interpreter",
        )
    )
