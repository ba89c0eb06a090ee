"""Triton RoPE kernels of liger-kernel and flash-attn. Without CUDA they run under the
Triton interpreter (``TRITON_INTERPRET=1``, set before triton is first imported); the
interpreter mishandles bfloat16 arithmetic, so bfloat16 is declared only on CUDA."""

from __future__ import annotations

import contextlib
import importlib.util
import os

from ropecheck.adapters.registry import Adapter, register
from ropecheck.target import Convention


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _triton_ready():
    """Import triton, in interpreter mode when there is no GPU."""
    from ropecheck.kernels.triton_env import import_triton
    import_triton()


def _hf_cos_sin(positions, rotary_dim: int, dtype, base: float = 10000.0):
    """cos, sin (batch, seq, r) as HF's rotary module makes them: float32 angles, duplicated
    halves, cast to the input dtype."""
    import torch
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    phi = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)
    phi = torch.cat((phi, phi), dim=-1)
    return phi.cos().to(dtype), phi.sin().to(dtype)


def _liger():
    """``LigerRopeFunction.apply(q, k, cos, sin)`` with q as HF passes it: a (batch, heads,
    seq, head_dim) transposed view (a clone of x's, strides kept: Liger writes its result
    into q when q is such a view, see the finding in README); k a small tensor."""

    def build():
        _triton_ready()
        import torch
        from liger_kernel.ops.rope import LigerRopeFunction

        def rope(x, positions):
            cos, sin = _hf_cos_sin(positions, x.shape[-1], x.dtype)
            q = x.transpose(1, 2).clone()  # preserve_format: same strides as x's view
            k = torch.zeros_like(q[:, :1])
            out, _ = LigerRopeFunction.apply(q, k, cos, sin)
            return out.transpose(1, 2)
        return rope
    return build


def _load_flash_rotary():
    """flash_attn/ops/triton/rotary.py on its own: ``import flash_attn`` needs the CUDA
    extension, this file does not."""
    spec = importlib.util.find_spec("flash_attn")
    path = os.path.join(spec.submodule_search_locations[0], "ops", "triton", "rotary.py")
    module_spec = importlib.util.spec_from_file_location("ropecheck_flash_attn_rotary", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _cuda_device_noop_on_cpu():
    """flash-attn enters ``torch.cuda.device(x.device.index)``; on CPU that must do nothing."""
    import torch
    if _cuda():
        yield
        return
    original = torch.cuda.device
    torch.cuda.device = lambda *a, **k: contextlib.nullcontext()
    try:
        yield
    finally:
        torch.cuda.device = original


def _flash_attn(interleaved: bool):
    """``apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)`` on its varlen
    path: every token is a sequence of length 1 (``cu_seqlens`` = 0, 1, ..., N) whose
    ``seqlen_offsets`` entry is its row in a cos/sin table (float32 angles, as flash-attn's
    RotaryEmbedding forms them) of the call's distinct positions."""

    def build():
        _triton_ready()
        import torch
        rotary = _load_flash_rotary()

        def rope(x, positions):
            batch, seq, heads, head_dim = x.shape
            unique, row = torch.unique(positions.reshape(-1), return_inverse=True)
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                                        device=x.device) / head_dim))
            phi = unique.to(torch.float32)[:, None] * inv_freq
            cos, sin = phi.cos().to(x.dtype), phi.sin().to(x.dtype)
            tokens = x.reshape(batch * seq, heads, head_dim)
            cu_seqlens = torch.arange(batch * seq + 1, dtype=torch.int32, device=x.device)
            with _cuda_device_noop_on_cpu():
                out = rotary.apply_rotary(tokens, cos, sin, seqlen_offsets=row.to(torch.int32),
                                          cu_seqlens=cu_seqlens, max_seqlen=1,
                                          interleaved=interleaved)
            return out.reshape(x.shape)
        return rope
    return build


register(Adapter("liger-kernel", "liger-kernel", _liger(), Convention("half", 10000.0),
                 "LigerRopeFunction (Triton) with HF-style cos/sin, q a transposed view",
                 modules=("liger_kernel", "triton"),
                 install="pip install liger-kernel==0.8.5 triton==3.9.0 torch==2.13.0",
                 dtypes=("float32", "float16"),
                 notes="finding: writes its result into q and k when q is a transposed view, as HF "
                       "passes it (the adapter passes a clone); without CUDA: Triton interpreter, float32/float16 only"))

for _name, _interleaved in (("flash-attn-rotary", False), ("flash-attn-rotary-interleaved", True)):
    register(Adapter(
        _name, "flash-attn", _flash_attn(_interleaved),
        Convention("interleaved" if _interleaved else "half", 10000.0),
        "flash_attn/ops/triton/rotary.py apply_rotary, varlen (cu_seqlens) with per-sequence "
        "seqlen_offsets" + (", interleaved" if _interleaved else ""),
        modules=("flash_attn", "triton"), backward=False,
        install="FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE pip install "
                "flash-attn==2.8.3.post2 --no-build-isolation --no-deps; pip install triton==3.9.0",
        dtypes=("float32", "float16", "bfloat16"),
        notes="its autograd wrapper needs the CUDA extension: forward only; without CUDA the "
              "Triton interpreter"))
