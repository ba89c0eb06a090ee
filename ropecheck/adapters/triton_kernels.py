"""Triton RoPE kernels of liger-kernel and flash-attn, called in the form their users call
them: Liger on q and k together (``call="qk"``), flash-attn on packed varlen sequences
(``call="packed"``) and, through its RotaryEmbedding module, on q and a kv tensor with
per-row offsets. Without CUDA they run under the Triton interpreter
(``TRITON_INTERPRET=1``, set before triton is first imported), with bfloat16 arithmetic
computed on values as a GPU computes it (``ropecheck.kernels.triton_interpreter``: Liger
computes its rotation in the input dtype)."""

from __future__ import annotations

import contextlib
import importlib

from ropecheck.adapters.registry import Adapter, import_bare, per_head_dim, register
from ropecheck.properties.convention import Convention


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


def _copy_keeping_strides(t):
    """A differentiable copy of t laid out as t is (its strides: a bshd tensor stays bshd, a
    slice of a fused qkv projection keeps its row stride)."""
    import torch

    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _liger():
    """``LigerRopeFunction.apply(q, k, cos, sin)`` as HF's Liger patch calls it: q and k as
    (batch, heads, seq, head_dim) transposed views of the (batch, seq, heads, head_dim)
    projections, GQA k with fewer heads, cos/sin (batch, seq, head_dim) from the positions.
    Liger writes its result into q and k when they are such views (finding, see README):
    the adapter passes copies laid out as the engine's q and k, so the write lands in them
    and the engine's inputs stay as they were."""

    def build():
        _triton_ready()
        from liger_kernel.ops.rope import LigerRopeFunction

        def rope(q, k, positions):
            cos, sin = _hf_cos_sin(positions, q.shape[-1], q.dtype)
            q_out, k_out = LigerRopeFunction.apply(
                _copy_keeping_strides(q).transpose(1, 2), _copy_keeping_strides(k).transpose(1, 2), cos, sin
            )
            return q_out.transpose(1, 2), k_out.transpose(1, 2)

        return rope

    return build


FLASH_TABLE = 2**16  # rows of the cos/sin table (RotaryEmbedding's is max_seqlen long)


def _flash_rotary():
    """flash_attn.layers.rotary (RotaryEmbedding, apply_rotary_emb and its autograd
    Function): from the package when it imports, else with the package's __init__ left out
    (it needs the CUDA extension; the rotary files do not). Without CUDA, flash-attn's
    ``torch.cuda.device(x.device.index)`` (forward and backward) is made a no-op for CPU
    tensors, whose index is None."""
    import torch

    if not _cuda() and not getattr(torch.cuda.device, "ropecheck_cpu_noop", False):
        cuda_device = torch.cuda.device

        def device(*args, **kwargs):
            index = args[0] if args else kwargs.get("device")
            return contextlib.nullcontext() if index is None else cuda_device(*args, **kwargs)

        device.ropecheck_cpu_noop = True
        torch.cuda.device = device
    try:
        return importlib.import_module("flash_attn.layers.rotary")
    except ImportError:  # flash_attn/__init__ imports flash_attn_2_cuda
        return import_bare("flash_attn.layers.rotary")


def _refuse_negative(offsets):
    if bool((offsets < 0).any()):
        raise ValueError(
            "flash-attn's rotary reads rows offset + i of a cos/sin table that "
            "starts at position 0: negative positions are not supported"
        )


def _sequence_offsets(cu_seqlens, positions):
    """int32 (n,): each sequence's first position (0 for an empty one), after checking that
    positions are offset + index within every sequence, the only ones flash-attn takes."""
    import torch

    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    total = positions.numel()
    starts = cu_seqlens[:-1].long().clamp(max=max(total - 1, 0))
    offsets = torch.where(lengths > 0, positions[starts] if total else 0, 0)
    sequence = torch.repeat_interleave(torch.arange(lengths.numel(), device=positions.device), lengths)
    index = torch.arange(total, device=positions.device) - cu_seqlens[:-1].long()[sequence]
    if not torch.equal(positions, offsets[sequence] + index):
        raise ValueError(
            "flash-attn's rotary takes per-sequence offsets: positions must be "
            "offset + arange(length) within each sequence"
        )
    _refuse_negative(offsets)
    return offsets.to(torch.int32)


def _int_if_shared(offsets):
    """One offset shared by every sequence (a packed training batch: 0) goes as the int
    flash-attn also takes, its other seqlen_offsets path; else the (batch,) tensor."""
    return int(offsets[0]) if offsets.numel() and bool((offsets == offsets[0]).all()) else offsets


def _row_offsets(positions):
    """int32 (batch,): each row's first position, after checking that the row is
    offset + arange(seq)."""
    import torch

    batch, seq = positions.shape
    offsets = positions[:, 0] if seq else torch.zeros(batch, dtype=positions.dtype, device=positions.device)
    if not torch.equal(positions, offsets[:, None] + torch.arange(seq, device=positions.device)):
        raise ValueError("flash-attn's rotary takes per-row offsets: positions must be offset + arange(seq) per row")
    _refuse_negative(offsets)
    return offsets.to(torch.int32)


def _table_rows(positions, longest: int) -> int:
    """Rows 0 .. largest position of the cos/sin table, at least the longest sequence
    (apply_rotary asserts it)."""
    return max(int(positions.max()) + 1 if positions.numel() else 0, longest, 1)


def _flash_packed(interleaved: bool, inplace: bool):
    """``apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets, cu_seqlens=cu_seqlens,
    max_seqlen=...)`` on the real varlen path: x (total, heads, head_dim) with the
    engine's cu_seqlens (empty sequences included), ``seqlen_offsets`` each sequence's
    first position, cos/sin RotaryEmbedding's own table (float32 angles, rows 0 .. largest
    position) kept per head size as a model keeps its module. ``inplace`` is its
    ``inplace=True``: x is rotated in place and returned. Autograd: its ApplyRotaryEmb."""

    def build():
        _triton_ready()
        rotary = _flash_rotary()
        module = per_head_dim(lambda head_dim: rotary.RotaryEmbedding(head_dim, 10000.0, interleaved))

        def rope(x, cu_seqlens, positions):
            offsets = _int_if_shared(_sequence_offsets(cu_seqlens, positions))
            lengths = cu_seqlens[1:] - cu_seqlens[:-1]
            longest = int(lengths.max()) if lengths.numel() else 0
            emb = module(x.shape[-1], x.device)
            emb._update_cos_sin_cache(_table_rows(positions, longest), device=x.device, dtype=x.dtype)
            return rotary.apply_rotary_emb(
                x,
                emb._cos_cached,
                emb._sin_cached,
                interleaved=interleaved,
                inplace=inplace,
                seqlen_offsets=offsets,
                cu_seqlens=cu_seqlens,
                max_seqlen=longest,
            )

        return rope

    return build


def _flash_offsets(interleaved: bool):
    """``RotaryEmbedding(q, kv, seqlen_offset=offsets, max_seqlen=...)``, the module's
    KV-cache path: q (batch, seq, heads, head_dim) and kv (batch, seq, 2, k_heads,
    head_dim) rotated in place (q is a copy laid out as the engine's; kv stacks k with a
    zero v), ``seqlen_offset`` a (batch,) tensor of each row's first position, so positions
    must be offset + arange(seq) per row (other positions are refused: a support limit)."""

    def build():
        _triton_ready()
        import torch

        rotary = _flash_rotary()
        module = per_head_dim(lambda head_dim: rotary.RotaryEmbedding(head_dim, 10000.0, interleaved))

        def rope(q, k, positions):
            offsets = _int_if_shared(_row_offsets(positions))
            kv = torch.stack((k, torch.zeros_like(k)), dim=2)
            q_out, kv = module(q.shape[-1], q.device)(
                _copy_keeping_strides(q), kv, seqlen_offset=offsets, max_seqlen=_table_rows(positions, q.shape[1])
            )
            return q_out, kv[:, :, 0]

        return rope

    return build


register(
    Adapter(
        "liger-kernel",
        "liger-kernel",
        _liger(),
        Convention("half", 10000.0),
        "LigerRopeFunction (Triton) on q and k as HF passes them (transposed views, GQA k), HF-style cos/sin",
        modules=("liger_kernel", "triton"),
        call="qk",
        install="pip install liger-kernel==0.8.5 triton==3.9.0 torch==2.13.0",
        dtypes=("float32", "float16", "bfloat16"),
        notes="finding: writes its result into q and k when they are transposed views, as "
        "HF passes them (the adapter passes copies); without CUDA: Triton interpreter",
    )
)

FLASH_INSTALL = (
    "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE pip install "
    "flash-attn==2.8.3.post2 --no-build-isolation --no-deps; pip install einops triton==3.9.0"
)
FLASH_NOTES = (
    f"cos/sin table of up to {FLASH_TABLE} positions (RotaryEmbedding's is max_seqlen "
    "long); flash_attn/__init__ needs the CUDA extension, the rotary modules are "
    "imported without it; without CUDA the Triton interpreter"
)


def _flash(name, build, interleaved, description, **capabilities):
    layout = "interleaved" if interleaved else "half"
    register(
        Adapter(
            name,
            "flash-attn",
            build,
            Convention(layout, 10000.0),
            description + (", interleaved" if interleaved else ""),
            modules=("flash_attn", "triton", "einops"),
            install=FLASH_INSTALL,
            dtypes=("float32", "float16", "bfloat16"),
            max_position=FLASH_TABLE - 1,
            notes=FLASH_NOTES,
            **capabilities,
        )
    )


for _suffix, _interleaved in (("", False), ("-interleaved", True)):
    _flash(
        f"flash-attn-rotary{_suffix}",
        _flash_packed(_interleaved, False),
        _interleaved,
        "apply_rotary_emb, varlen: real sequences (cu_seqlens) with per-sequence seqlen_offsets",
        call="packed",
    )
    _flash(
        f"flash-attn-rotary{_suffix}-inplace",
        _flash_packed(_interleaved, True),
        _interleaved,
        "apply_rotary_emb(inplace=True), varlen: real sequences (cu_seqlens) with per-sequence seqlen_offsets",
        call="packed",
        inplace=True,
    )
    _flash(
        f"flash-attn-rotary{_suffix}-offsets",
        _flash_offsets(_interleaved),
        _interleaved,
        "RotaryEmbedding(q, kv, seqlen_offset=(batch,) tensor): q and a kv tensor, per-row "
        "offsets (positions offset + arange(seq) per row only)",
        call="qk",
        row_offsets=True,
    )
