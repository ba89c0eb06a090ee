"""One canonical call ``f(x, positions)`` made through a library interface (a preset,
``ropecheck.calling.presets``), and its results brought back to the canonical ``y``.

The steps, for every preset alike:
1. the canonical x becomes the interface's tensors: for a (q, k) interface, q is x's
   first heads and k the others (None where the case has no k heads and the interface
   takes None), as views of x's storage, or tensors of their own when the case says
   ``separate`` (k in a layout of its own where the interface draws one); for an x
   interface, x itself (packed: (total, heads, head_dim));
2. those become the interface's tensor format (``FORMATS``): tokens (the batch
   flattened into T tokens, (T, H*D) where the heads merge or (T, H, D)), bhsd, sbhd,
   thd ... always views, so that what a kernel writes lands in ropecheck's copy;
3. the table is made from the declared convention (``tables``), rounded to the
   interface's table dtype (the table of -m for ``table_sign=-1``);
4. the parameters are passed as the library's callers pass them: those without a default
   positionally, those with one by keyword when the value is not the default;
5. the results (the tensors it was given, for an interface that writes in place) come
   back in the canonical layout; a table the kernel wrote into is a finding. An interface
   that quantizes its outputs to fp8 is called by ``quantized`` (q and k split at the
   rotary dimension, the scales, the dequantized results).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ropecheck.calling import quantized, tables
from ropecheck.calling.devices import Placement
from ropecheck.calling.forms import ReturnedWrong, _both_differentiable, _fits, _kind, _own_storage, cu_seqlens
from ropecheck.calling.kv_cache import KVCacheCall
from ropecheck.calling.presets import PRESETS, Preset
from ropecheck.properties.core.contract import segment_lengths
from ropecheck.properties.core.dtypes import dtype_name
from ropecheck.properties.inputs.cases import LAYOUTS
from ropecheck.properties.interfaces.interface import Table


def _tokens(t: torch.Tensor, flat: bool) -> Optional[torch.Tensor]:
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


class _Call:
    """One call of ``fn`` through ``form.api``'s preset on the canonical x (ropecheck's
    private copy) at ``positions``."""

    def __init__(self, form, x: torch.Tensor, positions: torch.Tensor):
        self.form, self.x, self.positions = form, x, positions
        self.preset: Preset = PRESETS[form.api]
        self.convention = form.convention
        self.head_dim = x.shape[-1]
        self.rotary_dim = self.convention.rotary_dim_for(self.head_dim)
        self.copies: list = []  # (canonical view, the tensor the kernel got instead): written back
        self.tables: list = []  # the keys of the kept tables (indexed by position) it is given
        self.made: list = []  # (table, its pristine copy): the tables made for this call only
        self.packed = form.call == "packed"
        self.kv: Optional[KVCacheCall] = None  # the KV cache of a fused rope + cache-write interface

    # --- the canonical tensors -----------------------------------------------------------
    def _qk(self):
        x, form = self.x, self.form
        heads = x.shape[2]
        hq = form.split(heads)
        separate = form.separate and not x.requires_grad
        q = x[:, :, :hq]
        k = x[:, :, hq:] if hq < heads else None
        if separate:
            q = self._keep(q, _own_storage(x)[:, :, :hq])
            if k is not None:
                k = self._keep(k, self._relaid(k) if form.k_memory else _own_storage(x)[:, :, hq:])
        if k is None and heads == 1 and form.q_heads is None and self.preset.k == "required":
            k = _own_storage(x)  # the smallest call: q and k one head each, the same values
        return hq, q, k

    def _keep(self, canonical: torch.Tensor, given: torch.Tensor) -> torch.Tensor:
        self.copies.append((canonical, given))
        return given

    def _relaid(self, k: torch.Tensor) -> torch.Tensor:
        """k's values in the case's own layout for k, on k's device."""
        made = LAYOUTS[self.form.k_memory].make(k.detach().cpu().contiguous())
        return Placement(str(k.device))(made)

    # --- the interface's tensor formats --------------------------------------------------
    def to_api(self, t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if t is None:
            return None
        fmt = self.preset.tensors
        if fmt in ("tokens", "tokens-heads"):
            flat = fmt == "tokens" and "flat" in self.variant().split()
            out = _tokens(t, flat)
            if out is None:  # the batch does not merge into tokens (a slice of a padded batch)
                compact = self._keep(t, torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t))
                out = _tokens(compact, flat)
            return out
        if fmt == "bhsd":
            return t.transpose(1, 2)
        if self.packed:  # thd: (total, heads, head_dim), a view for one row
            return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
        if fmt == "te" and self.variant() == "sbhd":
            return t.transpose(0, 1)
        return t  # bshd

    def from_api(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """An output in the interface's format as the canonical (batch, seq, heads, head_dim)."""
        fmt = self.preset.tensors
        if fmt == "bhsd":
            return out.transpose(1, 2)
        if fmt == "te" and not self.packed and self.variant() == "sbhd":
            return out.transpose(0, 1)
        return out.reshape(like.shape)

    def variant(self) -> str:
        variants = self.preset.interface.variants
        return self.form.variant or (variants[0] if variants else "")

    # --- positions as the interface takes them -------------------------------------------
    def token_positions(self) -> torch.Tensor:
        flat = self.positions.reshape(-1)
        return flat.to(torch.int32) if self.variant() == "int32" else flat

    def sequence_offsets(self) -> torch.Tensor:
        """(sequences,) int64: each row's (packed: each sequence's) first position, after
        checking that positions count up from it, the only positions the interface takes."""
        p = self.positions
        if self.packed:
            lengths = self.lengths()
            flat = p.reshape(-1)
            starts = cu_seqlens(lengths)[:-1].to(torch.int64).tolist()
            rows = [flat[s : s + n] for s, n in zip(starts, lengths)]
        else:
            rows = list(p)
        offsets = torch.tensor([int(r[0]) if r.numel() else 0 for r in rows], dtype=torch.int64)
        for row, offset in zip(rows, offsets.tolist()):
            if not torch.equal(row.cpu(), offset + torch.arange(row.numel())):
                word = self.preset.interface.word("positions")
                raise ValueError(
                    f"--api {self.preset.name} takes positions as {word}: each sequence counts up from its own; "
                    f"ropecheck cannot pass {row.tolist()} (a check must draw offsets + arange)"
                )
        return offsets.to(p.device)

    def lengths(self) -> tuple:
        if self.form.lengths and sum(self.form.lengths) == self.positions.numel():
            return tuple(self.form.lengths)
        return tuple(n for row in self.positions.cpu().numpy() for n in segment_lengths(row))

    # --- tables --------------------------------------------------------------------------
    @property
    def table(self) -> Table:
        table = self.preset.table
        assert table is not None, f"--api {self.preset.name} takes no table"
        return table

    def table_dtype(self) -> str:
        return self.table.dtype_for(dtype_name(self.x.dtype))

    def row_table(self, kind: str):
        rows = self.form.table_rows
        largest = int(self.positions.max()) if self.positions.numel() else 0
        if largest >= rows:
            raise ValueError(f"position {largest} is past the {rows} rows of the {self.table.argument} table")
        key = (kind, self.convention, rows, self.rotary_dim, self.table_dtype(), str(self.x.device))
        self.tables.append(key + (self.form.table_sign, self.table.width))
        return tables.table(*key, sign=self.form.table_sign, width=self.table.width)

    def token_table(self):
        cos, sin = tables.by_token(
            self.convention,
            self.positions,
            self.rotary_dim,
            self.table_dtype(),
            self.table.width,
            self.form.table_sign,
        )
        return self.made_for_this_call(cos), self.made_for_this_call(sin)

    def token_angles(self) -> torch.Tensor:
        """float32 angles per token, each frequency twice: (s, b, 1, r) for an sbhd call,
        (total, 1, 1, r) packed (one row per token, in the order of the packed tokens)."""
        angles = tables.angles_by_token(
            self.convention, self.positions, self.rotary_dim, self.table_dtype(), "full", self.form.table_sign
        )
        if self.packed:
            angles = angles.reshape(-1, 1, 1, angles.shape[-1])
        else:
            angles = angles.transpose(0, 1)[:, :, None, :]
        return self.made_for_this_call(angles)

    def made_for_this_call(self, table: torch.Tensor) -> torch.Tensor:
        """``table``, kept with a pristine copy (a kernel that writes into it is a finding)."""
        self.made.append((table, table.clone()))
        return table

    def cos_sin(self):
        if not hasattr(self, "_cos_sin"):
            by_row = self.table.by == "position"
            self._cos_sin = self.row_table("cos_sin") if by_row else self.token_table()
        return self._cos_sin

    def tables_untouched(self) -> None:
        read = None
        if self.tables:  # the rows this call reads, and their neighbours
            p = self.positions.reshape(-1).to(torch.int64).cpu()
            rows = self.form.table_rows
            read = torch.unique(torch.cat((p - 1, p, p + 1)).clamp(0, max(rows - 1, 0)))
        for key in self.tables:
            kind, conv, rows, r, dtype, device, sign, width = key
            changed = tables.untouched(kind, conv, rows, r, dtype, device, sign, width, read)
            if changed:
                raise ReturnedWrong("mutated", f"the target wrote into {self.table.argument} ({changed})")
        if not all(torch.equal(given, pristine) for given, pristine in self.made):
            raise ReturnedWrong("mutated", f"the target wrote into {self.table.argument}")

    # --- the arguments -------------------------------------------------------------------
    def value(self, role: str, tensors: dict) -> Any:
        if role in tensors:
            return tensors[role]
        conv, preset = self.convention, self.preset
        if role == "positions":
            return self.token_positions()
        if role == "head_size":
            return self.head_dim
        if role == "cache":
            return self.row_table("cache")
        if role in ("cos", "sin"):
            return self.cos_sin()[0 if role == "cos" else 1]
        if role == "freqs":
            return self.row_table("freqs") if self.table.by == "position" else self.token_angles()
        if role == "config":
            return RopeConfig(rotary_interleaved=preset.layouts[conv.layout])
        if role == "mscale":
            return conv.amplitude
        if role == "cp_group":
            return RankGroup()
        if role == "layout":
            return preset.layouts[conv.layout]
        if role == "rotary_dim":
            return self.rotary_dim if self.rotary_dim < self.head_dim else None
        if role == "scale":
            return getattr(conv.scaling, "factor", 1) if conv.scaling.rope_type == "linear" else 1
        if role == "base":
            return conv.base
        if role == "inplace":
            return self.form.inplace
        if role == "seqlen_offsets":
            offsets = self.sequence_offsets()
            shared = offsets.numel() > 0 and bool((offsets == offsets[0]).all())
            return int(offsets[0]) if shared or offsets.numel() == 0 else offsets.to(torch.int32)
        if role == "start_positions":
            offsets = self.sequence_offsets()
            return None if not bool(offsets.any()) else offsets.to(torch.int32)
        if role == "cu_seqlens":
            return cu_seqlens(self.lengths()).to(self.x.device) if self.packed else None
        if role == "max_seqlen":
            return max(self.lengths(), default=0) if self.packed else None
        if role == "tensor_format":
            return "thd" if self.packed else self.variant()
        return {"none": None, "unsqueeze_dim": 1, "cp_size": 1, "cp_rank": 0}[role]

    def arguments(self, tensors: dict) -> tuple:
        args = [self.value(p.role, tensors) for p in self.preset.positional()]
        kwargs = {}
        for p in self.preset.keywords():
            value = self.value(p.role, tensors)
            if not _same(value, p.default):
                kwargs[p.name] = value
        return args, kwargs

    # --- the call ------------------------------------------------------------------------
    def run(self, fn):
        if self.form.call == "qk":
            return self._run_qk(fn)
        t = self.to_api(self.x)
        args, kwargs = self.arguments({"x": t})
        out = fn(*args, **kwargs)
        self._after()
        if not isinstance(out, torch.Tensor):
            raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected a torch.Tensor like its input")
        _fits("y", out, t)
        return self.from_api(out, self.x), out

    def _run_qk(self, fn):
        hq, q, k = self._qk()
        if self.preset.returns == "quantized":
            return quantized.run(self, fn, hq, q, k)
        q_api, k_api = self.to_api(q), self.to_api(k)
        tensors = {"query": q_api, "key": k_api}
        if self.preset.cache:
            if q_api is None or k_api is None:
                raise ValueError(f"--api {self.preset.name} takes a query and a key in every call")
            padded = "padded" in self.variant().split()
            names = {p.role: p.name for p in self.preset.params}
            self.kv = KVCacheCall(self.preset.cache, q_api, k_api, self.token_positions(), padded, names, self._keep)
            tensors = self.kv.arguments()
        args, kwargs = self.arguments(tensors)
        out = fn(*args, **kwargs)
        self._after()
        whole = k is not None and hq < self.x.shape[2]  # k is the case's (not the smallest call's own)
        if self.preset.returns == "inplace":
            return (self.x if whole else self.x[:, :, :hq]), out
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected (q_out, k_out)")
        q_out, k_out = out
        _fits("q_out", q_out, q_api)
        if k_api is not None:
            _fits("k_out", k_out, k_api)
        q_c = self.from_api(q_out, q)
        if not whole:
            return q_c, out
        k_c = self.from_api(k_out, k)
        _both_differentiable(self.x, q_c, k_c)
        return torch.cat((q_c, k_c), dim=2), out

    def _after(self) -> None:
        """What the kernel wrote into the tensors it got instead of views of x goes back
        into x; a table it wrote into, or a KV cache written wrong, is a finding."""
        if not self.x.requires_grad:
            with torch.no_grad():
                for canonical, given in reversed(self.copies):  # a copy of a copy first
                    canonical.copy_(given)
        self.tables_untouched()
        if self.kv is not None:
            self.kv.check()


@dataclass(frozen=True)
class RopeConfig:
    """What Megatron-Core's ``apply_rotary_pos_emb`` reads of its ``TransformerConfig``: the
    pairing, and the unfused path (its fused one is TransformerEngine's kernel)."""

    rotary_interleaved: bool
    apply_rope_fusion: bool = False
    multi_latent_attention: bool = False
    mrope_section: Optional[list] = None


class RankGroup:
    """A context-parallel group as an interface asks of a process group (``size()``,
    ``rank()``) without torch.distributed: ``size`` ranks, this one ``rank`` (one rank of
    one by default; ``context_parallel`` makes the ranks of --cp-size)."""

    def __init__(self, size: int = 1, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"RankGroup(size={self._size}, rank={self._rank})"


def _same(value, default) -> bool:
    """Whether ``value`` is the parameter's default (then it is not passed)."""
    if isinstance(value, torch.Tensor):
        return False
    if default is None or value is None:
        return value is default
    return bool(value == default)


def invoke(form, fn, x: torch.Tensor, positions: torch.Tensor):
    """(canonical y, what the target returned) for ``fn`` called through ``form.api``."""
    return _Call(form, x, positions).run(fn)
