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
    yarn_inv_freq,
    yarn_mscale,
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


# --- what serving stacks got wrong of a config (issue 45): each the model's kernel with one slip ---
#
# | kernel | config | the slip |
# |---|---|---|
# | phi2 | phi-2.json | (correct) head 80, partial_rotary_factor 0.4: 32 features rotated, theta over 32 |
# | phi2_partial_twice | phi-2.json | partial_rotary_factor applied twice: 12 features (vLLM PRs #41185, #29966) |
# | phi2_partial_over_head | phi-2.json | the 32 rotated features' frequencies taken over the head's 80 (wired to the wrong dimension: the same PRs) |
# | laguna_yarn | laguna-yarn-attention-factor.json | (correct) YaRN factor 64 with its explicit attention_factor 1.0 |
# | laguna_yarn_default_mscale | laguna-yarn-attention-factor.json | the explicit attention_factor dropped: 0.1 ln 64 + 1 (vLLM PR #46280) |
# | gemma3_local_with_global_base | gemma-3-4b-it.json, sliding_attention | the sliding layers at the full layers' base 1e6 |
# | gemma3_global_unscaled | gemma-3-4b-it.json, full_attention | the full layers' linear factor 8 left out (the local layers' parameters) |

PHI2_HEAD, PHI2_ROTARY = 80, 32
LAGUNA = dict(dim=128, base=10000.0, factor=64.0, original=4096)


def phi2(x, positions):
    inv = default_inv_freq(PHI2_ROTARY, 10000.0)
    return _partial(x, PHI2_ROTARY, lambda r: apply_half(r, _angles(positions, inv)))


def phi2_partial_twice(x, positions):
    rotary = int(int(PHI2_HEAD * 0.4) * 0.4) // 2 * 2  # 80 * 0.4 * 0.4 = 12.8: 12 features
    inv = default_inv_freq(rotary, 10000.0)
    return _partial(x, rotary, lambda r: apply_half(r, _angles(positions, inv)))


def phi2_partial_over_head(x, positions):
    inv = default_inv_freq(PHI2_HEAD, 10000.0)[: PHI2_ROTARY // 2]  # theta_i = base^(-2i/80)
    return _partial(x, PHI2_ROTARY, lambda r: apply_half(r, _angles(positions, inv)))


def _laguna(x, positions, amplitude):
    inv = yarn_inv_freq(LAGUNA["dim"], LAGUNA["base"], LAGUNA["factor"], LAGUNA["original"])
    return _partial(x, LAGUNA["dim"], lambda r: apply_half(r, _angles(positions, inv), amplitude))


def laguna_yarn(x, positions):
    return _laguna(x, positions, 1.0)  # the config's attention_factor


def laguna_yarn_default_mscale(x, positions):
    return _laguna(x, positions, yarn_mscale(LAGUNA["factor"]))  # 1.4159: what the formula gives


def gemma3_local_with_global_base(x, positions):
    inv = default_inv_freq(256, 1000000.0)
    return _partial(x, 256, lambda r: apply_half(r, _angles(positions, inv)))


def gemma3_global_unscaled(x, positions):
    inv = default_inv_freq(256, 1000000.0)
    return _partial(x, 256, lambda r: apply_half(r, _angles(positions, inv)))
