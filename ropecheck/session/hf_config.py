"""``--hf-config PATH``: the RoPE convention of a Hugging Face model's ``config.json`` as
transformers 5.23 reads it, written as ropecheck's own options (``resolve``); the option table
applies them as if they were given (``ropecheck.session.options``), so a run with
``--hf-config`` is the run those flags make. The file (or the ``config.json`` of a model
folder) is read here, as JSON; transformers is not imported and nothing is downloaded.

Where transformers reads each value (``transformers/modeling_rope_utils.py`` unless said):

- the text model's config: ``text_config`` (or ``decoder``, ``generator``) when the config
  has one, else the config itself (``PreTrainedConfig.get_text_config``, configuration_utils.py);
- the rope parameters: ``rope_parameters`` (transformers 5) or ``rope_scaling`` (older
  configs; it wins where both are), with ``rope_theta`` and ``partial_rotary_factor`` beside
  them moved in and ``type`` read as ``rope_type`` (``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``,
  ``standardize_rope_params``); ``mrope``, an older name, is ``default`` with sections
  (``Qwen2VLTextConfig.convert_rope_params_to_dict``); Phi-3's older ``su`` is not read
  (``Phi3Config.convert_rope_params_to_dict`` renames it to longrope after
  ``standardize_rope_params``, and validation then misses original_max_position_embeddings);
- per layer type: ``rope_parameters`` keyed by layer type (``nested_rope_parameter_keys``;
  Gemma 3 and 4: ``full_attention``, ``sliding_attention``; a type set to null has no RoPE),
  or Gemma 3's older form, ``rope_theta`` and ``rope_scaling`` for the full-attention layers
  and ``rope_local_base_freq`` for the sliding ones
  (``Gemma3TextConfig.convert_rope_params_to_dict``); ``--layer-type`` chooses one;
- the head size: ``head_dim``, else ``hidden_size // num_attention_heads`` (every rope init
  function); DeepSeek-V2/V3's multi-head latent attention rotates ``qk_rope_head_dim``
  features (``DeepseekV3Config.__post_init__``: head_dim = qk_rope_head_dim); Gemma 4's
  full-attention layers have ``global_head_dim`` (``Gemma4TextConfig.__post_init__``'s
  ``per_layer_config``);
- the rotary dimension: ``int(head_dim * partial_rotary_factor)`` (the rope init functions'
  ``dim``), ``--rotary-dim``; ``rope_type: proportional`` rotates the whole head with
  ``partial_rotary_factor`` as p-RoPE's rotated fraction
  (``_compute_proportional_rope_parameters``), ``--rotated-fraction``;
- the base: ``rope_theta``, else transformers' ``default_theta`` of 10000
  (``RotaryEmbeddingConfigMixin``; a model class may have its own: give ``--base``);
- the pairing: ``rotate_half``'s (i, i + r/2), ``--layout half``, in most models'
  ``apply_rotary_pos_emb``; (2i, 2i + 1), ``--layout interleaved``, with DeepSeek's
  ``rope_interleave`` (default true: ``DeepseekV3Attention.forward`` calls
  ``apply_rotary_pos_emb_interleave``) and in the model types of ``INTERLEAVED``;
- the scaling: ``rope_type`` and its parameters as each ``ROPE_INIT_FUNCTIONS`` function
  reads them (``scaling_parameters``);
- M-RoPE: ``mrope_section`` (Qwen2-VL's ``apply_multimodal_rotary_pos_emb``), ``--family
  mrope --sections``, and ``mrope_interleaved`` (Qwen3-VL), ``--mrope-interleaved``.

A value the config leaves to transformers' defaults may be given as a flag (``--base`` for a
config without ``rope_theta``); any other flag given beside ``--hf-config`` must say what
the config says.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ropecheck.reference.scaling import from_parameters, parse

CONFIG_NAME = "config.json"
TEXT_CONFIG_KEYS = ("decoder", "generator", "text_config")  # PreTrainedConfig.get_text_config(decoder=True)
DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")  # ROPE_INIT_FUNCTIONS
OLD_ROPE_TYPES = {"mrope": "default"}  # Qwen2VLTextConfig.convert_rope_params_to_dict
LAYER_HEAD_DIMS = {"full_attention": "global_head_dim"}  # Gemma4TextConfig.__post_init__
# model types whose apply_rotary_pos_emb pairs features (2i, 2i + 1) (transformers/models/*/modeling_*.py:
# rotate_every_two, or a rotate_half of x[..., 0::2] and x[..., 1::2] with cos repeat_interleave'd)
INTERLEAVED = (
    "codegen",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "ernie4_5",
    "ernie4_5_moe",
    "glm",
    "glm4",
    "glm4v",
    "glm4v_text",
    "gptj",
    "helium",
)
# the parameters each rope type reads (beside rope_type, rope_theta, partial_rotary_factor)
READS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings", "factor", "attention_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "proportional": ("factor",),
}
NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


@dataclass(frozen=True)
class HFConvention:
    """What ``--hf-config`` gave: the file read, the layer type chosen, and the options its
    convention makes (option name -> value, as ``ropecheck.check`` takes it; ``family``
    only for a family other than 1-D RoPE)."""

    path: str
    layer_type: Optional[str]
    flags: dict = field(default_factory=dict)
    family: str = "rope"
    defaults: tuple = ()  # the options whose value is transformers' default, not the config's
    # the options it determines but does not set, with what the config says (None: none):
    # no scaling, every pair turning, M-RoPE's rotary dimension when it is the head's
    unset: dict = field(default_factory=dict)

    def spec(self) -> str:
        """How the command line gives it (``Option.shown``, the reproduce line)."""
        return self.path


@dataclass(frozen=True)
class HFConfig:
    """A config.json, read: ``path`` as given, ``config`` the text model's config."""

    path: str
    config: dict

    def spec(self) -> str:
        return self.path

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type") or "")

    def rope_parameters(self) -> dict:
        """The rope parameters: one dict, or one per layer type (the key -> a dict or None)."""
        c = self.config
        params = c.get("rope_scaling") or c.get("rope_parameters") or {}  # convert_rope_params_to_dict's order
        if not isinstance(params, dict):
            raise ValueError(f"{self.path}: rope_parameters is {type(params).__name__}, not an object")
        if "rope_local_base_freq" in c:  # Gemma 3's older form
            return {
                "full_attention": _moved_in(dict(params), c),
                "sliding_attention": {"rope_type": "default", "rope_theta": c["rope_local_base_freq"]},
            }
        if _nested(params):
            return {k: None if v is None else _moved_in(dict(v), c) for k, v in params.items()}
        return _moved_in(dict(params), c)

    def layer_types(self) -> tuple:
        """The layer types the config gives rope parameters for (() when one set is for all)."""
        params = self.rope_parameters()
        return tuple(params) if _nested(params) else ()

    def resolve(self, layer_type: Optional[str] = None) -> HFConvention:
        """The convention of ``layer_type``'s layers (required when the config has several);
        ValueError with the reason when the config does not give one ropecheck can check."""
        params = self.rope_parameters()
        if _nested(params):
            types = tuple(params)
            if layer_type is None and len(types) > 1:
                raise ValueError(
                    f"{self.path} gives rope parameters per layer type ({', '.join(types)}): "
                    "choose one with --layer-type NAME"
                )
            layer_type = layer_type or types[0]
            if layer_type not in params:
                raise ValueError(f"{self.path} has no layer type {layer_type} (its layer types: {', '.join(types)})")
            if params[layer_type] is None:
                raise ValueError(f"{self.path}: the {layer_type} layers have no RoPE (rope_parameters null)")
            chosen = params[layer_type]
        else:
            listed = tuple(dict.fromkeys(self.config.get("layer_types") or ()))
            if layer_type is not None and layer_type not in listed:
                raise ValueError(
                    f"{self.path} has no layer type {layer_type}: it gives one set of rope parameters for all its "
                    "layers" + (f" (its layer types: {', '.join(listed)})" if listed else "")
                )
            chosen = params
        return self._convention(chosen, layer_type, _nested(params))

    # --- the convention of one set of rope parameters -------------------------------------

    def _convention(self, params: dict, layer_type: Optional[str], nested: bool) -> HFConvention:
        where = self.path + (f" ({layer_type} layers)" if layer_type else "")
        kind = str(params.get("rope_type", params.get("type", "default")))
        kind = OLD_ROPE_TYPES.get(kind, kind)
        if kind not in ROPE_TYPES:
            raise ValueError(
                f"{where}: unknown rope_type {kind!r} (transformers' ROPE_INIT_FUNCTIONS: {', '.join(ROPE_TYPES)})"
            )
        head_dim = self._head_dim(layer_type)
        fraction = _number(params, "partial_rotary_factor", where, default=1.0)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"{where}: partial_rotary_factor must be in (0, 1], got {fraction}")
        proportional = kind == "proportional"
        rotary_dim = head_dim if proportional else int(head_dim * fraction)
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(
                f"{where}: the rotary dimension int(head_dim {head_dim} x partial_rotary_factor {fraction:g}) = "
                f"{rotary_dim} is not a positive even number"
            )
        defaults = ("base",) if params.get("rope_theta") is None else ()  # RotaryEmbeddingConfigMixin.default_theta
        base = _number(params, "rope_theta", where, default=DEFAULT_THETA)
        flags: dict = {"layout": self._layout(), "base": float(base), "rotary_dim": rotary_dim}
        scaling = scaling_parameters(kind, params, self.config, where, nested)
        if scaling is not None:
            flags["scaling"] = scaling_text(scaling, where)
        if proportional and fraction < 1.0:
            flags["rotated_fraction"] = fraction
        sections = params.get("mrope_section")
        if sections is None:
            unset = {k: v for k, v in (("scaling", None), ("rotated_fraction", 1.0)) if k not in flags}
            return HFConvention(self.path, layer_type, flags, "rope", defaults, unset)
        return self._mrope(flags, params, sections, head_dim, where, layer_type, defaults)

    def _mrope(self, flags, params, sections, head_dim, where, layer_type, defaults) -> HFConvention:
        """M-RoPE (Qwen2-VL): its frequency sections, --family mrope (which takes no scaling
        and rotates 2 sum(sections) features, --rotary-dim only when the head has more)."""
        if not (isinstance(sections, list) and sections and all(isinstance(s, int) and s > 0 for s in sections)):
            raise ValueError(f"{where}: mrope_section must be a list of positive integers, got {sections!r}")
        if "scaling" in flags or "rotated_fraction" in flags:
            raise ValueError(f"{where}: M-RoPE with a {params.get('rope_type')} scaling: --family mrope takes none")
        rotated = 2 * sum(sections)
        if rotated != flags["rotary_dim"]:
            raise ValueError(
                f"{where}: mrope_section {sections} turns 2 x {sum(sections)} = {rotated} features, but the rotary "
                f"dimension is {flags['rotary_dim']}"
            )
        out = {
            "family": "mrope",
            "sections": list(sections),
            "mrope_interleaved": bool(params.get("mrope_interleaved")),
        }
        out.update(layout=flags["layout"], base=flags["base"])
        if rotated < head_dim:  # the head has more features, passed through
            out["rotary_dim"] = rotated
        unset = {} if rotated < head_dim else {"rotary_dim": rotated}
        return HFConvention(self.path, layer_type, out, "mrope", defaults, unset)

    def _head_dim(self, layer_type: Optional[str]) -> int:
        c = self.config
        for key in (LAYER_HEAD_DIMS.get(layer_type or ""), "qk_rope_head_dim", "head_dim"):
            if key and c.get(key) is not None:
                return _positive(c, key, self.path)
        if c.get("hidden_size") is None or c.get("num_attention_heads") is None:
            raise ValueError(f"{self.path} gives no head_dim, nor hidden_size and num_attention_heads")
        return _positive(c, "hidden_size", self.path) // _positive(c, "num_attention_heads", self.path)

    def _layout(self) -> str:
        c = self.config
        if c.get("qk_rope_head_dim") is not None:
            return "interleaved" if c.get("rope_interleave", True) else "half"
        return "interleaved" if self.model_type in INTERLEAVED else "half"


def scaling_parameters(kind: str, params: dict, config: dict, where: str, nested: bool = False) -> Optional[dict]:
    """The ``reference.scaling`` parameters of rope type ``kind`` as transformers'
    ``_compute_<kind>_parameters`` reads ``params`` (one layer type's when ``nested``) and
    the config (None: no scaling)."""
    if kind == "default":
        return None
    missing = [k for k in NEEDS.get(kind, ()) if params.get(k) is None]
    if missing:
        raise ValueError(f"{where}: rope_type {kind} needs {', '.join(missing)}")
    read = {k: params[k] for k in READS[kind] if params.get(k) is not None}
    if kind == "proportional":  # p-RoPE's frequencies divided by factor (a linear scaling)
        factor = read.get("factor", 1.0)
        return None if factor == 1 else {"rope_type": "linear", "factor": factor}
    longest = config.get("max_position_embeddings")
    if kind == "dynamic":  # _compute_dynamic_ntk_parameters: L0 = config.max_position_embeddings
        return {"rope_type": kind, **read, "max_position_embeddings": _needed(config, "max_position_embeddings", where)}
    if kind in ("yarn", "longrope", "llama3"):
        # standardize_rope_params: one set of parameters takes a top-level original_max_position_embeddings
        # first (Phi-3), per-layer-type ones their own; else max_position_embeddings
        top = None if nested else config.get("original_max_position_embeddings")
        original = top or read.get("original_max_position_embeddings")
        read["original_max_position_embeddings"] = original or _needed(config, "max_position_embeddings", where)
    if kind == "yarn":
        if "factor" not in read:  # _compute_yarn_parameters: max_position_embeddings / original
            read["factor"] = (
                _needed(config, "max_position_embeddings", where) / read["original_max_position_embeddings"]
            )
        # `beta_fast or 32`, `beta_slow or 1`; truncate from config.rope_parameters itself (the
        # outer dict: a per-layer-type truncate is not read)
        read["beta_fast"] = params.get("beta_fast") or 32.0
        read["beta_slow"] = params.get("beta_slow") or 1.0
        outer = config.get("rope_scaling") or config.get("rope_parameters") or {}
        read["truncate"] = bool(outer.get("truncate", True)) if isinstance(outer, dict) else True
    if kind == "longrope" and "factor" not in read and longest is not None:
        read["max_position_embeddings"] = longest  # the attention factor's scale: max / original
    return {"rope_type": kind, **read}


def scaling_text(parameters: dict, where: str) -> str:
    """The ``--scaling`` value of these parameters: KIND:key=value,... when that reads back
    as the same scaling, else its JSON object (LongRoPE's factor lists, a number :g rounds)."""
    try:
        scaling = from_parameters(parameters)
        text = scaling.flag()
        if parse(text) != scaling:
            text = json.dumps(scaling.parameters(), separators=(",", ":"))
        return text
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None


def read(path) -> HFConfig:
    """The config at ``path`` (a config.json, or a folder holding one); ValueError (or
    OSError) with a one-line reason when it cannot be read as a model config."""
    given = str(path)
    file = Path(given)
    if file.is_dir():
        file = file / CONFIG_NAME
        if not file.is_file():
            raise ValueError(f"{given} is a folder without a {CONFIG_NAME}")
    elif not file.exists():
        raise ValueError(f"no such file: {given}")
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a text file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except OSError as exc:
        raise ValueError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{file} holds a JSON {type(loaded).__name__}, not a model config object")
    text = next((loaded[k] for k in TEXT_CONFIG_KEYS if isinstance(loaded.get(k), dict)), loaded)
    if "model_type" not in text and "model_type" in loaded:
        text = {**text, "model_type": loaded["model_type"]}
    return HFConfig(given, text)


def _moved_in(params: dict, config: dict) -> dict:
    """rope_theta and partial_rotary_factor beside the rope parameters moved into them
    (``convert_rope_params_to_dict``: the parameters' own come first)."""
    for key in ("rope_theta", "partial_rotary_factor"):
        if params.get(key) is None and config.get(key) is not None:
            params[key] = config[key]
    return params


def _nested(params: dict) -> bool:
    return bool(params) and all(v is None or isinstance(v, dict) for v in params.values())


def _number(params: dict, key: str, where: str, default: float) -> float:
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}")
    return value


def _positive(config: dict, key: str, where: str) -> int:
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _needed(config: dict, key: str, where: str):
    if config.get(key) is None:
        raise ValueError(f"{where} gives no {key}, which its rope_type reads")
    return config[key]
