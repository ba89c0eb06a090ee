"""Table builders written as libraries write them (plain torch, float32 angles), correct and
broken, for ``tests/test_table_builders.py`` and the acceptance corpus.

``table(scaling, ...)`` is ``build(positions) -> (cos, sin)`` (HF's rotary module: inv_freq
in float32, cat(f, f), times the attention factor) and ``cache(scaling, ...)`` is
``build(max_position) -> cos_sin_cache`` (vLLM's: rows cat(cos, sin)); a scaling is given as
HF's rope_parameters. Each broken one has one defect, named after it. The module-level
builders are the CLI's targets: ``--rotary-dim 64 --layout half`` (and their --scaling).
"""

from __future__ import annotations

import math

import torch

BASE = 10000.0
R = 64  # the rotary dim of the module-level builders
SCALINGS = {  # rope_parameters at R = 64 (LongRoPE: 32 factors)
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0 + i / 64 for i in range(R // 2)],
        "long_factor": [1.0 + i / 4 for i in range(R // 2)],
        "original_max_position_embeddings": 4096,
        "factor": 32.0,
    },
}
BASES = {"llama3": 500000.0}


def inv_freq(params: dict, r: int, base: float, seq_len: int, bug: str = "") -> tuple[torch.Tensor, float]:
    """(inv_freq float32 (r/2,), attention factor) of HF's init functions, for a call of
    sequence length ``seq_len``; ``bug`` puts one defect in."""
    kind = params["rope_type"]
    exponent = torch.arange(0, r, 2, dtype=torch.int64).float() / r
    if kind == "dynamic":
        L0, s = params["max_position_embeddings"], params["factor"]
        base = base * ((s * max(seq_len, L0) / L0) - (s - 1)) ** (r / (r - 2))
    theta = 1.0 / (base**exponent)
    factor = params.get("factor", 1.0)
    if kind == "linear":
        return theta / factor, 1.0
    if kind == "yarn":
        L0 = params["original_max_position_embeddings"]

        def dim(rotations):
            return (r * math.log(L0 / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = max(math.floor(dim(32.0)), 0), min(math.ceil(dim(1.0)), r - 1)
        ramp = torch.clamp((torch.arange(r // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        theta = theta / factor * (1 - extrapolation) + theta * extrapolation
        return theta, 1.0 if bug == "no-mscale" else 0.1 * math.log(factor) + 1.0
    if kind == "llama3":
        L0, low, high = (params[k] for k in ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor"))
        long_edge, short_edge = L0 / low, L0 / high
        if bug == "band-edges":  # the two band edges exchanged
            long_edge, short_edge = short_edge, long_edge
        wavelength = 2 * math.pi / theta
        scaled = torch.where(wavelength > long_edge, theta / factor, theta)
        smooth = (L0 / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < short_edge) * ~(wavelength > long_edge)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "longrope":
        L0 = params["original_max_position_embeddings"]
        long = seq_len >= L0 if bug == "longrope-side" else seq_len > L0
        ext = torch.tensor(params["long_factor" if long else "short_factor"], dtype=torch.float32)
        attention = math.sqrt(1 + math.log(params["factor"]) / math.log(L0))
        return 1.0 / (ext * base**exponent), attention
    return theta, 1.0


def table(name="default", r=R, base=None, layout="half", bug="", per_frequency=False):
    """build(positions) -> (cos, sin) (n, r), HF's module (stateless: theta of each call);
    ``per_frequency``: (n, r/2), one column per frequency (flash-attn's cos/sin)."""
    params, base = SCALINGS[name], base or BASES.get(name, BASE)

    def build(positions):
        theta, attention = inv_freq(params, r, base, int(positions.max()) + 1, bug)
        if bug == "angles-bf16":
            freqs = (positions.to(torch.bfloat16)[:, None] * theta.to(torch.bfloat16)).float()
        else:
            freqs = positions[:, None].float() * theta
        if per_frequency:
            emb = freqs
        elif (layout == "half") != (bug == "duplication"):
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = freqs.repeat_interleave(2, dim=-1)
        cos, sin = emb.cos() * attention, emb.sin() * attention
        return (sin, cos) if bug == "swapped" else (cos, sin)

    return build


def stateful_dynamic(r=R, base=BASE):
    """HF's dynamic NTK module: frequencies grown with the longest call seen and reset only
    below the original length, so a later call of length L0 .. longest gets the longer one's."""
    params = SCALINGS["dynamic"]
    L0 = params["max_position_embeddings"]
    state = {"cached": L0, "theta": inv_freq(params, r, base, L0)[0]}

    def build(positions):
        seq_len = int(positions.max()) + 1
        if seq_len > state["cached"]:
            state["cached"], state["theta"] = seq_len, inv_freq(params, r, base, seq_len)[0]
        if seq_len < L0 and state["cached"] > L0:
            state["cached"], state["theta"] = L0, inv_freq(params, r, base, L0)[0]
        freqs = positions[:, None].float() * state["theta"]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    return build


def cache(name="default", r=R, base=None, bug=""):
    """build(max_position) -> cos_sin_cache (max_position, r), rows cat(cos, sin) (vLLM's)."""
    params, base = SCALINGS[name], base or BASES.get(name, BASE)

    def build(max_position):
        theta, attention = inv_freq(params, r, base, max_position, bug)
        t = torch.arange(max_position, dtype=torch.float32) + (1 if bug == "row-shift" else 0)
        if bug == "angles-fp16":
            freqs = (t.half()[:, None] * theta.half()).float()
        else:
            freqs = torch.einsum("i,j->ij", t, theta)
        return torch.cat((freqs.cos() * attention, freqs.sin() * attention), dim=-1)

    return build


# the CLI's targets (--rotary-dim 64 --layout half, default scaling unless named)
correct_table = table()
correct_cache = cache()
wrong_base = table(base=20000.0)
swapped = table(bug="swapped")
angles_bf16 = table(bug="angles-bf16")
duplication = table(bug="duplication")
cache_row_shift = cache(bug="row-shift")
yarn_no_mscale = table("yarn", bug="no-mscale")  # --scaling yarn:factor=4,original_max_position_embeddings=1024
dynamic_leak = stateful_dynamic()  # --scaling dynamic:factor=2,max_position_embeddings=4096
