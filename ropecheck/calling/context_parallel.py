"""One canonical call made through a context-parallel interface (``--cp-size N``, N > 1):
the input split across N ranks as TransformerEngine's and Megatron-Core's callers split
it (``properties.interfaces.context_parallel.Split``: every sequence padded to a multiple of 2N, in
2N chunks, rank r holding chunks r and 2N - 1 - r), every rank called with its local
tensor, its rank and the global tables, the outputs gathered back into the canonical y
and the padding dropped.

How each interface is fed (a preset takes context parallelism through ``cp_size`` and
``cp_rank``, or through a ``cp_group`` whose ``size()`` and ``rank()`` say N and r):
- a table indexed by position (TransformerEngine's freqs): the table covers the global
  positions; TransformerEngine refuses start_positions under context parallelism, so a
  call's sequences all count up from one offset c, the table's first row (its
  ``RotaryPositionEmbedding(max_seq_len, offset=c)``): sequences at offsets of their own
  are called in one call per offset, each with its table. thd: ``cu_seqlens`` are the
  global padded cumulative lengths, the local tensor holds ``cu_seqlens[-1] / N`` tokens;
- angles per token (Megatron-Core): thd takes the global table, one row per token of the
  padded batch, with the global padded ``cu_seqlens`` (the kernel selects its rows); sbhd
  takes the rank's own rows (Megatron's ``RotaryEmbedding`` slices them per rank before
  the call: ``get_pos_emb_on_this_cp_rank``).

Each rank's local tensor is a tensor of its own, contiguous in the interface's format
(the split copies); padding tokens are zeros. What a kernel writes into its local input
is written back into the canonical x, so the contract sees an input modified in place.
The steps are torch operations, so autograd flows through the split and the gather: the
backward checks run the kernel's backward under context parallelism too.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ropecheck.calling import roles, tables
from ropecheck.calling.api_call import _Call
from ropecheck.calling.forms import ReturnedWrong, Stages, TargetCall, _fits, _kind, cu_seqlens
from ropecheck.properties.interfaces.context_parallel import Split


def takes_cp(preset) -> bool:
    """Whether ``preset``'s interface takes context-parallel ranks (a parameter whose role
    carries them: ``roles.Role.context_parallel``)."""
    return any(roles.role(p.role).context_parallel for p in preset.params)


class _Sequences:
    """The canonical call's sequences (batch rows; packed: its sequences) as tokens of x
    flattened to (tokens, heads, head_dim): each one's first token, length, positions."""

    def __init__(self, call: _Call):
        x, p = call.x, call.positions.reshape(-1).cpu().numpy()
        b, s = x.shape[:2]
        self.flat = x.reshape(b * s, *x.shape[2:])
        lengths = call.lengths() if call.packed else (s,) * b
        self.starts = [int(v) for v in np.cumsum((0,) + tuple(lengths[:-1]))]
        self.lengths = [int(n) for n in lengths]
        self.positions = [p[a : a + n] for a, n in zip(self.starts, self.lengths)]


class _Padded:
    """One call's sequences padded as the split pads them: their tokens one after another
    (padding: zeros), each token's position (padding repeats its sequence's last, so the
    call's seq_len, what a dynamic scaling sees, is unchanged) and its index among x's
    flattened tokens (-1: padding)."""

    def __init__(self, seqs: _Sequences, members: list, split: Split):
        flat = seqs.flat
        parts, positions, canonical = [], [], []
        for i, padded in zip(members, split.padded):
            a, n = seqs.starts[i], seqs.lengths[i]
            parts += [flat[a : a + n], flat.new_zeros((padded - n, *flat.shape[1:]))]
            last = int(seqs.positions[i][-1]) if n else 0
            positions.append(np.concatenate((seqs.positions[i], np.full(padded - n, last, dtype=np.int64))))
            canonical.append(np.concatenate((a + np.arange(n), -np.ones(padded - n, dtype=np.int64))))
        self.split, self.rows = split, len(members)
        self.tokens = torch.cat(parts)
        self.positions, self.canonical = np.concatenate(positions), np.concatenate(canonical)

    def index(self, tokens: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).to(self.tokens.device)


class _ContextParallelCall(_Call):
    """``_Call`` with the input split across ``form.cp_size`` ranks."""

    def __init__(self, form, x: torch.Tensor, positions: torch.Tensor):
        super().__init__(form, x, positions)
        self.cp = form.cp_size

    # --- the calls ----------------------------------------------------------------------
    def groups(self, seqs: _Sequences) -> list:
        """(sequence indices, their shared offset or None) of each call: one call for an
        interface fed angles per token, one per offset for a table indexed by position."""
        everything = list(range(len(seqs.lengths)))
        if self.table.by != "position":
            return [(everything, None)]
        offsets = self.sequence_offsets().cpu().tolist()
        by_offset: dict = {}
        for i in everything:
            by_offset.setdefault(int(offsets[i]), []).append(i)
        return [(members, offset) for offset, members in by_offset.items()]

    def stages(self) -> Stages:
        """One staged call per rank (and per shared offset), then the ranks' outputs gathered."""
        seqs = _Sequences(self)
        pieces: list = []
        order: list = []
        returned: list = []
        for members, offset in self.groups(seqs):
            batch = _Padded(seqs, members, Split(self.cp, tuple(seqs.lengths[i] for i in members)))
            if batch.tokens.shape[0] == 0:
                continue
            pieces.append((yield from self._rank_stages(batch, offset, returned)))
            order.append(batch.canonical[batch.canonical >= 0])
        self._after()
        if not pieces:
            return self.x.clone(), ()
        back = torch.from_numpy(np.argsort(np.concatenate(order))).to(self.x.device)
        return torch.cat(pieces)[back].reshape(self.x.shape), tuple(returned)

    def _rank_stages(self, batch: "_Padded", offset: Optional[int], returned: list):
        """One call on every rank: the gathered output of ``batch``'s own tokens, in order
        (what each rank returned appended to ``returned``)."""
        split = batch.split
        shared = {"cu_seqlens": cu_seqlens(split.padded).to(self.x.device) if self.packed else None}
        angles = self._angles(batch.positions if offset is None else offset + np.arange(max(split.padded)))
        if offset is not None or self.packed:  # one table for every rank: (rows, 1, 1, r)
            shared["freqs"] = self.made_for_this_call(angles[:, None, None, :])
        outs = []
        for rank in range(self.cp):
            self.rank = rank
            local = split.local_tokens(rank)
            given = self._to_api(batch.tokens[batch.index(local)], batch.rows)
            pristine = given.detach().clone()
            tensors = {"x": given, **shared}
            if "freqs" not in shared:  # sbhd angles per token: the rank's own rows, (s, b, 1, r)
                mine = angles[batch.index(local)].reshape(batch.rows, -1, angles.shape[-1])
                tensors["freqs"] = self.made_for_this_call(mine.transpose(0, 1)[:, :, None, :])
            args, kwargs = self.arguments(tensors)
            out = yield TargetCall(args, kwargs)
            if not isinstance(out, torch.Tensor):
                raise ReturnedWrong("type", f"rank {rank}: the target returned {_kind(out)}, expected a torch.Tensor")
            try:
                _fits("y", out, given)
            except ReturnedWrong as wrong:
                raise ReturnedWrong(wrong.kind, f"rank {rank}: {wrong}") from None
            self._write_back(given, pristine, batch.canonical[local])
            outs.append(self._from_api(out))
            returned.append(out)
        gathered = torch.cat(outs)[batch.index(np.argsort(_order(split)))]
        return gathered[batch.index(split.real_tokens())]

    # --- the local tensors --------------------------------------------------------------
    def _to_api(self, tokens: torch.Tensor, rows: int) -> torch.Tensor:
        """A rank's tokens (T_local, heads, head_dim) in the interface's format, a tensor of
        its own (stored in the format's axis order)."""
        if self.packed:
            return tokens
        local = tokens.reshape(rows, -1, *tokens.shape[1:])
        order = self.format.axes(self)
        assert order is not None, f"--api {self.preset.name}: a context-parallel interface takes a batch, not tokens"
        return local.permute(order).contiguous()

    def _from_api(self, out: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return out
        bshd = self.format.from_api(self, out, out)
        return bshd.reshape(-1, *bshd.shape[2:])

    def _write_back(self, given: torch.Tensor, pristine: torch.Tensor, canonical: np.ndarray) -> None:
        """What the kernel wrote into its local tensor, into the canonical x."""
        if self.x.requires_grad or torch.equal(given.detach(), pristine):
            return
        tokens = self._from_api(given.detach())
        own = canonical >= 0
        s = self.x.shape[1]
        rows, cols = (torch.from_numpy(v).to(self.x.device) for v in (canonical[own] // s, canonical[own] % s))
        with torch.no_grad():
            self.x[rows, cols] = tokens[torch.from_numpy(own).to(tokens.device)]

    # --- the tables ---------------------------------------------------------------------
    def _angles(self, positions: np.ndarray) -> torch.Tensor:
        """The angles per token (tokens, r) of the table's dtype and width; a dynamic
        scaling sees the largest position of ``positions`` (padding repeats a sequence's last)."""
        p = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(self.x.device)
        return tables.angles_by_token(
            self.convention, p, self.rotary_dim, self.table_dtype(), self.table.width, self.form.table_sign
        )


def _order(split: Split) -> np.ndarray:
    """The padded buffer's tokens in the order the ranks' outputs are concatenated."""
    return np.concatenate([split.local_tokens(r) for r in range(split.cp_size)])


def stages(form, x: torch.Tensor, positions: torch.Tensor, seen=None) -> Stages:
    """The staged calls (``forms.drive``) through ``form.api`` on ``form.cp_size`` ranks:
    (canonical y, what the ranks returned); ``seen`` gets the classes of its argument values."""
    return _ContextParallelCall(form, x, positions).stages_seen(seen)
