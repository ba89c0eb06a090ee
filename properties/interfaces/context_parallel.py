"""Context parallelism as TransformerEngine and Megatron-Core split a sequence, and the
likely cause of a ``reference`` failure of a target called under it (``--cp-size N``).

The load-balanced split: every sequence, padded by its callers to a multiple of 2N, is
cut into 2N equal chunks of n tokens; rank r holds chunks r and 2N - 1 - r, in that order
(under a causal mask the first and the last ranks then do the same work). A rank's local
tensor holds, sequence after sequence, its two chunks of each (thd: ``cu_seqlens`` stay
the global padded ones, the local tensor holds ``cu_seqlens[-1] / N`` tokens); its kernel
must rotate chunk k's tokens at their global positions k n .. (k + 1) n - 1 from the
sequence's first. ``Split`` is that map (the calling layer cuts and gathers with it).

``likely_cause`` names the ranks and chunks a kernel rotated at positions other than
theirs. One probe call on inputs with no padding (batch rows of 4 * 2N tokens; packed:
sequences of 4 * 2N and 2 * 2N tokens, so that a kernel which takes one sequence's split
for another shows; at offsets of their own where the interface is fed angles per token,
so that one sequence's rows read for another show), then, for every token, the position
whose rotation its output is (within the reference's error bound, among the probe's
positions and 0 .. the longest padded sequence). It names something only when some
chunks are right and others not: a defect of the rotation itself (every chunk wrong) is
the usual suspects' to name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ropecheck.properties.core.contract import CallError
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.inputs.cases import as_float64

SEED = 20261126
HEADS = 2
HEAD_DIM = 64  # the probe's head size when the target declares no rotary dimension
PASS_THROUGH = 8  # features past a declared rotary dimension
CHUNK = 4  # tokens per chunk of the probe's longest sequence
SEQUENCE_OFFSETS = (0, 100)  # per-token tables: each probe sequence from its own
SHOWN = 4  # wrong chunks a cause names (then how many more)


@dataclass(frozen=True)
class Split:
    """The chunks of a batch of sequences (``lengths``, before padding) under context
    parallelism of ``cp_size`` ranks. Tokens are numbered in the *padded buffer*: the
    sequences one after another, each padded to ``padded``."""

    cp_size: int
    lengths: tuple

    @property
    def chunks(self) -> int:
        return 2 * self.cp_size

    @property
    def padded(self) -> tuple:
        return tuple(-(-n // self.chunks) * self.chunks for n in self.lengths)

    @property
    def starts(self) -> tuple:
        """Each sequence's first token in the padded buffer."""
        return tuple(int(s) for s in np.cumsum((0,) + self.padded[:-1]))

    def chunk_size(self, sequence: int) -> int:
        return self.padded[sequence] // self.chunks

    def rank_chunks(self, rank: int) -> tuple:
        return rank, self.chunks - 1 - rank

    def holder(self, chunk: int) -> int:
        """The rank holding ``chunk``."""
        return chunk if chunk < self.cp_size else self.chunks - 1 - chunk

    def local_tokens(self, rank: int) -> np.ndarray:
        """The padded buffer's tokens rank ``rank`` holds, in its local tensor's order."""
        parts = [
            start + k * n + np.arange(n)
            for i, start in enumerate(self.starts)
            for n in [self.chunk_size(i)]
            for k in self.rank_chunks(rank)
        ]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def real_tokens(self) -> np.ndarray:
        """The padded buffer's tokens that are the sequences' own (not padding), in order."""
        parts = [start + np.arange(n) for start, n in zip(self.starts, self.lengths)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def pieces(self):
        """(sequence, chunk, rank, first, stop): the sequence's own tokens first .. stop - 1
        (counted from its first) that are in ``chunk``; chunks of padding only are left out."""
        for i, length in enumerate(self.lengths):
            n = self.chunk_size(i)
            for k in range(self.chunks):
                first, stop = k * n, min((k + 1) * n, length)
                if first < stop:
                    yield i, k, self.holder(k), first, stop


# --- the likely cause ---------------------------------------------------------------------


def _probe_input(ctx, cp: int):
    """(x, positions, lengths, what a sequence is called) of the probe."""
    conv = ctx.convention
    head_dim = (ctx.target.rotary_dim or HEAD_DIM) + (PASS_THROUGH if conv.rotary_dim is not None else 0)
    long = CHUNK * 2 * cp
    table = getattr(getattr(ctx.target, "interface", None), "table", None)
    per_token = table is not None and table.by == "token"
    if ctx.target.call == "packed":
        lengths = (long, long // 2)
        offsets = SEQUENCE_OFFSETS if per_token else (0, 0)
        row = np.concatenate([o + np.arange(n) for o, n in zip(offsets, lengths)])[None, :]
        shape, what = (1, row.shape[1]), "sequence"
    else:
        lengths = (long, long)
        row = np.tile(np.arange(long), (2, 1))
        shape, what = (2, long), "batch row"
    values = np.random.default_rng(SEED).standard_normal((*shape, HEADS, head_dim))
    x = torch.from_numpy(values).to(torch_dtype(ctx.dtype)).contiguous()
    return x, row.astype(np.int64), lengths, what


def _fitted(ctx, x64: np.ndarray, y64: np.ndarray, positions: np.ndarray, longest: int) -> np.ndarray:
    """Per token, the position whose rotation its output is within the reference's bound
    (-1: none of the candidates: the probe's positions and 0 .. ``longest`` - 1)."""
    conv = ctx.convention
    candidates = np.array(sorted(set(range(longest)) | set(positions.reshape(-1).tolist())), dtype=np.int64)
    scores = []
    for p in candidates:
        m = np.full(positions.shape, p, dtype=np.int64)
        error = np.abs(y64 - conv.apply(x64, m)) / ctx.model.element_bound(x64, m, conv)
        scores.append(error.max(axis=(2, 3)))
    scores_ = np.stack(scores)
    best = scores_.argmin(axis=0)
    return np.where(scores_.min(axis=0) <= 1.0, candidates[best], -1)


def _span(values) -> str:
    values = [int(v) for v in values]
    if len(values) > 1 and values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}..{values[-1]}"
    return ", ".join(map(str, values))


def _chunks(split: Split, starts: list, rows: list, positions, fitted) -> list:
    """(sequence, chunk, rank, first, stop, its positions, the fitted ones) of every chunk."""
    out = []
    for i, k, rank, first, stop in split.pieces():
        where = (rows[i], slice(starts[i] + first, starts[i] + stop))
        out.append((i, k, rank, first, stop, tuple(positions[where].tolist()), tuple(fitted[where].tolist())))
    return out


def _sentences(wrong: list, what: str, largest: int) -> list:
    """One sentence per wrong chunk (one for the same chunk of several sequences wrong alike)."""
    alike: dict = {}
    for i, k, rank, first, stop, want, got in wrong:
        alike.setdefault((rank, k, first, stop, want, got), []).append(i)
    out = []
    for (rank, k, first, stop, want, got), sequences in alike.items():
        plural = "s" * (len(sequences) > 1)
        head = f"rank {rank}, chunk {k} (tokens {first}..{stop - 1} of {what}{plural} {', '.join(map(str, sequences))})"
        if all(g < 0 for g in got):
            out.append(f"{head} is no rotation of its input at any position 0..{largest}")
        else:
            said = _span(got) if min(got) >= 0 else ", ".join("?" if g < 0 else str(g) for g in got)
            out.append(f"{head} rotated as positions {said} (its positions are {_span(want)})")
    return out


def likely_cause(ctx) -> Optional[str]:
    """'likely cause: ...' naming the ranks and chunks rotated at positions other than
    their own (None: not called under context parallelism, the probe call failed, every
    chunk right, or every chunk wrong)."""
    cp = int(getattr(ctx.target, "cp_size", 1) or 1)
    if cp <= 1 or ctx.convention is None:
        return None
    x, positions, lengths, what = _probe_input(ctx, cp)
    try:
        y = ctx.rope(x, torch.from_numpy(positions))
    except CallError:
        return None
    split = Split(cp, lengths)
    x64 = as_float64(x)
    fitted = _fitted(ctx, x64, ctx.unscale(as_float64(y)), positions, max(split.padded))
    if ctx.target.call == "packed":
        starts, rows = [int(s) for s in np.cumsum((0,) + lengths[:-1])], [0] * len(lengths)
    else:
        starts, rows = [0] * len(lengths), list(range(len(lengths)))
    chunks = _chunks(split, starts, rows, positions, fitted)
    wrong = [c for c in chunks if c[5] != c[6]]
    if not wrong or len(wrong) == len(chunks):
        return None
    said = _sentences(wrong, what, int(positions.max()))
    more = f"; and {len(said) - SHOWN} more" if len(said) > SHOWN else ""
    return (
        f"likely cause: under context parallelism (cp_size {cp}: rank r holds chunks r and {2 * cp - 1} - r of "
        f"every {what}, each to be rotated at its global positions) {'; '.join(said[:SHOWN])}{more}"
    )


__all__ = ["Split", "likely_cause"]
