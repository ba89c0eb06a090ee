"""The tensor formats of the presets (``Preset.tensors``): how the canonical (batch, seq,
heads, head_dim) tensor becomes the tensor an interface takes, and its output comes back,
as one registry the call path iterates (``api_call._Call.to_api`` / ``from_api``).

A ``Format`` turns a canonical tensor into the interface's (``to_api``: always a view, so
what a kernel writes lands in ropecheck's copy; None where the batch does not merge into
tokens: the call path then hands it a copy) and an output back (``from_api``).
``axes(call)`` is the permutation of (b, s, h, d) the format stores a batch in, for a
caller that makes the interface's tensor itself (the context-parallel split: a rank's
local tensor); None for a format that flattens the batch into tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


def tokens(t: torch.Tensor, flat: bool) -> Optional[torch.Tensor]:
    """(batch, seq, heads, head_dim) as a (T, heads, head_dim) view, (T, heads * head_dim)
    when ``flat`` and the heads merge; None when the batch does not merge into tokens."""
    b, s, h, d = t.shape
    try:
        out = t.view(b * s, h, d)
    except RuntimeError:
        return None
    if flat:
        try:
            return out.view(b * s, h * d)
        except RuntimeError:
            return out
    return out


def _inverse(order: tuple) -> tuple:
    return tuple(order.index(i) for i in range(len(order)))


@dataclass(frozen=True)
class Format:
    name: str
    what: str
    axes: Callable[[Any], Optional[tuple]]  # (call) -> the permutation of (b, s, h, d), None: tokens
    to_tokens: Optional[Callable[[Any, torch.Tensor], Optional[torch.Tensor]]] = None  # tokens formats

    def to_api(self, call, t: torch.Tensor) -> Optional[torch.Tensor]:
        if call.packed:  # thd: (total, heads, head_dim), a view for one row
            return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
        order = self.axes(call)
        if order is None:
            assert self.to_tokens is not None
            return self.to_tokens(call, t)
        return t.permute(order)

    def from_api(self, call, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """An output in this format as the canonical (batch, seq, heads, head_dim)."""
        order = None if call.packed else self.axes(call)
        if order is None:
            return out.reshape(like.shape)
        return out.permute(_inverse(order))


BSHD = (0, 1, 2, 3)
SBHD = (1, 0, 2, 3)
BHSD = (0, 2, 1, 3)

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "tokens",
            "(T, H*D) where the heads merge (a flat call variant) or (T, H, D): the batch flattened into tokens",
            lambda call: None,
            lambda call, t: tokens(t, call.flat_tokens()),
        ),
        Format(
            "tokens-heads",
            "(T, H, D): the batch flattened into tokens",
            lambda call: None,
            lambda call, t: tokens(t, False),
        ),
        Format("bhsd", "(b, h, s, d), transformers' q and k", lambda call: BHSD),
        Format("bshd", "(b, s, h, d), or (total, h, d) with cu_seqlens", lambda call: BSHD),
        Format(
            "te",
            "(s, b, h, d) sbhd or (b, s, h, d) bshd (the call's tensor_format), (total, h, d) thd with cu_seqlens",
            lambda call: SBHD if call.format_variant() == "sbhd" else BSHD,
        ),
    )
}


def tensor_format(name: str) -> Format:
    if name not in FORMATS:
        raise ValueError(f"unknown tensor format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]
