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
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ropecheck.calling.roles import role
from ropecheck.properties.core.quantization import FORMATS
from ropecheck.properties.inputs.cases import INTERFACE_LAYOUTS, MEMORY_LAYOUTS
from ropecheck.properties.interfaces import draws
from ropecheck.properties.interfaces.interface import Interface, Table
from ropecheck.properties.interfaces.space import Factor, Rule, Space, value_class

REQUIRED = "<required>"  # a Param's default: none (it is passed positionally)
TABLE_POSITIONS = 2**16 - 1  # the largest position of a table indexed by position, by default

# the realistic layouts of a serving engine's (tokens, heads, head_dim) tensors: bshd
# storage (the batch flattens into tokens as a view), fused qkv slices, padded heads, MLA
TOKEN_LAYOUTS = ("contiguous", "qkv-slice", "strided-heads", "padded", "padded-64", *INTERFACE_LAYOUTS)
FP8_FORMATS = tuple(FORMATS)  # the formats a quantizing preset's outputs are drawn in


@dataclass(frozen=True)
class Param:
    """One parameter of the interface: its name, the role of what ropecheck passes for it
    (``roles.ROLES``), its default (``REQUIRED``: none), how its library's callers pass it,
    and the classes of the values they pass (``factors``: ``properties.interfaces.space``
    factors, each citing where the callers pass them).

    Passing: a parameter without a default positionally, in order; ``keyword``: it is
    keyword-only (SGLang's ``*, is_neox``; a kernel whose parameter is positional takes it
    by name too); ``by_name``: its callers always pass it by name, even at its default; the
    others by name when the call's value is not the default. ``optional``: a kernel written
    to the interface may lack it (then every call keeps its default, and its other classes
    are not reached: the run says so)."""

    name: str
    role: str
    default: Any = REQUIRED
    keyword: bool = False
    by_name: bool = False
    optional: bool = False
    factors: tuple = ()

    def __post_init__(self):
        role(self.role)  # a known role (roles.ROLES), or ValueError

    @property
    def required(self) -> bool:
        return self.default is REQUIRED or self.default == REQUIRED

    @property
    def positional(self) -> bool:
        return self.required and not self.keyword and not self.by_name

    @property
    def always(self) -> bool:
        """Passed in every call (positionally, or by name)."""
        return self.required or self.by_name

    def shown(self) -> str:
        if self.required:
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
    ``kv_cache``; "" none), with its library's conventions: ``padding_slot`` (the slot a
    padding token carries: -1, not cached, or a slot the pool reserves for padding) and
    ``key_cached`` ("key": the rotated k is written into key and cached; "cache": it goes
    into the cache, and key is left as given or rotated in place, as the library's versions
    differ). ``rules``: which classes of its parameters' values go together; its
    ``interface.space`` is made of its parameters' factors and these rules."""

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
    padding_slot: int = -1
    key_cached: str = "key"
    rules: tuple = ()
    in_place_when: tuple = ()  # (factor, class): a call in this class writes its result into x
    # M-RoPE (--family mrope): "" not taken; "takes": a 1-D interface an M-RoPE run calls with
    # positions (3, T), its kernel bound to its sections (MROPE_PARAMS passed by name where its
    # signature has them); "only": an M-RoPE interface, the sections among its parameters
    mrope: str = ""
    description: str = ""

    def __post_init__(self):
        space = Space(tuple(f for p in self.params for f in p.factors), self.rules)
        object.__setattr__(self, "interface", replace(self.interface, space=space))

    @property
    def mrope_params(self) -> tuple:
        """The parameters an M-RoPE run adds to a 1-D interface's call (where the kernel has them)."""
        return MROPE_PARAMS if self.mrope == "takes" else ()

    @property
    def table(self) -> Optional[Table]:
        return self.interface.table

    @property
    def inplace(self) -> bool:
        return self.returns == "inplace"

    @property
    def space(self) -> Space:
        return self.interface.space

    def writes_x(self, choices) -> bool:
        """Whether a call with ``choices`` (a case's classes) writes its result into x (an
        ``inplace=True`` call)."""
        return any(pair in tuple(choices) for pair in self.in_place_when)

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
            # (transformers' apply_rotary_pos_emb has no position_ids since PR #43255); nor an optional one
            passed = {p.name: None for p in self.keywords() if not role(p.role).default_only and not p.optional}
            signature.bind(*[None] * len(self.positional()), **passed)
        except TypeError as exc:
            name = getattr(fn, "__name__", "target")
            return (
                f"--api {self.name} calls the target as {self.signature()} ({self.library}); "
                f"its signature is {name}{signature}: {exc}"
            )
        return None

    def optional_taken(self, fn) -> tuple:
        """The optional parameters ``fn``'s signature has (all of them where it cannot be read)."""
        optional = tuple(p.name for p in (*self.params, *self.mrope_params) if p.optional)
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return optional
        if any(q.kind == inspect.Parameter.VAR_KEYWORD for q in parameters.values()):
            return optional
        return tuple(name for name in optional if name in parameters)


# what an M-RoPE run passes a 1-D interface's kernel beyond its parameters, by name, where its
# signature has them (SGLang's and vLLM's M-RoPE kernels take them; one bound to its sections not)
MROPE_PARAMS = (
    Param("mrope_section", "mrope_section", None, optional=True),
    Param("mrope_interleaved", "mrope_interleaved", False, optional=True),
)


def _words(**words) -> dict:
    return words


def _by_name(params: tuple) -> tuple:
    """``params``, each passed by name in every call (its callers pass every argument so)."""
    return tuple(replace(p, by_name=True) for p in params)


# --- the classes of values real callers pass, with where they pass them -------------------

VLLM = "vllm-project/vllm"
FLASHINFER = "flashinfer-ai/flashinfer"
SGLANG = "sgl-project/sglang"
FLASH_ATTN = "Dao-AILab/flash-attention"
TE = "NVIDIA/TransformerEngine"
MEGATRON = "NVIDIA/Megatron-LM"
HF = "huggingface/transformers"

_SERVING_TOKENS = (
    "the engines flatten a scheduled batch into tokens: decode (a token per request at its own position), "
    "prefill, chunked prefill mixed with decode"
)
_QKV_SPLIT = f"{VLLM}: vllm/model_executor/models/llama.py (q, k, v = qkv.split(...): strided views of one buffer)"
_MLA = f"{VLLM}: vllm/model_executor/models/deepseek_v2.py (q_pe a slice of wider heads, k_pe of the latent row)"


# the layouts whose heads merge into one (T, H*D) row: a 2-D query or key is one of them
_FLAT_LAYOUTS = ("contiguous", "qkv-slice", "latent-slice")
_FLAT_RULES = (
    Rule("query shape", ("(T, H*D)",), "query layout", _FLAT_LAYOUTS, "a (T, H*D) view has its heads side by side"),
    Rule(
        "query shape",
        ("(T, H*D)",),
        "key layout",
        ("q's buffer", "n/a", *_FLAT_LAYOUTS),
        "a (T, H*D) view has its heads side by side",
    ),
)


def _serving_qk(source_tokens: str, key_optional: bool) -> tuple:
    """The factors of a serving engine's token tensors: their tokens, q's layout, the key and
    k's storage (and their rules)."""
    key_layout, rules = draws.key_layouts(TOKEN_LAYOUTS, f"{_QKV_SPLIT}; {_MLA}", key_optional)
    query = draws.layouts("query layout", TOKEN_LAYOUTS, f"{_QKV_SPLIT}; {_MLA}")
    key = draws.keys(
        f"{VLLM}: vllm/model_executor/layers/rotary_embedding/base.py forward_static ('key may be None in some "
        "cases, e.g. cross-layer KV sharing'); GQA and MQA models"
        if key_optional
        else "GQA and MQA models (the kernel requires a key)",
        key_optional,
    )
    return draws.tokens(source_tokens), query, key, key_layout, rules


_VLLM_TOKENS, _VLLM_QUERY, _VLLM_KEY, _VLLM_KEY_LAYOUT, _VLLM_RULES = _serving_qk(
    f"{VLLM}: vllm/model_executor/layers/rotary_embedding/base.py forward_cuda ({_SERVING_TOKENS})", True
)
_FI_TOKENS, _FI_QUERY, _FI_KEY, _FI_KEY_LAYOUT, _FI_RULES = _serving_qk(
    f"{SGLANG}: python/sglang/srt/layers/rotary_embedding.py forward_cuda ({_SERVING_TOKENS})", False
)
_FLAT = draws.choice(
    "query shape",
    (("(T, H*D)", "query and key (T, heads * head_dim)"), ("(T, H, D)", "query and key (T, heads, head_dim)")),
    f"{_QKV_SPLIT}; {VLLM}: vllm/model_executor/models/gemma3.py (q.view(-1, num_heads, head_dim): 3-D)",
)
_INT64 = draws.choice(
    "positions dtype", ("int64",), f"{VLLM}: csrc/pos_encoding_kernels.cu rotary_embedding (int64_t positions)"
)
_FI_INDEX = draws.choice(
    "positions dtype",
    ("int64", "int32"),
    f"{FLASHINFER}: csrc/rope.cu (DISPATCH_DLPACK_IDTYPE_TO_CTYPE: int32 and int64 indices)",
)
_PADDING = ("none", ("padded batch", "padding tokens before and after the batch (a CUDA-graph batch)"))

_TOKENS_WORDS = _words(positions="positions", query="query", key="key", head_size="head_size", layout="is_neox")

# --- the x interfaces: a batch (b, s, h, d) in the layouts models produce, or packed sequences
_MODEL_LAYOUTS = (
    "the layouts models hand RoPE (transposed bhsd storage, fused qkv slices, strided heads, sbhd, padding)"
)
_X_LAYOUT = draws.layouts("x layout", MEMORY_LAYOUTS, _MODEL_LAYOUTS)
_OFFSET_TOKENS = draws.tokens(
    f"{FLASH_ATTN}: flash_attn/modules/mha.py (prefill, and decode one token per sequence at its cache length); "
    f"{TE}: transformer_engine/pytorch/attention/multi_head_attention.py",
    scattered=False,
)
_CU_SEQLENS_FLASH = Factor(
    "cu_seqlens",
    (
        value_class("None", "x (b, s, h, d)", call="x"),
        value_class("given", "x (total, h, d), with cu_seqlens and max_seqlen", call="packed"),
    ),
    f"{FLASH_ATTN}: flash_attn/layers/rotary.py apply_rotary_emb (cu_seqlens: varlen, max_seqlen required with it)",
)
_SEQLEN_OFFSETS = Factor(
    "seqlen_offsets",
    (
        value_class("0", "not passed: every sequence from 0", positions="zero"),
        value_class("int", "one int > 0 for every sequence", positions="shared"),
        value_class("int32 tensor", "a (batch,) int32 tensor: each sequence's own offset", positions="distinct"),
        value_class("int64 tensor", "a (batch,) int64 tensor: each sequence's own offset", positions="distinct"),
    ),
    f"{FLASH_ATTN}: flash_attn/ops/triton/rotary.py apply_rotary (an int, or a (batch,) int32 or int64 tensor, "
    "with or without cu_seqlens); flash_attn/utils/generation.py (lengths_per_sample: int32)",
)
_TE_FORMAT = Factor(
    "tensor_format",
    (
        value_class("sbhd", "t (s, b, h, d)", call="x"),
        value_class("bshd", "t (b, s, h, d)", call="x"),
        value_class("thd", "t (total, h, d), with cu_seqlens", call="packed"),
    ),
    f"{TE}: transformer_engine/pytorch/attention/rope.py apply_rotary_pos_emb (sbhd, bshd, thd with cu_seqlens)",
)
_START_POSITIONS = Factor(
    "start_positions",
    (
        value_class("None", "every sequence from 0", positions="zero"),
        value_class("(b,) int32", "an int32 tensor: each sequence's first position", positions="distinct"),
        value_class(
            "longer buffer", "an int32 buffer longer than the batch: its first b entries", positions="distinct"
        ),
    ),
    f"{TE}: transformer_engine/pytorch/attention/inference.py (get_seqlens_pre_step: an int32 buffer of "
    "max_batch_size entries, longer than the batch)",
)
_MEGATRON_TOKENS = draws.tokens(
    f"{MEGATRON}: megatron/core/models/common/embeddings/rotary_pos_embedding.py (freqs per token: any positions, "
    "multimodal callers' included)"
)
_CU_SEQLENS_MEGATRON = Factor(
    "cu_seqlens",
    (
        value_class("None", "t (s, b, h, d)", call="x"),
        value_class("given", "t (total, h, d), freqs one row per packed token", call="packed"),
    ),
    f"{MEGATRON}: megatron/core/models/common/embeddings/rope_utils.py apply_rotary_pos_emb (sbhd, or thd with "
    "cu_seqlens)",
)

# context parallelism: a run's own (--cp-size N splits every call across N ranks)
_CP_CLASSES = (
    value_class("1 rank", "no context parallelism"),
    value_class("N ranks", "the load-balanced split over --cp-size N ranks, every rank called"),
)
_CONTEXT_PARALLEL_TE = Factor(
    "context parallel",
    _CP_CLASSES,
    f"{TE}: transformer_engine/pytorch/attention/multi_head_attention.py (cp_size=self.cp_size, cp_rank=self.cp_rank)",
)
_CONTEXT_PARALLEL_MEGATRON = Factor(
    "context parallel",
    _CP_CLASSES,
    f"{MEGATRON}: megatron/core/transformer/attention.py (cp_group=self.pg_collection.cp)",
)

# --- transformers: q and k (b, h, s, d), cos and sin per token
_HF_SOURCE = f"{HF}: src/transformers/models/llama/modeling_llama.py (LlamaAttention.forward, LlamaRotaryEmbedding)"
_HF_TOKENS = draws.tokens(f"{_HF_SOURCE}: prefill, and decode with one token per row; position_ids per row")
_HF_LAYOUT = draws.layouts("q layout", MEMORY_LAYOUTS, f"{_HF_SOURCE}: q (b, s, h, d) projections viewed transposed")
_HF_KEY = draws.keys(f"{_HF_SOURCE}: num_key_value_heads (GQA, MQA, MHA)", optional=False)
_HF_KEY_LAYOUT, _HF_KEY_RULES = draws.key_layouts(
    MEMORY_LAYOUTS, f"{_HF_SOURCE}: k_proj's own tensor; fused qkv projections (phi3, gpt_neox) split", False
)
_HF_COS = Factor(
    "cos rows",
    (
        value_class("(b, s, D)", "a row of cos and sin per batch row"),
        value_class("(1, s, D)", "one row shared by the batch, whose rows share positions", rows="same"),
    ),
    f"{_HF_SOURCE}: cos has position_ids.shape[0] rows; models pass position_ids = cache_position.unsqueeze(0)",
)
# one row of cos and sin for the batch: a batch of rows (with a single row the two classes are one)
_HF_RULES = (*_HF_KEY_RULES, Rule("cos rows", ("(1, s, D)",), "tokens", ("decode", "batch"), "a batch of rows"))

# --- fused QK-RMSNorm + RoPE over a packed qkv projection (ropecheck.calling.qk_norm)
_QK_NORM_SOURCE = (
    f"{VLLM}: vllm/compilation/qk_norm_rope_fusion.py (Qwen3's per-head q_norm, k_norm and rotary_emb after "
    "qkv.split, replaced by the fused op); csrc/fused_qknorm_rope_kernel.cu (qkv [num_tokens, (nq + nk + nv) * "
    "head_dim], contiguous)"
)
_QK_NORM_KEY = draws.keys(f"{_QK_NORM_SOURCE}: num_heads_k = num_heads_v = the model's key-value heads", False)
_QK_NORM_PADDING = draws.choice(
    "padding",
    (("none", "the scheduled tokens only"), ("padded batch", "all-zero tokens before and after (a CUDA-graph batch)")),
    f"{VLLM}: vllm/v1/worker/gpu_model_runner.py (a CUDA-graph batch is padded to its captured size: the fused op "
    "runs on every row of the padded qkv)",
)
_QK_NORM_VALUES = draws.choice(
    "qkv values",
    (
        ("model scale", "heads of a model's activations"),
        ("near eps", "heads whose mean square is near eps (eps changes the norm)"),
    ),
    f"{VLLM}: vllm/model_executor/models/qwen3.py (q_norm, k_norm = RMSNorm(head_dim, eps=rms_norm_eps): 1e-6)",
)
_QK_NORM_FACTORS = (_QK_NORM_PADDING, _QK_NORM_VALUES)
_QK_NORM_WORDS = _words(positions="position_ids", query="qkv", key="qkv", layout="is_neox")
_QK_NORM_HEADS = (
    Param("num_heads_q", "num_heads_q"),
    Param("num_heads_k", "num_heads_k"),
    Param("num_heads_v", "num_heads_v"),
    Param("head_dim", "head_size"),
    Param("eps", "eps"),
    Param("q_weight", "q_weight"),
    Param("k_weight", "k_weight"),
)
# --- SGLang's M-RoPE kernel: q and k (T, H * D), a cos_sin_cache and (3, T) positions
_SGLANG_MROPE = (
    f"{SGLANG}: python/sglang/srt/layers/rotary_embedding.py triton_mrope_fused (q, k [num_tokens, heads * "
    "head_size], positions [3, num_tokens]; q.stride(0) read: rows of a fused qkv projection)"
)
_MROPE_LAYOUTS = ("contiguous", "qkv-slice")
_MROPE_TOKENS = draws.tokens(f"{_SGLANG_MROPE}: {_SERVING_TOKENS}")
_MROPE_SHAPE = draws.choice("query shape", (("(T, H*D)", "query and key (T, heads * head_dim)"),), _SGLANG_MROPE)
_MROPE_QUERY = draws.layouts("query layout", _MROPE_LAYOUTS, _SGLANG_MROPE)
_MROPE_KEY_LAYOUT, _MROPE_RULES = draws.key_layouts(_MROPE_LAYOUTS, _SGLANG_MROPE, False)

_SGLANG_QK_NORM = (
    f"{SGLANG}: python/sglang/jit_kernel/fused_qknorm_rope.py fused_qk_norm_rope (qkv bfloat16, position_ids int32 "
    "(num_tokens,), head_dim 64, 128 or 256; the callers pass factor 1.0, low 0.0, high 0.0, attention_factor 1.0 "
    "without YaRN); jit_kernel/csrc/elementwise/fused_qknorm_rope.cuh (YaRN's frequencies formed in the kernel)"
)

PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        Preset(
            "vllm",
            "vLLM's ops.rotary_embedding (csrc/pos_encoding_kernels.cu; SGLang's sgl_kernel.rotary_embedding)",
            (
                Param("positions", "positions", factors=(_VLLM_TOKENS, _INT64)),
                Param("query", "query", factors=(_FLAT, _VLLM_QUERY)),
                Param("key", "key", factors=(_VLLM_KEY, _VLLM_KEY_LAYOUT)),
                Param("head_size", "head_size"),
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout"),
            ),
            "inplace",
            ("qk",),
            "tokens",
            Interface("vllm", Table("cos-sin", "cos_sin_cache"), words=_TOKENS_WORDS),
            k="optional",
            max_position=TABLE_POSITIONS,
            rules=(*_VLLM_RULES, *_FLAT_RULES),
            mrope="takes",
            description="positions int64 (T,); query (T, Hq*D) or (T, Hq, D), strided views included; key "
            "likewise or None; cos_sin_cache (P, rotary_dim) in query's dtype, rows cat(cos, sin) indexed by "
            "position; rotated in place, features past rotary_dim untouched",
        ),
        Preset(
            "flashinfer-cos-sin-cache",
            "FlashInfer's apply_rope_with_cos_sin_cache_inplace (SGLang's sgl_kernel has it too)",
            _by_name(
                (
                    Param("positions", "positions", factors=(_FI_TOKENS, _FI_INDEX)),
                    Param("query", "query", factors=(_FLAT, _FI_QUERY)),
                    Param("key", "key", factors=(_FI_KEY, _FI_KEY_LAYOUT)),
                    Param("head_size", "head_size"),
                    Param("cos_sin_cache", "cache"),
                    Param("is_neox", "layout", True),
                )
            ),
            "inplace",
            ("qk",),
            "tokens",
            Interface(
                "flashinfer-cos-sin-cache",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                words=_TOKENS_WORDS,
            ),
            max_position=TABLE_POSITIONS,
            rules=(*_FI_RULES, *_FLAT_RULES),
            mrope="takes",
            description="vllm's signature with a float32 cos_sin_cache (P, rotary_dim); key required; every "
            "argument passed by name, is_neox included (SGLang's calls: python/sglang/srt/layers/"
            "rotary_embedding.py forward_cuda)",
        ),
        Preset(
            "vllm-kvcache",
            "vLLM's fused rope + reshape_and_cache_flash (rotary embedding and the paged KV cache write in one kernel)",
            (
                Param("query", "query", factors=(_FI_QUERY,)),
                Param("key", "key", factors=(_FI_KEY, _FI_KEY_LAYOUT)),
                Param("value", "value"),
                Param("positions", "positions", factors=(_VLLM_TOKENS, _INT64)),
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout"),
                Param("key_cache", "key_cache"),
                Param("value_cache", "value_cache"),
                Param(
                    "slot_mapping",
                    "slot_mapping",
                    factors=(
                        draws.choice(
                            "padding",
                            _PADDING,
                            f"{VLLM}: csrc/cache_kernels.cu reshape_and_cache_flash ('slot_idx can be -1 if the "
                            "token is padded': skipped); vllm/v1/worker/block_table.py (a CUDA-graph batch's "
                            "padding gets PAD_SLOT_ID = -1)",
                        ),
                    ),
                ),
                Param("k_scale", "k_scale"),
                Param("v_scale", "v_scale"),
                Param("kv_cache_dtype", "kv_cache_dtype"),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface("vllm-kvcache", Table("cos-sin", "cos_sin_cache"), words=_TOKENS_WORDS),
            max_position=TABLE_POSITIONS,
            cache="paged",
            padding_slot=-1,
            key_cached="key",
            rules=_FI_RULES,
            mrope="takes",
            description="query (T, Hq, D), key, value (T, Hk, D), strided views included; "
            "positions int64 (T,); cos_sin_cache (P, rotary_dim) in query's dtype; key_cache, value_cache "
            "(num_blocks, block_size, Hk, D) in key's dtype (kv_cache_dtype 'auto', k_scale = v_scale = 1.0 float32 "
            "tensors); slot_mapping int64 (T,), slot s at block s // block_size, offset s % block_size, -1 for a "
            "padding token (not cached); q and k rotated in place",
        ),
        Preset(
            "sglang-kvcache",
            "SGLang's apply_rope_inplace_with_kvcache (rope and the KV cache write in one kernel)",
            (
                Param("q", "query", factors=(_FI_QUERY,)),
                Param("k", "key", factors=(_FI_KEY, _FI_KEY_LAYOUT)),
                Param("v", "value"),
                Param("k_cache", "key_cache"),
                Param("v_cache", "value_cache"),
                Param("cos_sin_cache", "cache"),
                Param(
                    "positions",
                    "positions",
                    factors=(
                        _FI_TOKENS,
                        draws.choice(
                            "positions dtype",
                            ("int64", "int32"),
                            f"{SGLANG}: python/sglang/jit_kernel/rope.py apply_rope_inplace_with_kvcache "
                            "(positions and out_loc int32 or int64, one dtype for both)",
                        ),
                    ),
                ),
                Param(
                    "out_loc",
                    "slot_mapping",
                    factors=(
                        draws.choice(
                            "padding",
                            _PADDING,
                            f"{SGLANG}: python/sglang/srt/model_executor/cuda_graph_runner.py (a padded batch's "
                            "out_cache_loc and positions are zeroed: padding tokens write slot 0); "
                            "python/sglang/srt/mem_cache/memory_pool.py ('The padded slot 0 is used for writing "
                            "dummy outputs from padded tokens.')",
                        ),
                    ),
                ),
                Param("is_neox", "layout", keyword=True),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface(
                "sglang-kvcache",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                words=_words(positions="positions", query="q", key="k", layout="is_neox"),
            ),
            max_position=TABLE_POSITIONS,
            cache="slots",
            padding_slot=0,
            key_cached="cache",
            rules=_FI_RULES,
            mrope="takes",
            description="q (T, Hq, D), k, v (T, Hk, D), strided views included; k_cache, v_cache (slots, Hk * D) in "
            "k's dtype, slot 0 reserved for padding tokens; cos_sin_cache (P, rotary_dim) float32; positions and "
            "out_loc int32 or int64 (T,), out_loc the slot per token, 0 for a padding token; is_neox keyword-only; "
            "q rotated in place, the rotated k stored in k_cache (k itself rotated in place by earlier versions, "
            "left as given since: both accepted)",
        ),
        Preset(
            "flashinfer-rope-fp8",
            "FlashInfer's rope_quantize_fp8 (RoPE, then fp8 quantization with per-tensor scales)",
            _by_name(
                (
                    Param("q_rope", "q_rope", factors=(_FI_QUERY,)),
                    Param("k_rope", "k_rope", factors=(_FI_KEY, _FI_KEY_LAYOUT)),
                    Param("q_nope", "q_nope"),
                    Param("k_nope", "k_nope"),
                    Param("cos_sin_cache", "cache"),
                    Param("pos_ids", "positions", factors=(_FI_TOKENS, _FI_INDEX)),
                    Param("is_neox", "layout", True),
                    Param(
                        "quantize_dtype",
                        "quantize_dtype",
                        None,
                        factors=(
                            draws.choice(
                                "quantize_dtype",
                                FP8_FORMATS,
                                f"{FLASHINFER}: flashinfer/rope.py rope_quantize_fp8 ('Output dtype must be "
                                "float8_e4m3fn or float8_e5m2')",
                            ),
                        ),
                    ),
                    Param("quant_scale_q", "quant_scale_q", 1.0),
                    Param("quant_scale_kv", "quant_scale_kv", 1.0),
                )
            ),
            "quantized",
            ("qk",),
            "tokens-heads",
            Interface(
                "flashinfer-rope-fp8",
                Table("cos-sin", "cos_sin_cache", dtype="float32"),
                quantized=FP8_FORMATS,
                words=_words(positions="pos_ids", query="q_rope", key="k_rope", layout="is_neox"),
            ),
            max_position=TABLE_POSITIONS,
            rules=_FI_RULES,
            description="q_rope (nnz, Hq, rotary_dim), k_rope (nnz, Hk, rotary_dim), q_nope and k_nope the "
            "features past rotary_dim (nnz, H, D - rotary_dim), strided views of q and k; cos_sin_cache float32 "
            "(P, rotary_dim), rows cat(cos, sin); pos_ids int32 or int64; quantize_dtype float8_e4m3fn or "
            "float8_e5m2 (each input draws one), quant_scale_q and quant_scale_kv per-tensor scales (never 1); "
            "every argument passed by name (SGLang's mla_quantize_and_rope_for_fp8); returns the four fp8 "
            "tensors saturate(v * scale)",
        ),
        Preset(
            "vllm-qk-norm-rope",
            "vLLM's fused_qk_norm_rope (csrc/fused_qknorm_rope_kernel.cu: per-head RMSNorm of q and k, then RoPE, "
            "in place on the packed qkv)",
            (
                Param("qkv", "qkv", factors=(_QK_NORM_KEY, *_QK_NORM_FACTORS)),
                *_QK_NORM_HEADS,
                Param("cos_sin_cache", "cache"),
                Param("is_neox", "layout"),
                Param("position_ids", "positions", factors=(_VLLM_TOKENS, _INT64)),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface("vllm-qk-norm-rope", Table("cos-sin", "cos_sin_cache"), norm="rms", words=_QK_NORM_WORDS),
            max_position=TABLE_POSITIONS,
            mrope="takes",
            description="qkv (T, (Hq + Hk + Hv) * D) contiguous, in place: each q and k head RMS-normalised over D "
            "with q_weight or k_weight (D,) in qkv's dtype and eps, then its first rotary_dim features rotated; v "
            "untouched; num_heads_v = num_heads_k; cos_sin_cache (P, rotary_dim) in qkv's dtype, rows cat(cos, sin); "
            "position_ids int64 (T,)",
        ),
        Preset(
            "sglang-qk-norm-rope",
            "SGLang's fused_qk_norm_rope (sgl_kernel and python/sglang/jit_kernel: per-head RMSNorm of q and k, then "
            "RoPE with its frequencies formed in the kernel, YaRN's included, in place on the packed qkv)",
            (
                Param("qkv", "qkv", factors=(_QK_NORM_KEY, *_QK_NORM_FACTORS)),
                *_QK_NORM_HEADS,
                Param("base", "base"),
                Param("is_neox", "layout"),
                Param(
                    "position_ids",
                    "positions",
                    factors=(
                        _FI_TOKENS,
                        draws.choice("positions dtype", ("int32",), _SGLANG_QK_NORM),
                    ),
                ),
                Param("factor", "yarn_factor"),
                Param("low", "yarn_low"),
                Param("high", "yarn_high"),
                Param("attention_factor", "mscale"),
                Param("rotary_dim", "rotary_dim", None),
            ),
            "inplace",
            ("qk",),
            "tokens-heads",
            Interface("sglang-qk-norm-rope", None, norm="rms", words=_QK_NORM_WORDS),
            scalings=("default", "yarn"),
            mrope="takes",
            description="vllm-qk-norm-rope's qkv, heads, eps and weights; base = --base; position_ids int32 (T,); "
            "factor, low, high: YaRN's factor and the pair indices of its ramp (1.0, 0.0, 0.0 without YaRN); "
            "attention_factor the scaling's attention factor, on the rotated features only; rotary_dim (None: "
            "the whole head)",
        ),
        Preset(
            "sglang-mrope",
            "SGLang's triton_mrope_fused (python/sglang/srt/layers/rotary_embedding.py: M-RoPE from a cos_sin_cache "
            "and (3, T) positions, in place)",
            (
                Param("q", "query", factors=(_MROPE_TOKENS, _MROPE_SHAPE, _MROPE_QUERY)),
                Param("k", "key", factors=(_FI_KEY, _MROPE_KEY_LAYOUT)),
                Param("cos_sin_cache", "cache"),
                Param("positions", "positions"),
                Param("mrope_section", "mrope_section"),
                Param("head_size", "head_size"),
                Param("rotary_dim", "rotary_width"),
                Param("mrope_interleaved", "mrope_interleaved"),
                Param("is_neox_style", "layout"),
            ),
            "inplace",
            ("qk",),
            "tokens",
            Interface(
                "sglang-mrope",
                Table("cos-sin", "cos_sin_cache"),
                words=_words(positions="positions", query="q", key="k", layout="is_neox_style"),
            ),
            max_position=TABLE_POSITIONS,
            rules=(*_MROPE_RULES, *_FLAT_RULES),
            mrope="only",
            description="q (T, Hq * D), k (T, Hk * D), rows of a fused qkv projection included; cos_sin_cache (P, "
            "rotary_dim) in q's dtype, rows cat(cos, sin); positions int64 (3, T): t, h, w; mrope_section the "
            "pairs per axis; rotary_dim an int; mrope_interleaved (Qwen3-VL); rotated in place",
        ),
        Preset(
            "flashinfer-pos-ids",
            "FlashInfer's apply_rope_pos_ids (cos/sin computed in the kernel)",
            (
                Param("q", "query", factors=(_FI_QUERY,)),
                Param("k", "key", factors=(_FI_KEY, _FI_KEY_LAYOUT)),
                Param("pos_ids", "positions", factors=(_FI_TOKENS, _FI_INDEX)),
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
                words=_words(positions="pos_ids", query="q", key="k", layout="interleave", rotary_dim="rotary_dim"),
            ),
            layouts={"half": False, "interleaved": True},
            scalings=("default", "linear"),
            rules=_FI_RULES,
            description="q (nnz, Hq, D), k (nnz, Hk, D), pos_ids int32 or int64 (nnz,); rope_theta = --base, "
            "rope_scale = the linear --scaling factor; returns new tensors",
        ),
        Preset(
            "flash-attn",
            "flash-attn's apply_rotary_emb (flash_attn/layers/rotary.py, Triton)",
            (
                Param("x", "x", factors=(_OFFSET_TOKENS, _X_LAYOUT)),
                Param("cos", "cos"),
                Param("sin", "sin"),
                Param("interleaved", "layout", False),
                Param(
                    "inplace",
                    "inplace",
                    False,
                    factors=(
                        draws.choice(
                            "inplace",
                            (("False", "a new tensor returned"), ("True", "x written and returned")),
                            f"{FLASH_ATTN}: flash_attn/layers/rotary.py (apply_rotary_emb_qkv_, "
                            "RotaryEmbedding.forward with a kv cache: inplace=True)",
                        ),
                    ),
                ),
                Param(
                    "seqlen_offsets",
                    "seqlen_offsets",
                    0,
                    factors=(_SEQLEN_OFFSETS,),
                ),
                Param("cu_seqlens", "cu_seqlens", None, factors=(_CU_SEQLENS_FLASH,)),
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
            rules=draws.packed_rules("cu_seqlens", ("given",), "x layout", "tokens"),
            in_place_when=(("inplace", "True"),),
            description="x (b, s, h, d), or (total, h, d) with cu_seqlens and max_seqlen; cos, sin (P, r/2) in x's "
            "dtype, row = position; seqlen_offsets an int or an int32 or int64 (b,) tensor; inplace writes x",
        ),
        Preset(
            "hf",
            "transformers' apply_rotary_pos_emb (liger-kernel's liger_rotary_pos_emb and unsloth take the same)",
            (
                Param("q", "query", factors=(_HF_TOKENS, _HF_LAYOUT)),
                Param("k", "key", factors=(_HF_KEY, _HF_KEY_LAYOUT)),
                Param("cos", "cos", factors=(_HF_COS,)),
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
            rules=_HF_RULES,
            description="q (b, Hq, s, D), k (b, Hk, s, D); cos, sin (b, s, r) per row, or (1, s, r) for a batch "
            "whose rows share positions, in q's dtype, each frequency twice (cat(f, f) for half, "
            "repeat_interleave(f, 2) for interleaved); returns new tensors",
        ),
        Preset(
            "te",
            "TransformerEngine's apply_rotary_pos_emb (Megatron-Core takes the same freqs)",
            (
                Param("t", "x", factors=(_OFFSET_TOKENS, _X_LAYOUT)),
                Param("freqs", "freqs"),
                Param("tensor_format", "tensor_format", "sbhd", factors=(_TE_FORMAT,)),
                Param(
                    "start_positions",
                    "start_positions",
                    None,
                    factors=(_START_POSITIONS,),
                ),
                Param("interleaved", "layout", False),
                Param(
                    "fused",
                    "fused",
                    False,
                    optional=True,
                    factors=(
                        draws.choice(
                            "fused",
                            (("False", "the unfused path"), ("True", "the fused kernel")),
                            f"{TE}: transformer_engine/pytorch/attention/multi_head_attention.py "
                            "(apply_rotary_pos_emb(..., fused=True))",
                        ),
                    ),
                ),
                Param("cu_seqlens", "cu_seqlens", None),
                Param("cp_size", "cp_size", 1, factors=(_CONTEXT_PARALLEL_TE,)),
                Param("cp_rank", "cp_rank", 0),
            ),
            "x",
            ("x", "packed"),
            "te",
            Interface(
                "te",
                Table("angles", "freqs", dtype="float32", width="full"),
                words=_words(positions="start_positions", query="t", layout="interleaved"),
            ),
            backward=True,
            offsets=True,
            layouts={"half": False, "interleaved": True},
            max_position=TABLE_POSITIONS,
            rules=draws.packed_rules("tensor_format", ("thd",), "x layout", "tokens"),
            description="t (s, b, h, d) sbhd, (b, s, h, d) bshd, or (total, h, d) thd with cu_seqlens; freqs "
            "(P, 1, 1, r) float32 angles, each frequency twice; start_positions an int32 (b,) tensor, or a longer "
            "buffer; fused (where the kernel has it) False or True",
        ),
        Preset(
            "megatron",
            "Megatron-Core's apply_rotary_pos_emb (megatron/core/models/common/embeddings/rope_utils.py)",
            (
                Param("t", "x", factors=(_MEGATRON_TOKENS, _X_LAYOUT)),
                Param("freqs", "freqs"),
                Param("config", "config", by_name=True),
                Param("cu_seqlens", "cu_seqlens", None, factors=(_CU_SEQLENS_MEGATRON,)),
                Param("mscale", "mscale", 1.0),
                Param("cp_group", "cp_group", None, factors=(_CONTEXT_PARALLEL_MEGATRON,)),
            ),
            "x",
            ("x", "packed"),
            "te",
            Interface(
                "megatron",
                Table("angles", "freqs", dtype="float32", by="token", width="full"),
                words=_words(positions="freqs", query="t", layout="config.rotary_interleaved"),
            ),
            backward=True,
            layouts={"half": False, "interleaved": True},
            rules=draws.packed_rules("cu_seqlens", ("given",), "x layout", "tokens"),
            description="t (s, b, h, d) sbhd, or (total, h, d) thd with cu_seqlens (--call packed); freqs float32 "
            "angles per token, each frequency twice: (s, b, 1, r) sbhd (as its multimodal callers pass them), "
            "(total, 1, 1, r) thd (one row per packed token); config (by name, as Megatron's attention passes it) "
            "with rotary_interleaved = --layout interleaved and apply_rope_fusion off; mscale the scaling's "
            "attention factor; cp_group one rank (--cp-size N: N ranks)",
        ),
    )
}


def classes_table() -> str:
    """Every preset's argument classes as a markdown table (docs/presets.md holds it; the
    test of the docs makes it again): a row per factor, with where its callers pass them."""
    rows = ["| `--api` | parameter: factor | the classes its library's callers pass | where |", "|---|---|---|---|"]
    for preset in PRESETS.values():
        for param in preset.params:
            for factor in param.factors:
                classes = ", ".join(f"`{c.name}`" for c in factor.classes if c.name != "n/a")
                rows.append(f"| `{preset.name}` | {param.name}: {factor.name} | {classes} | {factor.source} |")
    return "\n".join(rows) + "\n"


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown --api {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
