"""Small half-layout RoPE kernels (base 10000, angles in float32, as HF) that are right in
eager mode and wrong under one execution mode (``ropecheck.modes``), for tests/test_modes.py.
The file imports torch only: ropecheck loads it in its worker process."""

import warnings

import torch


def _inv_freq(d):
    return 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)


def _apply(x, angles):
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def correct(x, positions):
    """Right in every mode: elementwise angles, which autocast leaves in float32."""
    return _apply(x, positions.float()[..., None] * _inv_freq(x.shape[-1]))


def matmul_angles(x, positions):
    """BROKEN under autocast: the angles come from a matmul, which autocast runs in bf16."""
    return _apply(x, (positions.float()[..., None] @ _inv_freq(x.shape[-1])[None, :]).float())


def compile_branch(x, positions):
    """BROKEN under torch.compile: a branch only the traced code takes (a "fast path" behind
    torch.compiler.is_compiling()) uses base 10001."""
    if torch.compiler.is_compiling():
        d = x.shape[-1]
        inv_freq = 1.0 / 10001.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        return _apply(x, positions.float()[..., None] * inv_freq)
    return correct(x, positions)


def warns_when_compiled(x, positions):
    """Right in every mode; warns whenever torch.compile runs it (as libraries warn of a
    fallback or a graph break): the warnings are counted in one line, never printed."""
    if torch.compiler.is_compiling():
        warnings.warn("fused path unavailable under torch.compile: falling back", UserWarning)
    return correct(x, positions)
