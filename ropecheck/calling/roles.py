"""The roles of a preset's parameters (``Param.role``): what ropecheck passes for each, as
one registry the call path iterates (``api_call._Call.value``).

A ``Role`` names the value and how one call makes it (``value(call)``, ``call`` the
``api_call._Call`` of the canonical call: its tensors, positions, convention, tables and
choices), or says which stage of the call supplies it (the tensors in the interface's
format, the KV cache, the fp8 quantization: ``given_by``). Its flags say what the rest of
ropecheck reads of it: ``default_only`` (always the parameter's default: never passed, so
a kernel need not have the parameter), ``context_parallel`` (context parallelism reaches
the kernel through it: ``--cp-size`` needs one), ``attention_factor`` (it carries the
scaling's attention factor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ropecheck.calling.forms import cu_seqlens
from ropecheck.reference.scaling import yarn_correction_range


@dataclass(frozen=True)
class Role:
    name: str
    what: str
    value: Optional[Callable[[Any], Any]] = None  # (call) -> the value; None: ``given_by`` supplies it
    given_by: str = ""
    default_only: bool = False
    context_parallel: bool = False
    attention_factor: bool = False


@dataclass(frozen=True)
class RopeConfig:
    """What Megatron-Core's ``apply_rotary_pos_emb`` reads of its ``TransformerConfig``: the
    pairing, and the unfused path (its fused one is TransformerEngine's kernel)."""

    rotary_interleaved: bool
    apply_rope_fusion: bool = False
    multi_latent_attention: bool = False
    mrope_section: Optional[list] = None


class RankGroup:
    """A context-parallel group as an interface asks of a process group (``size()``,
    ``rank()``) without torch.distributed: ``size`` ranks, this one ``rank`` (one rank of
    one by default; ``context_parallel`` makes the ranks of --cp-size)."""

    def __init__(self, size: int = 1, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"RankGroup(size={self._size}, rank={self._rank})"


def _seqlen_offsets(call):
    """Each sequence's first position as its ``seqlen_offsets`` class asks (an int where the
    sequences share one, else a tensor; int32 unless int64 is asked for)."""
    offsets = call.sequence_offsets()
    shared = offsets.numel() == 0 or bool((offsets == offsets[0]).all())
    wanted = call.choice("seqlen_offsets")
    if shared and wanted in ("", "0", "int"):
        value = int(offsets[0]) if offsets.numel() else 0
        call.passed["seqlen_offsets"] = "int" if value else "0"
        return value
    dtype = torch.int64 if wanted == "int64 tensor" else torch.int32
    call.passed["seqlen_offsets"] = "int64 tensor" if dtype == torch.int64 else "int32 tensor"
    return offsets.to(dtype)


# entries a "longer buffer" of start positions has past the batch (TransformerEngine's inference
# buffer holds max_batch_size of them, zeros past the live requests)
BUFFER_EXTRA = 3


def _start_positions(call):
    """Each sequence's first position, an int32 tensor (None where all are 0, as its
    ``start_positions`` class says); a ``longer buffer``: the same, then zeros."""
    if call.cp > 1:  # TransformerEngine's callers give offsets through freqs under context parallelism
        call.passed["start_positions"] = "None"
        return None
    offsets = call.sequence_offsets()
    wanted = call.choice("start_positions")
    if not bool(offsets.any()) and wanted in ("", "None"):
        call.passed["start_positions"] = "None"
        return None
    out = offsets.to(torch.int32)
    if wanted == "longer buffer":
        out = torch.cat((out, out.new_zeros(BUFFER_EXTRA)))
    call.passed["start_positions"] = "longer buffer" if wanted == "longer buffer" else "(b,) int32"
    return out


def _cos_sin(call, which: int):
    """cos or sin (a table by position, or per token: one row per batch row, or one row for a
    batch whose rows share positions, as its ``cos rows`` class asks)."""
    table = call.cos_sin()[which]
    if call.table.by != "token" or call.packed:
        return table
    p = call.positions
    shared = p.shape[0] > 1 and bool((p == p[:1]).all())
    if call.choice("cos rows") == "(1, s, D)" and shared:
        call.passed["cos rows"] = "(1, s, D)"
        return table[:1]
    call.passed["cos rows"] = "(b, s, D)"
    return table


def _flag(call, factor: str, value: bool) -> bool:
    """A flag the call passes, noted as its ``factor`` class ("True", "False")."""
    call.passed[factor] = str(value)
    return value


def _ranks(call) -> int:
    """The context-parallel ranks of the call (noted as its ``context parallel`` class)."""
    call.passed["context parallel"] = "N ranks" if call.cp > 1 else "1 rank"
    return call.cp


def _scale(call):
    scaling = call.convention.scaling
    return getattr(scaling, "factor", 1) if scaling.rope_type == "linear" else 1


def _yarn_factor(call) -> float:
    scaling = call.convention.scaling
    return float(scaling.factor) if scaling.rope_type == "yarn" else 1.0


def _yarn_range(call) -> tuple:
    """The pair indices (low, high) YaRN's ramp runs between, as the kernel takes them (its
    callers pass 0.0, 0.0 without YaRN)."""
    scaling = call.convention.scaling
    if scaling.rope_type != "yarn":
        return 0.0, 0.0
    low, high = yarn_correction_range(
        call.rotary_dim,
        call.convention.base,
        scaling.original_max_position_embeddings,
        scaling.beta_fast,
        scaling.beta_slow,
        scaling.truncate,
    )
    return float(low), float(high)


def _freqs(call):
    return call.row_table("freqs") if call.table.by == "position" else call.token_angles()


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        # what every call makes
        Role("positions", "the tokens' positions, flattened (T,)", lambda call: call.token_positions()),
        Role("head_size", "head_dim, an int", lambda call: call.head_dim),
        Role("cache", "the cos_sin_cache indexed by position", lambda call: call.row_table("cache")),
        Role("cos", "the cos table", lambda call: _cos_sin(call, 0)),
        Role("sin", "the sin table", lambda call: _cos_sin(call, 1)),
        Role("freqs", "the angle table (by position or per token)", _freqs),
        Role(
            "config",
            "Megatron's TransformerConfig (rotary_interleaved)",
            lambda call: RopeConfig(rotary_interleaved=call.preset.layouts[call.convention.layout]),
        ),
        Role("mscale", "the scaling's attention factor", lambda call: call.convention.amplitude, attention_factor=True),
        Role("layout", "the pairing flag (is_neox, interleave, interleaved)", lambda call: call.layout_flag()),
        Role(
            "rotary_dim",
            "the rotary dimension, None for the whole head",
            lambda call: call.rotary_dim if call.rotary_dim < call.head_dim else None,
        ),
        Role(
            "rotary_width",
            "the rotary dimension, an int (head_size for the whole head)",
            lambda call: call.rotary_dim,
        ),
        Role("scale", "the linear scaling factor (rope_scale)", _scale),
        Role("base", "the base (rope_theta)", lambda call: call.convention.base),
        Role(
            "inplace",
            "whether the result is written into x (declared, or the call's inplace class)",
            lambda call: _flag(call, "inplace", call.form.inplace or call.preset.writes_x(call.form.choices)),
        ),
        Role(
            "fused",
            "the fused path (the call's fused class)",
            lambda call: _flag(call, "fused", call.choice("fused") == "True"),
        ),
        Role("seqlen_offsets", "each sequence's first position: an int, or a (b,) tensor", _seqlen_offsets),
        Role("start_positions", "each sequence's first position, an int32 tensor (None: all 0)", _start_positions),
        Role(
            "cu_seqlens",
            "the packed sequences' cumulative lengths, int32 (b + 1,) (None unpacked)",
            lambda call: cu_seqlens(call.lengths()).to(call.x.device) if call.packed else None,
        ),
        Role(
            "max_seqlen",
            "the longest packed sequence (None unpacked)",
            lambda call: max(call.lengths(), default=0) if call.packed else None,
        ),
        Role(
            "tensor_format",
            "sbhd, bshd or thd",
            lambda call: "thd" if call.packed else call.format_variant(),
        ),
        # context parallelism: one rank of one unless --cp-size
        Role(
            "cp_size", "the context-parallel ranks", lambda call: _ranks(call), default_only=True, context_parallel=True
        ),
        Role("cp_rank", "this rank", lambda call: call.rank, default_only=True, context_parallel=True),
        Role(
            "cp_group",
            "a group whose size() and rank() say them",
            lambda call: RankGroup(_ranks(call), call.rank),
            context_parallel=True,
        ),
        # an M-RoPE run's sections (--family mrope --api)
        Role(
            "mrope_section",
            "the M-RoPE sections, pairs per axis (t, h, w), a list of ints",
            lambda call: list(call.form.mrope.sections) if call.form.mrope is not None else None,
        ),
        Role(
            "mrope_interleaved",
            "whether the sections interleave (Qwen3-VL)",
            lambda call: bool(call.form.mrope.interleaved) if call.form.mrope is not None else False,
        ),
        # never passed: their parameters' defaults
        Role("none", "None (a deprecated, unused parameter)", lambda call: None, default_only=True),
        Role("unsqueeze_dim", "1 (cos and sin broadcast over heads at dim 1)", lambda call: 1, default_only=True),
        # the tensors, in the interface's format
        Role("x", "the input", given_by="the tensor format"),
        Role("query", "q", given_by="the tensor format"),
        Role("key", "k (None where the case has no key heads)", given_by="the tensor format"),
        # a fused KV-cache write (ropecheck.calling.kv_cache)
        Role("value", "v, as many heads as k", given_by="the KV cache"),
        Role("key_cache", "the key cache", given_by="the KV cache"),
        Role("value_cache", "the value cache", given_by="the KV cache"),
        Role("slot_mapping", "each token's cache slot", given_by="the KV cache"),
        Role("k_scale", "1.0, a float32 tensor", given_by="the KV cache"),
        Role("v_scale", "1.0, a float32 tensor", given_by="the KV cache"),
        Role("kv_cache_dtype", '"auto"', given_by="the KV cache"),
        # a fused QK-RMSNorm + RoPE kernel's packed qkv (ropecheck.calling.qk_norm)
        Role("qkv", "the packed (T, (Hq + Hk + Hv) * D) projection, rotated in place", given_by="the qk norm"),
        Role("num_heads_q", "q's heads, an int", given_by="the qk norm"),
        Role("num_heads_k", "k's heads, an int", given_by="the qk norm"),
        Role("num_heads_v", "v's heads (as many as k's), an int", given_by="the qk norm"),
        Role("eps", "the RMSNorm's epsilon, a float", given_by="the qk norm"),
        Role("q_weight", "q's RMSNorm weights (D,), drawn, in qkv's dtype", given_by="the qk norm"),
        Role("k_weight", "k's RMSNorm weights (D,), drawn, in qkv's dtype", given_by="the qk norm"),
        # a kernel that forms YaRN's frequencies itself (SGLang's fused_qk_norm_rope): 1, 0, 0 unscaled
        Role("yarn_factor", "YaRN's factor (1.0 unscaled)", _yarn_factor),
        Role("yarn_low", "the first pair YaRN's ramp starts at (0.0 unscaled)", lambda call: _yarn_range(call)[0]),
        Role("yarn_high", "the pair YaRN's ramp ends at (0.0 unscaled)", lambda call: _yarn_range(call)[1]),
        # fp8 quantization (ropecheck.calling.quantized)
        Role("q_rope", "q's rotated features", given_by="the fp8 quantization"),
        Role("k_rope", "k's rotated features", given_by="the fp8 quantization"),
        Role("q_nope", "q's features past the rotary dimension", given_by="the fp8 quantization"),
        Role("k_nope", "k's features past the rotary dimension", given_by="the fp8 quantization"),
        Role("quantize_dtype", "the fp8 dtype", given_by="the fp8 quantization"),
        Role("quant_scale_q", "q's per-tensor scale", given_by="the fp8 quantization"),
        Role("quant_scale_kv", "k's per-tensor scale", given_by="the fp8 quantization"),
    )
}


def role(name: str) -> Role:
    if name not in ROLES:
        raise ValueError(f"unknown parameter role {name!r}; known: {', '.join(ROLES)}")
    return ROLES[name]


def value(call, name: str, given: dict) -> Any:
    """The value of role ``name`` in ``call``: what a stage of the call supplied (``given``:
    role -> value), else the role's own."""
    if name in given:
        return given[name]
    made = role(name).value
    if made is None:
        raise ValueError(f"role {name!r} is given by {role(name).given_by}, which did not supply it")
    return made(call)
