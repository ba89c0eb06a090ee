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

from typing import Any, Optional

import torch

from ropecheck.calling import qk_norm, quantized, roles, tables
from ropecheck.calling.devices import Placement
from ropecheck.calling.formats import tensor_format
from ropecheck.calling.forms import (
    ReturnedWrong,
    Stages,
    TargetCall,
    _both_differentiable,
    _fits,
    _kind,
    _own_storage,
    cu_seqlens,
    drive,
)
from ropecheck.calling.kv_cache import KVCacheCall
from ropecheck.calling.presets import PRESETS, Preset
from ropecheck.properties.core.contract import segment_lengths
from ropecheck.properties.core.dtypes import dtype_name
from ropecheck.properties.inputs.cases import LAYOUTS
from ropecheck.properties.interfaces.draws import media_of, observe
from ropecheck.properties.interfaces.interface import Table


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
        self.format = tensor_format(self.preset.tensors)
        self.cp, self.rank = 1, 0  # context-parallel ranks, and the one being called (context_parallel)
        self.passed: dict = {}  # factor -> the class of the value a role passed (roles), for observe

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
        """A canonical tensor in the interface's format (``formats``): a view, or, where the
        batch does not merge into tokens (a slice of a padded batch), a compact copy of it
        whose writes go back into it."""
        if t is None:
            return None
        out = self.format.to_api(self, t)
        if out is None:
            compact = self._keep(t, torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t))
            out = self.format.to_api(self, compact)
        assert out is not None  # a compact copy merges its batch into tokens
        if self.format.name == "tokens" and "query shape" not in self.passed:  # (T, H*D) where the heads merge
            self.passed["query shape"] = "(T, H*D)" if out.dim() == 2 else "(T, H, D)"
        return out

    def from_api(self, out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """An output in the interface's format as the canonical (batch, seq, heads, head_dim)."""
        return self.format.from_api(self, out, like)

    def flat_tokens(self) -> bool:
        """Whether a tokens-format call takes (T, H*D) (its ``query shape`` class)."""
        return self.choice("query shape") == "(T, H*D)"

    def format_variant(self) -> str:
        """The batch format of a format-choosing interface: its ``tensor_format`` class,
        sbhd or bshd (thd is a packed call's)."""
        chosen = self.choice("tensor_format")
        return chosen if chosen in ("sbhd", "bshd") else "sbhd"

    def layout_flag(self):
        """The interface's pairing argument for the declared layout (is_neox, interleave, ...)."""
        return self.preset.layouts[self.convention.layout]

    def choice(self, factor: str) -> str:
        """The class of ``factor`` this call is made in: the case's, else the factor's first."""
        chosen = dict(self.form.choices).get(factor)
        if chosen is not None:
            return chosen
        space = self.preset.interface.space
        return space.factor(factor).classes[0].name if space.has(factor) else ""

    # --- positions as the interface takes them -------------------------------------------
    def token_positions(self) -> torch.Tensor:
        """The positions per token: (T,), or an M-RoPE run's (3, T) (t, h, w rows), in the
        dtype of the call's ``positions dtype`` class."""
        p = self.positions
        flat = p.reshape(-1, p.shape[-1]).T.contiguous() if self.form.mrope is not None else p.reshape(-1)
        return flat.to(torch.int32) if self.choice("positions dtype") == "int32" else flat

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
        offsets = torch.tensor([int(r[0]) if r.numel() else 0 for r in rows], dtype=torch.int64, device="cpu")
        for row, offset in zip(rows, offsets.tolist()):
            if not torch.equal(row.cpu(), offset + torch.arange(row.numel(), device="cpu")):
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
        """The value of a parameter's role (``roles``); ``tensors``: what this call's stages
        supplied (the interface's tensors, the KV cache, the fp8 parts)."""
        return roles.value(self, role, tensors)

    def arguments(self, tensors: dict) -> tuple:
        args = [self.value(p.role, tensors) for p in self.preset.positional()]
        kwargs = {}
        for p in self.preset.keywords():
            value = self.value(p.role, tensors)
            if not _same(value, p.default):
                kwargs[p.name] = value
        if self.form.mrope is not None:  # an M-RoPE run: its sections, where the kernel takes them
            kwargs.update(
                {p.name: self.value(p.role, tensors) for p in self.preset.mrope_params if p.name in self.form.takes}
            )
        return args, kwargs

    # --- the call ------------------------------------------------------------------------
    def stages_seen(self, seen: Optional[dict]) -> Stages:
        """``stages``, and into ``seen`` the classes of each factor of the interface's space
        the call had (``interfaces.draws.observe``), whether it returned or not."""
        try:
            return (yield from self.stages())
        finally:
            if seen is not None:
                seen.update(self.observed())

    def observed(self) -> dict:
        """factor -> the class of it this call had: from its tensors, its positions and the
        values its roles passed (``passed``)."""
        space = self.preset.interface.space
        if not space.factors:
            return {}
        heads = self.x.shape[2]
        if self.form.call == "qk":
            hq = self.form.split(heads)
            hk = heads - hq if hq < heads else (1 if self.preset.k == "required" else 0)
        else:
            hq, hk = heads, 0
        positions = self.positions.detach().cpu().numpy()
        facts = {
            "call": self.form.call,
            "positions": positions[..., 0] if self.form.mrope is not None else positions,  # M-RoPE: t's
            "axes": positions if self.form.mrope is not None else None,
            "lengths": self.lengths() if self.packed else (),
            "q_heads": hq,
            "k_heads": hk,
            "memory": self.form.memory,
            "separate": self.form.separate,
            "k_memory": self.form.k_memory,
            "choices": self.form.choices,
            "passed": self.passed,
        }
        seen = observe(space, facts)
        if self.form.mrope is not None:  # an M-RoPE run's own factor: the media of its tokens
            seen["media"] = media_of(positions)
        return seen

    def stages(self) -> Stages:
        """The staged call (``forms.drive``): the arguments prepared, the call, then its
        outputs brought back and checked."""
        if self.form.call == "qk":
            return (yield from self._qk_stages())
        t = self.to_api(self.x)
        assert t is not None  # x is a tensor
        args, kwargs = self.arguments({"x": t})
        given = t.detach().clone() if self.preset.writes_x(self.form.choices) else None
        out = yield TargetCall(args, kwargs)
        self._after()
        if not isinstance(out, torch.Tensor):
            raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected a torch.Tensor like its input")
        _fits("y", out, t)
        if given is not None and not torch.equal(out.detach(), t.detach()):
            flag = " or ".join(f"{factor}={value}" for factor, value in self.preset.in_place_when)
            left = "left as it was" if torch.equal(t.detach(), given) else "holding something else"
            raise ReturnedWrong(
                "inplace",
                f"{flag} was passed, but {self.preset.interface.word('query', 'x')} does not hold the output it "
                f"returned ({self.preset.interface.word('query', 'x')} {left})",
            )
        return self.from_api(out, self.x), out

    def _qk_stages(self) -> Stages:
        hq, q, k = self._qk()
        if self.preset.returns == "quantized":
            return (yield from quantized.stages(self, hq, q, k))
        if self.preset.interface.norm:
            return (yield from qk_norm.stages(self, hq, q, k))
        q_api, k_api = self.to_api(q), self.to_api(k)
        tensors = {"query": q_api, "key": k_api}
        if self.preset.cache:
            if q_api is None or k_api is None:
                raise ValueError(f"--api {self.preset.name} takes a query and a key in every call")
            padded = self.choice("padding") == "padded batch"
            names = {p.role: p.name for p in self.preset.params}
            preset = self.preset
            self.kv = KVCacheCall(
                preset.cache,
                q_api,
                k_api,
                self.token_positions(),
                padded,
                names,
                self._keep,
                padding_slot=preset.padding_slot,
                key_cached=preset.key_cached,
            )
            tensors = self.kv.arguments()
        args, kwargs = self.arguments(tensors)
        out = yield TargetCall(args, kwargs)
        self._after()
        whole = k is not None and hq < self.x.shape[2]  # k is the case's (not the smallest call's own)
        if self.preset.returns == "inplace":
            return (self.x if whole else self.x[:, :, :hq]), out
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected (q_out, k_out)")
        q_out, k_out = out
        assert q_api is not None  # q is a tensor
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
        if self.kv is not None:  # first: where the rotated k lives in the cache, the checks read it in key
            self.kv.check()
        if not self.x.requires_grad:
            with torch.no_grad():
                for canonical, given in reversed(self.copies):  # a copy of a copy first
                    canonical.copy_(given)
        self.tables_untouched()


def _same(value, default) -> bool:
    """Whether ``value`` is the parameter's default (then it is not passed)."""
    if isinstance(value, torch.Tensor):
        return False
    if default is None or value is None:
        return value is default
    return bool(value == default)


def stages(form, x: torch.Tensor, positions: torch.Tensor, seen: Optional[dict] = None) -> Stages:
    """The staged call (``forms.drive``) through ``form.api``; ``seen`` gets the classes of
    the interface's argument values the call had."""
    return _Call(form, x, positions).stages_seen(seen)


def invoke(form, fn, x: torch.Tensor, positions: torch.Tensor, seen: Optional[dict] = None):
    """(canonical y, what the target returned) for ``fn`` called through ``form.api``."""
    return drive(stages(form, x, positions, seen), fn)
