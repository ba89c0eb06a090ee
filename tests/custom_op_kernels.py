"""RoPE kernels registered as ``torch.library`` custom ops (namespace ``ropecheck_test``), for
tests/test_opcheck.py (``--opcheck``). Each computes a correct RoPE (half layout, base
10000, in float32; float64 for float64 inputs), so every property passes; what is wrong,
where anything is, is the registration only:

- ``rope_strided_fake``: the kernel returns its output with the input's strides (as a kernel
  that allocates with ``empty_like`` does), the fake a contiguous tensor: they disagree on
  every non-contiguous input (inductor's stride assert on fused-qkv slices, sglang #36443);
- ``rope_aliasing``: in place, declared ``Tensor(a!) x -> Tensor``: the kernel returns x
  itself, the fake a new tensor, and the schema does not say the output aliases x;
- ``vllm_unannotated``: vLLM's in-place interface, writing query and key without
  ``mutates_args``;
- ``rope_no_fake``: a ``torch.library.Library`` op with a CPU kernel and no fake or meta
  kernel (vllm-ascend #1962): torch.compile cannot trace it (a graph break) and opcheck's
  fake tensor test fails;
- ``rope_fake_exits``: a fake that ends the process (only opcheck's run reaches it);
- ``rope_jit_loaded``: a correct op behind a wrapper that loads its "extension" with
  ``importlib`` on every call, as a registration helper that is a no-op leaves a JIT loader
  in the traced path (flashinfer #2733): dynamo breaks the graph there;
- correct ones: ``rope_op`` (a ``custom_op`` with its fake and autograd), ``vllm_op`` (vLLM's
  in place, ``mutates_args=("query", "key")``), and ``plain_rope`` (no custom op at all).

Targets: the op objects themselves (an ``OpOverload``, an ``OpOverloadPacket``, a
``custom_op`` function) and plain functions that call them. The module registers its ops
once per process: tests load it as the module ``tests.custom_op_kernels``.

    ropecheck check tests/custom_op_kernels.py:rope_strided_fake --layout half --opcheck
"""

from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

NS = "ropecheck_test"
BASE = 10000.0


def _work(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., D) turned by the half layout's pairs (i, i + D/2), cos/sin (..., D/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half].to(cos.dtype), x[..., half:].to(cos.dtype)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)


def plain_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Correct, no custom op: x (batch, seq, heads, head_dim), positions (batch, seq)."""
    half = x.shape[-1] // 2
    work = _work(x)
    inv_freq = 1.0 / BASE ** (torch.arange(half, dtype=work, device=x.device) / half)
    angles = positions.to(work)[..., None] * inv_freq
    return _rotate(x, angles.cos()[:, :, None, :], angles.sin()[:, :, None, :])


def _backward(ctx, grad):  # the VJP of R_m x is R_m^T g = f(g, -m)
    return plain_rope(grad, -ctx.positions), None


def _keep_positions(ctx, inputs, output):
    ctx.positions = inputs[1]


# --- rope(x, positions) as custom ops -------------------------------------------------------


@torch.library.custom_op(f"{NS}::rope", mutates_args=())
def rope_op(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Correct: a new contiguous tensor, and a fake that says so."""
    return plain_rope(x, positions).contiguous()


@rope_op.register_fake
def _(x, positions):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


rope_op.register_autograd(_backward, setup_context=_keep_positions)


@torch.library.custom_op(f"{NS}::rope_strided", mutates_args=())
def _rope_strided(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)  # x's strides, where x is dense (a transposed view)
    out.copy_(plain_rope(x, positions))
    return out


@_rope_strided.register_fake
def _(x, positions):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # BROKEN: contiguous, always


_rope_strided.register_autograd(_backward, setup_context=_keep_positions)
rope_strided_fake = torch.ops.ropecheck_test.rope_strided.default  # the OpOverload as the target
rope_strided_packet = torch.ops.ropecheck_test.rope_strided  # its OpOverloadPacket


def strided_wrapper(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A model's Python wrapper around the op whose fake has the wrong strides."""
    return torch.ops.ropecheck_test.rope_strided(x, positions.long())  # the packet


_LIB = torch.library.Library(NS, "FRAGMENT")  # ops defined with a schema of their own
_LIB.define("rope_aliasing(Tensor(a!) x, Tensor positions) -> Tensor")
_LIB.define("rope_no_fake(Tensor x, Tensor positions) -> Tensor")


def _aliasing_kernel(x, positions):
    x.copy_(plain_rope(x, positions))
    return x  # BROKEN: the schema's output is not Tensor(a!)


def _no_fake_kernel(x, positions):
    return plain_rope(x, positions).contiguous()


_LIB.impl("rope_aliasing", _aliasing_kernel, "CompositeExplicitAutograd")
_LIB.impl("rope_no_fake", _no_fake_kernel, "CPU")  # BROKEN: no fake (meta) kernel


@torch.library.register_fake(f"{NS}::rope_aliasing", lib=_LIB)
def _(x, positions):
    return torch.empty_like(x)  # a new tensor: the kernel returns x


rope_aliasing = torch.ops.ropecheck_test.rope_aliasing.default  # in place: --inplace --no-backward
rope_no_fake = torch.ops.ropecheck_test.rope_no_fake.default  # --no-backward


def _load_extension():
    """What a JIT-compiled extension's loader does on each call when its registration
    helper is a no-op: an import, which dynamo does not trace."""
    return importlib.import_module("json")


def rope_jit_loaded(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Correct values and a correct op, behind a loader dynamo breaks the graph on."""
    _load_extension()
    return rope_op(x, positions)


@torch.library.custom_op(f"{NS}::rope_fake_exits", mutates_args=())
def rope_fake_exits(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Correct values; its fake ends the process (what a fake calling into a broken extension
    does): only tracing runs it, here opcheck's fake tensor test. --no-backward."""
    return plain_rope(x, positions).contiguous()


@rope_fake_exits.register_fake
def _(x, positions):
    os._exit(3)  # BROKEN


# --- vLLM's interface: fn(positions, query, key, head_size, cos_sin_cache, is_neox), in place --


def _vllm_kernel(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """vLLM's rotary_embedding: query and key (tokens, heads * head_size) or (tokens, heads,
    head_size) rotated in place in their first rotary_dim features, by the cache's rows
    cat(cos, sin) at each token's position (its neox layout only: ``--layout half``)."""
    rows = cos_sin_cache[positions.long()]
    half = cos_sin_cache.shape[1] // 2
    cos, sin = rows[:, None, :half].to(_work(query)), rows[:, None, half:].to(_work(query))
    for t in (query, key):
        if t is None:
            continue
        v = t if t.dim() == 3 else t.unflatten(-1, (-1, head_size))
        rotated = _rotate(v[..., : 2 * half], cos, sin)
        v[..., : 2 * half].copy_(rotated)


def _vllm_fake(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None


# one kernel, registered twice: as vLLM declares it, and without its mutation annotation
_vllm_rope = torch.library.custom_op(f"{NS}::vllm_rope", _vllm_kernel, mutates_args=("query", "key"))
_vllm_unannotated = torch.library.custom_op(f"{NS}::vllm_rope_unannotated", _vllm_kernel, mutates_args=())  # BROKEN
for _op in (_vllm_rope, _vllm_unannotated):
    _op.register_fake(_vllm_fake)
vllm_op = torch.ops.ropecheck_test.vllm_rope.default  # correct


def vllm_unannotated(positions, query, key, head_size, cos_sin_cache, is_neox):
    """A layer's forward calling the op, as vLLM's RotaryEmbedding.forward_cuda does."""
    torch.ops.ropecheck_test.vllm_rope_unannotated(positions, query, key, head_size, cos_sin_cache, is_neox)
