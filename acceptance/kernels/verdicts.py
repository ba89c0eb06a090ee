"""Targets whose verdict is about how they fail (a crash, a hang, a refusal, a fixed table),
for the acceptance corpus."""
import os
import time

import torch


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rope(x, positions):
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = positions.float()[..., None] * inv
    ang = torch.cat((ang, ang), dim=-1)[:, :, None, :]
    xf = x.float()
    return (xf * ang.cos() + _rotate_half(xf) * ang.sin()).to(x.dtype)


def crashes_past_1000(x, positions):  # a native crash on large positions
    if int(positions.max()) > 1000:
        os._exit(139)
    return _rope(x, positions)


def hangs_on_long_calls(x, positions):  # a hang on calls of more than 16 tokens
    if x.shape[1] > 16:
        time.sleep(3600)
    return _rope(x, positions)


_TABLE = {}


def fixed_table(x, positions):  # a cos/sin table of 2^21 rows: IndexError past it
    d = x.shape[-1]
    if d not in _TABLE:
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        _TABLE[d] = torch.outer(torch.arange(2**21, dtype=torch.float32), inv)
    ang = _TABLE[d][positions]
    ang = torch.cat((ang, ang), dim=-1)[:, :, None, :]
    xf = x.float()
    return (xf * ang.cos() + _rotate_half(xf) * ang.sin()).to(x.dtype)


def clamped_table(x, positions):  # the same table, clamped instead of raising: wrong values
    return fixed_table(x, positions.clamp(max=2**21 - 1))


def view_as_complex(x, positions):  # Meta LLaMA's freqs_cis path: refuses odd strides
    d = x.shape[-1]
    freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    angles = positions.float()[..., None] * freqs
    freqs_cis = torch.polar(torch.ones_like(angles), angles)[:, :, None, :]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)


def returns_none(x, positions):
    return None


def sets_default_dtype(x, positions):
    torch.set_default_dtype(torch.float64)
    return _rope(x, positions)
