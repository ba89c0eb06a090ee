"""Library signatures as presets (``--api NAME``): a kernel written to a real library's
RoPE interface is checked as it is, with no wrapper.

A ``Preset`` is data: the interface's parameters in order (``Param``: its name, the role
of the value ropecheck passes, its default), what it returns (its results written into the
tensors it was given, or returned), which canonical call forms it serves, how its tensors
are laid out (``formats.FORMATS``), and the ``properties.interfaces.interface.Interface``
the checks read (the table it is fed and its dtype, the memory layouts and call variants
its tensors come in, the names of its arguments). ``api_call.invoke`` turns one canonical
call into a call of the preset and its results back.

How ropecheck calls a preset, as its library's callers do: the parameters without a
default positionally, in order; those with a default by keyword, and only when the call
needs a value other than the default (a kernel may have more parameters, with defaults).
``--layout`` becomes the layout argument (``is_neox``, ``interleave``, ``interleaved``),
``--rotary-dim`` the table's width (or ``rotary_dim``), ``--base`` and ``--scaling`` the
table ropecheck builds (for a preset that computes its own angles: ``rope_theta`` = base,
``rope_scale`` = the linear scaling factor).

Adding a preset is one record here (and, for a new tensor format or role, a record of
``formats.FORMATS`` or ``roles.ROLES``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

from ropecheck.calling.roles import role
from ropecheck.properties.core.quantization import FORMATS
from ropecheck.properties.inputs.cases import INTERFACE_LAYOUTS
from ropecheck.properties.interfaces.interface import Interface, Table
from ropecheck.properties.interfaces.space import Factor, Space, ValueClass

REQUIRED = "<required>"  # a Param's default: none (it is passed positionally)
TABLE_POSITIONS = 2**16 - 1  # the largest position of a table indexed by position, by default

# the realistic layouts of a serving engine's (tokens, heads, head_dim) tensors: bshd
# storage (the batch flattens into tokens as a view), fused qkv slices, padded heads, MLA
TOKEN_LAYOUTS = ("contiguous", "qkv-slice", "strided-heads", "padded", "padded-64", *INTERFACE_LAYOUTS)
FP8_FORMATS = tuple(FORMATS)  # the formats a quantizing preset's outputs are drawn in


@dataclass(frozen=True)
class Param:
    """One parameter of the interface: its name, the role of what ropecheck passes for it
    (``roles.ROLES``), its default (``REQUIRED``: positional, always passed), and
    whether it is keyword-only (``keyword``: always passed by name, as SGLang's ``*,
    is_neox``; a kernel whose parameter is positional takes it so too)."""

    name: str
    role: str
    default: Any = REQUIRED
    keyword: bool = False

    def __post_init__(self):
        role(self.role)  # a known role (roles.ROLES), or ValueError

    @property
    def positional(self) -> bool:
        return not self.keyword and (self.default is REQUIRED or self.default == REQUIRED)

    def shown(self) -> str:
        if self.default is REQUIRED or self.default == REQUIRED:
            return self.name
        shown = f"{self.default:g}" if isinstance(self.default, float) else repr(self.default)
        return f"{self.name}={shown}"


@dataclass(frozen=True)
class Preset:
    """A library's RoPE interface. ``returns``: "inplace" (results written into the
    query/key tensors it was given; it returns None), "qk" ((q_out, k_out)), "x" (y) or
    "quantized" ((q_rope_out, k_rope_out, q_nope_out, k_nope_out) in fp8: q and k split
    at the rotary dimension, ``ropecheck.calling.quantized``);
    ``calls``: the canonical call forms it serves, the first the default; ``tensors``: how
    its tensors are laid out (``formats.FORMATS``); ``k``: "required" or "optional" (None
    allowed) for a (q, k) interface; ``offsets``: positions reach it as each row's (or
    packed sequence's) offset, so they count up from it; ``layouts``: the argument values
    of --layout; ``scalings``: the --scaling kinds it can be given (None: any the table
    takes); ``max_position``: the largest position of its table by default; ``cache``: the
    KV cache it writes each token's rotated k and its v into ("paged" or "slots",
    ``kv_cache``; "" none)."""

    name: str
    library: str
    params: tuple
    returns: str
    calls: tuple
    tensors: str
    interface: Interface
    k: str = "required"
    backward: bool = False
    offsets: bool = False
    layouts: dict = field(default_factory=lambda: {"half": True, "interleaved": False})
    scalings: Optional[tuple] = None
    max_position: Optional[int] = None
    partial: bool = True  # takes a rotary dimension below the head size (features past it untouched)
    cache: str = ""
    description: str = ""

    @property
    def table(self) -> Optional[Table]:
        return self.interface.table

    @property
    def inplace(self) -> bool:
        return self.returns == "inplace"

    def capabilities(self, call: Optional[str] = None) -> dict:
        """The Target fields the interface decides, for a call in ``call`` (default its
        first form): how it is called and returns, whether k may be None, how positions
        reach it, the length of a table indexed by position."""
        call = call or self.calls[0]
        by_row = self.table is not None and self.table.by == "position"
        return {
            "call": call,
            "api": self.name,
            "inplace": self.inplace,
            "k_optional": self.k == "optional",
            "row_offsets": self.offsets and call == "x",
            "max_position": self.max_position if by_row else None,
        }

    def signature(self) -> str:
        out = {
            "inplace": " (in place)",
            "qk": " -> (q_out, k_out)",
            "x": " -> y",
            "quantized": " -> (q_rope_out, k_rope_out, q_nope_out, k_nope_out)",
        }[self.returns]
        shown, star = [], False
        for p in self.params:
            if p.keyword and not star:
                shown.append("*")
                star = True
            shown.append(p.shown())
        return f"fn({', '.join(shown)}){out}"

    def positional(self) -> list:
        return [p for p in self.params if p.positional]

    def keywords(self) -> list:
        return [p for p in self.params if not p.positional]

    def check_signature(self, fn) -> Optional[str]:
        """Why ``fn`` cannot be called as this preset calls it (None: it can, or its
        signature cannot be read: the first call will tell)."""
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return None
        try:
            # a role always at its default is never passed: a kernel need not have the parameter
            # (transformers' apply_rotary_pos_emb has no position_ids since PR #43255)
            passed = {p.name: None for p in self.keywords() if not role(p.role).default_only}
            signature.bind(*[None] * len(self.positional()), **passed)
        except TypeError as exc:
            name = getattr(fn, "__name__", "target")
            return (
                f"--api {self.name} calls the target as {self.signature()} ({self.library}); "
                f"its signature is {name}{signature}: {exc}"
            )
        return None


def _words(**words) -> dict:
    return words


def _choice(factor: str, *classes: str) -> Space:
    """An argument space of one factor: each call takes one of ``classes``."""
    return Space((Factor(factor, tuple(ValueClass(c) for c in classes)),))


# a fused cache-write call: with padding tokens (slot -1) before and after the batch, or none
KV_VARIANTS = ("unpadded", "padded")
_TOKENS = _words(positions="positions", query="query", key="key", head_size="head_size", layout="is_neox")

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            "vllm",
            "vLLM's ops.rotary_embedding (csrc/pos_encoding_kernels.cu; SGLang's sgl_kernel.rotary_embedding)",
            (
                Param("positions", "positions"),
                Param("query", "query"),
                Param("key", "key"),
                Param("head_size", "head_size"),
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout"),
            ),
            "inplace",
            ("qk",),
            "tokens",
            Interface(
                "vllm",
                Table("cos-sin", "cos_sin_cache"),
                TOKEN_LAYOUTS,
                _choice("query", "flat", "heads"),
                own_k_layout=True,
                tokens=True,
                words=_TOKENS,
            ),
            k="optional",
            max_position=TABLE_POSITIONS,
            description="positions int64 (T,); query (T, Hq*D) or (T, Hq, D), strided views included; key "
            "likewise or None; cos_sin_cache (P, rotary_dim) in query's dtype, rows cat(cos, sin) indexed by "
            "position; rotated in place, features past rotary_dim untouched",
        ),
        Preset(
            "flashinfer-cos-sin-cache",
            "FlashInfer's apply_rope_with_cos_sin_cache_inplace (SGLang's sgl_kernel has it too)",
            (
                Param("positions", "positions"),
                Param("query", "query"),
                Param("key", "key"),
                Param("head_size", "head_size"),
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout", True),
            ),
            "inplace",
            ("qk",),
            "tokens",
            Interface(
                "flashinfer-cos-sin-cache",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                TOKEN_LAYOUTS,
                _choice("query", "flat", "heads"),
                own_k_layout=True,
                tokens=True,
                words=_TOKENS,
            ),
            max_position=TABLE_POSITIONS,
            description="vllm's signature with a float32 cos_sin_cache (P, rotary_dim); key required",
        ),
        Preset(
            "vllm-kvcache",
            "vLLM's fused rope + reshape_and_cache_flash (rotary embedding and the paged KV cache write in one kernel)",
            (
                Param("query", "query"),
                Param("key", "key"),
                Param("value", "value"),
                Param("positions", "positions"),
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout"),
                Param("key_cache", "key_cache"),
                Param("value_cache", "value_cache"),
                Param("slot_mapping", "slot_mapping"),
                Param("k_scale", "k_scale"),
                Param("v_scale", "v_scale"),
                Param("kv_cache_dtype", "kv_cache_dtype"),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface(
                "vllm-kvcache",
                Table("cos-sin", "cos_sin_cache"),
                TOKEN_LAYOUTS,
                _choice("padding", *KV_VARIANTS),
                own_k_layout=True,
                tokens=True,
                words=_TOKENS,
            ),
            max_position=TABLE_POSITIONS,
            cache="paged",
            description="query (T, Hq, D), key, value (T, Hk, D), strided views included; "
            "positions int64 (T,); cos_sin_cache (P, rotary_dim) in query's dtype; key_cache, value_cache "
            "(num_blocks, block_size, Hk, D) in key's dtype (kv_cache_dtype 'auto', k_scale = v_scale = 1.0 float32 "
            "tensors); slot_mapping int64 (T,), slot s at block s // block_size, offset s % block_size, -1 for a "
            "token not cached; q and k rotated in place",
        ),
        Preset(
            "sglang-kvcache",
            "SGLang's apply_rope_inplace_with_kvcache (rope and the KV cache write in one kernel)",
            (
                Param("q", "query"),
                Param("k", "key"),
                Param("v", "value"),
                Param("k_cache", "key_cache"),
                Param("v_cache", "value_cache"),
                Param("cos_sin_cache", "cache"),
                Param("positions", "positions"),
                Param("out_loc", "slot_mapping"),
                Param("is_neox", "layout", keyword=True),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface(
                "sglang-kvcache",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                TOKEN_LAYOUTS,
                _choice("padding", *KV_VARIANTS),
                own_k_layout=True,
                tokens=True,
                words=_words(positions="positions", query="q", key="k", layout="is_neox"),
            ),
            max_position=TABLE_POSITIONS,
            cache="slots",
            description="q (T, Hq, D), k, v (T, Hk, D), strided views included; k_cache, v_cache (slots, Hk, D) in "
            "k's dtype; cos_sin_cache (P, rotary_dim) float32; positions int64 (T,); out_loc int64 (T,) the slot per "
            "token, -1 for a token not cached; is_neox keyword-only; q and k rotated in place",
        ),
        Preset(
            "flashinfer-rope-fp8",
            "FlashInfer's rope_quantize_fp8 (RoPE, then fp8 quantization with per-tensor scales)",
            (
                Param("q_rope", "q_rope"),
                Param("k_rope", "k_rope"),
                Param("q_nope", "q_nope"),
                Param("k_nope", "k_nope"),
                Param("cos_sin_cache", "cache"),
                Param("pos_ids", "positions"),
                Param("is_neox", "layout", True),
                Param("quantize_dtype", "quantize_dtype", None),
                Param("quant_scale_q", "quant_scale_q", 1.0),
                Param("quant_scale_kv", "quant_scale_kv", 1.0),
            ),
            "quantized",
            ("qk",),
            "tokens-heads",
            Interface(
                "flashinfer-rope-fp8",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                TOKEN_LAYOUTS,
                _choice("quantize_dtype", *FP8_FORMATS),
                own_k_layout=True,
                tokens=True,
                quantized=FP8_FORMATS,
                words=_words(positions="pos_ids", query="q_rope", key="k_rope", layout="is_neox"),
            ),
            max_position=TABLE_POSITIONS,
            description="q_rope (nnz, Hq, rotary_dim), k_rope (nnz, Hk, rotary_dim), q_nope and k_nope the "
            "features past rotary_dim (nnz, H, D - rotary_dim), strided views of q and k; cos_sin_cache float32 "
            "(P, rotary_dim), rows cat(cos, sin); quantize_dtype float8_e4m3fn or float8_e5m2 (each input draws "
            "one), quant_scale_q and quant_scale_kv per-tensor scales (never 1); returns the four fp8 tensors "
            "saturate(v * scale)",
        ),
        Preset(
            "flashinfer-pos-ids",
            "FlashInfer's apply_rope_pos_ids (cos/sin computed in the kernel)",
            (
                Param("q", "query"),
                Param("k", "key"),
                Param("pos_ids", "positions"),
                Param("rotary_dim", "rotary_dim", None),
                Param("interleave", "layout", False),
                Param("rope_scale", "scale", 1),
                Param("rope_theta", "base", 1e4),
            ),
            "qk",
            ("qk",),
            "tokens-heads",
            Interface(
                "flashinfer-pos-ids",
                None,
                TOKEN_LAYOUTS,
                _choice("pos_ids", "int64", "int32"),
                own_k_layout=True,
                tokens=True,
                words=_words(positions="pos_ids", query="q", key="k", layout="interleave", rotary_dim="rotary_dim"),
            ),
            layouts={"half": False, "interleaved": True},
            scalings=("default", "linear"),
            description="q (nnz, Hq, D), k (nnz, Hk, D), pos_ids int32 or int64 (nnz,); rope_theta = --base, "
            "rope_scale = the linear --scaling factor; returns new tensors",
        ),
        Preset(
            "flash-attn",
            "flash-attn's apply_rotary_emb (flash_attn/layers/rotary.py, Triton)",
            (
                Param("x", "x"),
                Param("cos", "cos"),
                Param("sin", "sin"),
                Param("interleaved", "layout", False),
                Param("inplace", "inplace", False),
                Param("seqlen_offsets", "seqlen_offsets", 0),
                Param("cu_seqlens", "cu_seqlens", None),
                Param("max_seqlen", "max_seqlen", None),
            ),
            "x",
            ("x", "packed"),
            "bshd",
            Interface(
                "flash-attn",
                Table("cos-sin", "cos and sin"),
                words=_words(positions="seqlen_offsets", query="x", layout="interleaved"),
            ),
            backward=True,
            offsets=True,
            layouts={"half": False, "interleaved": True},
            max_position=TABLE_POSITIONS,
            description="x (b, s, h, d), or (total, h, d) with cu_seqlens (--call packed); cos, sin (P, r/2) in x's "
            "dtype, row = position; seqlen_offsets an int or an int32 (b,) tensor",
        ),
        Preset(
            "hf",
            "transformers' apply_rotary_pos_emb (liger-kernel's liger_rotary_pos_emb and unsloth take the same)",
            (
                Param("q", "query"),
                Param("k", "key"),
                Param("cos", "cos"),
                Param("sin", "sin"),
                Param("position_ids", "none", None),
                Param("unsqueeze_dim", "unsqueeze_dim", 1),
            ),
            "qk",
            ("qk",),
            "bhsd",
            Interface(
                "hf",
                Table("cos-sin", "cos and sin", by="token", width="full"),
                words=_words(positions="position", query="q", key="k"),
            ),
            backward=True,
            layouts={"half": None, "interleaved": None},
            partial=False,
            description="q (b, Hq, s, D), k (b, Hk, s, D); cos, sin (b, s, r) in q's dtype, each frequency twice "
            "(cat(f, f) for half, repeat_interleave(f, 2) for interleaved); returns new tensors",
        ),
        Preset(
            "te",
            "TransformerEngine's apply_rotary_pos_emb (Megatron-Core takes the same freqs)",
            (
                Param("t", "x"),
                Param("freqs", "freqs"),
                Param("tensor_format", "tensor_format", "sbhd"),
                Param("start_positions", "start_positions", None),
                Param("interleaved", "layout", False),
                Param("cu_seqlens", "cu_seqlens", None),
                Param("cp_size", "cp_size", 1),
                Param("cp_rank", "cp_rank", 0),
            ),
            "x",
            ("x", "packed"),
            "te",
            Interface(
                "te",
                Table("angles", "freqs", dtype="float32", width="full"),
                space=_choice("tensor_format", "sbhd", "bshd"),
                words=_words(positions="start_positions", query="t", layout="interleaved"),
            ),
            backward=True,
            offsets=True,
            layouts={"half": False, "interleaved": True},
            max_position=TABLE_POSITIONS,
            description="t (s, b, h, d) sbhd, (b, s, h, d) bshd, or (total, h, d) thd with cu_seqlens (--call "
            "packed); freqs (P, 1, 1, r) float32 angles, each frequency twice; start_positions an int32 (b,) "
            "tensor",
        ),
        Preset(
            "megatron",
            "Megatron-Core's apply_rotary_pos_emb (megatron/core/models/common/embeddings/rope_utils.py)",
            (
                Param("t", "x"),
                Param("freqs", "freqs"),
                Param("config", "config"),
                Param("cu_seqlens", "cu_seqlens", None),
                Param("mscale", "mscale", 1.0),
                Param("cp_group", "cp_group", None),
            ),
            "x",
            ("x", "packed"),
            "te",
            Interface(
                "megatron",
                Table("angles", "freqs", dtype="float32", by="token", width="full"),
                space=_choice("tensor_format", "sbhd"),
                words=_words(positions="freqs", query="t", layout="config.rotary_interleaved"),
            ),
            backward=True,
            layouts={"half": False, "interleaved": True},
            description="t (s, b, h, d) sbhd, or (total, h, d) thd with cu_seqlens (--call packed); freqs float32 "
            "angles per token, each frequency twice: (s, b, 1, r) sbhd (as its multimodal callers pass them), "
            "(total, 1, 1, r) thd (one row per packed token); config with rotary_interleaved = --layout "
            "interleaved and apply_rope_fusion off; mscale the scaling's attention factor; cp_group one rank "
            "(--cp-size N: N ranks)",
        ),
    )
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown --api {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
