"""The probes of ``ropecheck identify``: the target called on the standard basis (head j
holds e_j, one token per probe position), read back as the matrix of x -> f(x, m)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ropecheck.calling.caller import Caller
from ropecheck.identification.result import (
    LARGE_MAX_POSITIONS,
    PROBE_DTYPES,
    PROBE_HEAD_DIMS,
    NotRotary,
    UnusableTarget,
)
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.targets.target import Target


@dataclass
class Probe:
    positions: np.ndarray  # (P,)
    matrices: np.ndarray  # (P, d, d): M[m][:, j] = f(e_j, m)
    extra_inputs: Optional[np.ndarray] = None  # (k, d) the vectors after the basis
    extra_outputs: Optional[np.ndarray] = None  # (P, k, d)


def basis_input(positions, head_dim: int, extra: np.ndarray, dtype: str):
    heads = np.concatenate([np.eye(head_dim), extra]) if extra is not None else np.eye(head_dim)
    x = np.broadcast_to(heads, (1, len(positions)) + heads.shape).copy()
    # positions: one per token (1-D), or one N-tuple per token (positions (1, P, N) of an N-D map)
    rows = [list(p) if isinstance(p, (tuple, list, np.ndarray)) else p for p in positions]
    kind = torch.float32 if np.asarray(rows).dtype.kind == "f" else torch.int64  # coordinates, or token indices
    return (torch.from_numpy(x).to(torch_dtype(dtype)), torch.tensor([rows], dtype=kind))


def probe_at(caller: Caller, dtype: str, head_dim: int, positions, extra=None) -> Probe:
    x, pos = basis_input(positions, head_dim, extra, dtype)
    y = caller(x, pos)[0].to(torch.float64).numpy()  # (P, heads, d)
    probe = Probe(np.asarray(positions), np.swapaxes(y[:, :head_dim, :], 1, 2))
    if extra is not None:
        probe.extra_inputs, probe.extra_outputs = extra, y[:, head_dim:, :]
    return probe


def linearity_vectors(head_dim: int) -> np.ndarray:
    """Zero, v1, v2, v1 + v2 with small integer entries: exact in every dtype."""
    rng = np.random.default_rng(0)
    v1, v2 = (rng.integers(-4, 5, head_dim).astype(np.float64) for _ in range(2))
    return np.stack([np.zeros(head_dim), v1, v2, v1 + v2])


def choose_probe(caller: Caller, target: Target, positions=(0, 1)) -> tuple[str, int]:
    """The first (dtype, head_dim) the target accepts at ``positions`` (an N-D map: N-tuples),
    float64 first, its declared head sizes first; UnusableTarget when
    it raises on all; NotRotary when it returns but always breaks the call contract, or as
    soon as a call ends the process (a crash is a finding; probing on would only repeat it,
    restarting the worker each time)."""
    head_dims: tuple[int, ...] = PROBE_HEAD_DIMS
    if target.rotary_dim:
        r = target.rotary_dim
        head_dims = (2 * r, r) + tuple(h for h in PROBE_HEAD_DIMS if h > r and h != 2 * r)
    if target.head_dims:
        head_dims = tuple(target.head_dims) + tuple(h for h in head_dims if h not in target.head_dims)
    raised: list[str] = []
    broken: list[str] = []
    for dtype in (d for d in PROBE_DTYPES if d in target.dtypes):
        for head_dim in head_dims:
            try:
                probe_at(caller, dtype, head_dim, positions)
                return dtype, head_dim
            except CallError as exc:
                if exc.kind in ("crashed", "exited"):  # every further probe would restart the process
                    raise NotRotary(f"the target ended the process on {dtype}, head_dim {head_dim}: {exc}") from None
                (raised if exc.kind == "raised" else broken).append(f"{dtype}, head_dim {head_dim}: {exc}")
            except TargetHung as exc:
                raise UnusableTarget(f"on {dtype}, head_dim {head_dim}: {exc}") from None
    tried = len(raised) + len(broken)
    if broken:
        raise NotRotary(f"the call contract is broken ({broken[0]}; {tried} dtype/head_dim combinations tried)")
    raise UnusableTarget(
        f"the target cannot be called ({raised[0]}; and on {tried - 1} other dtype/head_dim combinations)"
    )


def large_positions(limit: int, small_top: int) -> list[tuple]:
    """The large probe's position sets, largest first: 0, 1, 2, 4, ... up to each of
    LARGE_MAX_POSITIONS capped at ``limit``; only those reaching past the small probe."""
    out = []
    for top in LARGE_MAX_POSITIONS:
        top = min(top, limit)
        positions = (0, 1) + tuple(2**k for k in range(1, top.bit_length()))
        if positions[-1] > small_top and positions not in out:
            out.append(positions)
    return out


def probe_large(caller, dtype, head_dim, notes, limit: int, small_top: int) -> Optional[Probe]:
    ladder = large_positions(limit, small_top)
    if not ladder:
        notes.append(f"large positions: not probed (the largest position allowed is {limit})")
    for positions in ladder:
        try:
            return probe_at(caller, dtype, head_dim, positions)
        except CallError as exc:
            notes.append(f"large positions: positions up to {positions[-1]} failed ({exc})")
        except TargetHung as exc:
            notes.append(f"large positions: positions up to {positions[-1]} hung ({exc})")
            return None
    return None
