"""Kernels for the models of tests/data/hf_configs/ that tests/real_config_kernels.py and
tests/p_rope_kernels.py have none for, written as their libraries write them (float32
frequencies and angles, cos/sin cast to the input's dtype), for tests/test_hf_config.py:

| kernel | model | settings |
|---|---|---|
| qwen3_8b | Qwen3-8B | head 128, base 1e6 |
| phi3_mini_128k | Phi-3-mini-128k-instruct | head 96, base 1e4, LongRoPE (the config's factors), original 4096 |

``convention_kernel(conv)`` computes any 1-D ``Convention`` the same way: the kernel of a
convention next to a model's, which must fail under the model's.

The file imports torch and its sibling kernel files only: ropecheck may load its kernels as
targets in a worker process.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from tests.real_config_kernels import (
    _angles,
    _partial,
    apply_half,
    default_inv_freq,
    longrope_inv_freq,
    rotate_every_two,
)

CONFIGS = Path(__file__).with_name("data") / "hf_configs"


def qwen3_8b(x, positions):
    inv = default_inv_freq(128, 1000000.0)
    return _partial(x, 128, lambda r: apply_half(r, _angles(positions, inv)))


PHI3_SCALING = json.loads((CONFIGS / "phi-3-mini-128k-instruct.json").read_text())["rope_scaling"]
PHI3_ORIGINAL, PHI3_MAX = 4096, 131072


def phi3_mini_128k(x, positions):
    """HF's Phi3RotaryEmbedding with LongRoPE: the long factors when seq_len = max(position_ids)
    + 1 passes 4096, cos/sin times sqrt(1 + ln(131072 / 4096) / ln(4096))."""
    long = int(positions.max()) + 1 > PHI3_ORIGINAL
    factors = PHI3_SCALING["long_factor" if long else "short_factor"]
    scale = math.sqrt(1 + math.log(PHI3_MAX / PHI3_ORIGINAL) / math.log(PHI3_ORIGINAL))
    inv = longrope_inv_freq(96, 10000.0, factors)
    return _partial(x, 96, lambda r: apply_half(r, _angles(positions, inv), scale))


def convention_kernel(conv):
    """rope(x, positions) for a 1-D ``Convention`` as HF's rotary modules compute one: its
    frequencies in float32 (for the call's length when they depend on it), angles m theta
    in float32, cos and sin times the attention factor cast to x's dtype, applied to the
    first r features in its layout, the rest passed through."""

    def rope(x, positions):
        r = conv.rotary_dim_for(x.shape[-1])
        theta = torch.tensor(conv.theta(x.shape[-1], positions.cpu().numpy()), dtype=torch.float32)
        angles = _angles(positions, theta)
        if conv.layout == "half":
            return _partial(x, r, lambda part: apply_half(part, angles, conv.amplitude))
        emb = angles.repeat_interleave(2, dim=-1)[:, :, None, :]
        cos, sin = (emb.cos() * conv.amplitude).to(x.dtype), (emb.sin() * conv.amplitude).to(x.dtype)
        return _partial(x, r, lambda part: part * cos + rotate_every_two(part) * sin)

    return rope
