"""The RoPE implementations the GPU benchmark puts side by side, each brought to one call.

``IMPLEMENTATIONS[name](config, q, k, positions) -> Prepared`` with q, k (batch, seq,
heads, head_dim) and positions int64 (batch, seq) = offset[b] + s. The side input each
library needs (cos/sin tables, computed the way its users compute them: m * theta in
float32, cast to the tensor dtype) is built here, outside the timed call, as a model
builds it once per forward pass. A library that is not installed raises ImportError; a
configuration it does not support raises Unsupported; the benchmark skips either with
the reason.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ropecheck.kernels.triton_env import import_triton


class Unsupported(Exception):
    """The implementation does not support this configuration."""


@dataclass(frozen=True)
class Config:
    batch: int
    seq: int
    heads_q: int
    heads_k: int
    head_dim: int
    rotary_dim: int
    layout: str = "half"
    dtype: str = "bfloat16"
    base: float = 10000.0

    @property
    def name(self) -> str:
        partial = f" r{self.rotary_dim}" if self.rotary_dim != self.head_dim else ""
        return (f"{self.layout} {self.dtype} BS={self.batch * self.seq} "
                f"{self.heads_q}/{self.heads_k}x{self.head_dim}{partial}")


@dataclass
class Prepared:
    run: Callable  # () -> (q_out, k_out), both (batch, seq, heads, head_dim)
    side_bytes: int  # positions or cos/sin rows read per call
    inplace: bool


def float32_freqs(positions: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """(batch, seq, r/2) angles m * theta_i in float32, the way the libraries form them."""
    exponents = torch.arange(0, rotary_dim, 2, device=positions.device).float() / rotary_dim
    inv_freq = 1.0 / (base ** exponents)
    return positions.float()[..., None] * inv_freq


def _cos_sin(cfg: Config, positions, doubled: bool):
    freqs = float32_freqs(positions, cfg.rotary_dim, cfg.base)
    if doubled:
        freqs = torch.cat((freqs, freqs), dim=-1)
    dtype = getattr(torch, cfg.dtype)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _partial(rotate_pair, cfg: Config):
    """(q, k) -> rotate_pair on their first rotary_dim features, the rest passed through
    (how HF models with partial rotary call the apply function)."""
    r = cfg.rotary_dim

    def apply(q, k, cos, sin):
        if r == cfg.head_dim:
            return rotate_pair(q, k, cos, sin)
        q_rot, k_rot = rotate_pair(q[..., :r], k[..., :r], cos, sin)
        return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)

    return apply


# --- implementations ----------------------------------------------------------------

def ropecheck_triton(cfg: Config, q, k, positions) -> Prepared:
    import_triton()
    from ropecheck.kernels.rope import apply_rope

    def run():
        return apply_rope(q, k, positions, layout=cfg.layout, base=cfg.base, rotary_dim=cfg.rotary_dim)

    return Prepared(run, _nbytes(positions), inplace=False)


def liger(cfg: Config, q, k, positions) -> Prepared:
    if cfg.layout != "half":
        raise Unsupported("Liger's rope pairs features (i, i + r/2) only")
    import_triton()
    from liger_kernel.ops.rope import LigerRopeFunction

    cos, sin = _cos_sin(cfg, positions, doubled=True)  # (batch, seq, r)
    q_t, k_t = q.transpose(1, 2), k.transpose(1, 2)  # (batch, heads, seq, head_dim) views

    def run():  # rotates in place (q is a transposed view of contiguous storage)
        q_out, k_out = LigerRopeFunction.apply(q_t, k_t, cos, sin, None, 1, cfg.rotary_dim)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    return Prepared(run, _nbytes(cos, sin), inplace=True)


def load_flash_attn_rotary():
    """flash-attn's Triton ``apply_rotary``: from the package, or from its file alone (the
    package's compiled CUDA extension is not needed by this file)."""
    import_triton()
    try:
        from flash_attn.ops.triton.rotary import apply_rotary
        return apply_rotary
    except ImportError:
        pass
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or spec.origin is None:
        raise ImportError("flash-attn is not installed (pip install flash-attn)")
    path = Path(spec.origin).parent / "ops" / "triton" / "rotary.py"
    module_spec = importlib.util.spec_from_file_location("flash_attn_triton_rotary", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.apply_rotary


def flash_attn(cfg: Config, q, k, positions) -> Prepared:
    apply_rotary = load_flash_attn_rotary()
    offsets = positions[:, 0]
    first = int(offsets.min())
    rows = torch.arange(first, int(offsets.max()) + cfg.seq, device=q.device)
    cos, sin = _cos_sin(cfg, rows, doubled=False)  # (table rows, r/2)
    seqlen_offsets = (offsets - first).to(torch.int32)
    interleaved = cfg.layout == "interleaved"

    def run():  # one launch for q, one for k
        return tuple(apply_rotary(x, cos, sin, seqlen_offsets=seqlen_offsets, interleaved=interleaved)
                     for x in (q, k))

    rows_read = 2 * cfg.batch * cfg.seq * (cfg.rotary_dim // 2) * q.element_size()  # cos + sin
    return Prepared(run, 2 * rows_read, inplace=False)


def _hf_eager(cfg: Config):
    """HF's apply function for the layout: (q, k, cos, sin) -> (q_out, k_out)."""
    if cfg.layout == "half":
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        return _partial(lambda q, k, cos, sin: apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2), cfg)
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply

    return _partial(lambda q, k, cos, sin: (gptj_apply(q, sin, cos), gptj_apply(k, sin, cos)), cfg)


def _hf(cfg: Config, q, k, positions, compile_it: bool) -> Prepared:
    apply = _hf_eager(cfg)
    if compile_it:
        torch._dynamo.reset()  # a fresh compile per configuration, not a recompile-limit fallback
        apply = torch.compile(apply)
    cos, sin = _cos_sin(cfg, positions, doubled=cfg.layout == "half")
    run = lambda: apply(q, k, cos, sin)  # noqa: E731
    run()  # compiles once, outside the timed rounds
    return Prepared(run, _nbytes(cos, sin), inplace=False)


def hf_eager(cfg, q, k, positions) -> Prepared:
    return _hf(cfg, q, k, positions, compile_it=False)


def hf_compiled(cfg, q, k, positions) -> Prepared:
    return _hf(cfg, q, k, positions, compile_it=True)


IMPLEMENTATIONS = {
    "ropecheck-triton": ropecheck_triton,
    "liger": liger,
    "flash-attn-triton": flash_attn,
    "hf-eager": hf_eager,
    "hf-compiled": hf_compiled,
}
