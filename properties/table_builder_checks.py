"""Checks of table builders: the half of a production RoPE that turns positions into cos/sin
(where the scalings live), judged on its own against float64 (``builder_tables``).

Two families, one set of properties:
- ``table-builder``: ``build(positions) -> (cos, sin)``, positions int64 (n,); cos and sin
  (n, r/2), one column per frequency, or (n, r), each frequency twice as --layout pairs
  features (half: cat(f, f); interleaved: repeat_interleave(f, 2)); any float dtype. A
  dynamic scaling takes the call's sequence length as its largest position + 1 (HF's rule);
- ``cache-builder``: ``build(max_position) -> cos_sin_cache`` (max_position, r), row p =
  cat(cos(p theta), sin(p theta)), r/2 each; the sequence length is max_position.

Properties: contract, reference (every entry, the worst one named with a likely cause),
stateless (a short call, a long one, the short and the long again: equal results; where
dynamic NTK caches leak). Inputs: positions counting up from an offset, scattered sets,
windows ending at each switch length of the scaling (``Scaling.switches``) and the
boundary positions of ``fixed_cases``; every run tries the switch lengths L - 1, L, L + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st

from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.builder_tables import TableConvention, judge, read_cache, read_table, same_tables
from ropecheck.properties.core.contract import Subject
from ropecheck.properties.inputs.strategies import MAX_POSITION
from ropecheck.properties.one_d import _declare as declare_1d
from ropecheck.properties.property import Declaration, Family, FamilyContext, FamilyError, SmokeInput, family_registry

BOUNDARY = (0, 1, 255, 256, 257, 2047, 2048, 2049, 4095, 4096, 32767, 32768, 65504, 65505, 2**20 + 1, 2**24)
MAX_CACHE = 2**15  # rows of the largest cache drawn (the fixed inputs add the switch lengths)
MAX_TOKENS = 64  # positions of the largest table call drawn


@dataclass(frozen=True)
class TableCall:
    """One call of a builder: its positions (call "table") or its cache length ("cache")."""

    call: str
    positions: tuple = ()
    length: int = 0

    @property
    def size(self) -> int:
        return len(self.positions) if self.call == "table" else self.length

    @property
    def shape(self) -> tuple:  # the runner's time limit scales with it
        return (max(self.size, 1),)

    def argument(self):
        return torch.tensor(self.positions, dtype=torch.int64) if self.call == "table" else self.length

    def position_array(self) -> np.ndarray:
        return np.asarray(self.positions, np.int64) if self.call == "table" else np.arange(self.length)

    def seq_len(self) -> int:
        """The sequence length a dynamic scaling sees: largest position + 1; max_position."""
        return int(max(self.positions)) + 1 if self.call == "table" else self.length

    def describe(self) -> str:
        if self.call == "cache":
            return f"build({self.length})"
        p = self.positions
        if len(p) > 2 and all(b - a == 1 for a, b in zip(p, p[1:])):
            return f"build(positions {p[0]} .. {p[-1]}, {len(p)} tokens)"
        return f"build(positions {list(p)})"


@dataclass(frozen=True)
class CallPair:
    """The stateless check's input: a short call and a longer one."""

    short: TableCall
    long: TableCall

    @property
    def call(self) -> str:
        return self.short.call

    @property
    def shape(self) -> tuple:
        return (self.short.size + self.long.size,)

    def describe(self) -> str:
        return f"{self.short.describe()} before and after {self.long.describe()}"


@dataclass
class TableContext(FamilyContext):
    """A table builder's context: the builder behind the calling layer (time limit,
    exceptions as findings) and its declared convention; no error model of its own (the
    tables' dtype, known after the call, decides it)."""

    def __post_init__(self):
        self.rope = self.target.caller(self.timeout)

    @property
    def convention(self) -> TableConvention:
        return self.target.convention

    @property
    def max_position(self) -> int:
        return min(MAX_POSITION, self.target.max_position or MAX_POSITION)

    @property
    def switches(self) -> tuple:
        return tuple(L for L in self.convention.scaling.switches() if L + 1 <= self.max_position)

    def build(self, case: TableCall):
        """The builder's result on ``case``, read (CheckFailure for a broken contract); a
        positions tensor it changed is a finding."""
        argument = case.argument()
        out = self.rope(argument)
        if case.call == "cache":
            return read_cache(out, case.length, self.convention)
        if not torch.equal(argument, case.argument()):
            raise CheckFailure(f"the builder changed its positions tensor: {argument.tolist()[:8]} after the call")
        return read_table(out, case.size, self.convention)


# --- inputs ------------------------------------------------------------------------------


def _magnitude(top: int):
    """Integers 0 .. top, log-uniform: as many small positions as large ones."""
    return st.integers(0, max(top, 1).bit_length()).flatmap(lambda k: st.integers(0, min(2**k, top)))


def _window(end: int, n: int) -> TableCall:
    """n tokens counting up to ``end`` (clipped at 0)."""
    return TableCall("table", tuple(range(max(end - n + 1, 0), end + 1)))


def _table_calls(ctx: TableContext):
    top = ctx.max_position
    counting = st.tuples(_magnitude(top), st.integers(1, MAX_TOKENS)).map(
        lambda t: _window(min(t[0] + t[1] - 1, top), t[1])
    )
    scattered = st.lists(_magnitude(top), min_size=1, max_size=MAX_TOKENS // 2).map(
        lambda p: TableCall("table", tuple(p))
    )
    options = [counting, scattered]
    if ctx.switches:  # seq_len L - 2 .. L + 2 around a switch
        options.append(
            st.tuples(st.sampled_from(ctx.switches), st.integers(-2, 2), st.integers(1, MAX_TOKENS)).map(
                lambda t: _window(t[0] + t[1] - 1, t[2])
            )
        )
    return st.one_of(options)


def _cache_calls(ctx: TableContext):
    top = min(MAX_CACHE, ctx.max_position + 1)
    lengths = _magnitude(top).map(lambda n: TableCall("cache", length=max(n, 1)))
    if not ctx.switches:
        return lengths
    near = st.tuples(st.sampled_from(ctx.switches), st.integers(-2, 2)).map(
        lambda t: TableCall("cache", length=t[0] + t[1])
    )
    return st.one_of(lengths, near)


def _top(ctx: TableContext, call: str) -> int:
    """The largest sequence length a call of the stateless check may have."""
    return ctx.max_position + 1 if call == "table" else min(4 * MAX_CACHE, ctx.max_position + 1)


def _longer(ctx: TableContext, short: TableCall):
    """A call longer than ``short`` (a larger sequence length) of the same form."""
    top, n = _top(ctx, short.call), short.seq_len()
    lengths = _magnitude(top - n - 1).map(lambda d: n + 1 + d)
    if short.call == "cache":
        return lengths.map(lambda m: TableCall("cache", length=m))
    return lengths.map(lambda m: _window(m - 1, len(short.positions)))


def _cases(prop, ctx: TableContext):
    calls = _table_calls(ctx) if ctx.target.call == "table" else _cache_calls(ctx)
    if not prop.case_options.get("pair"):
        return calls
    shorter = calls.filter(lambda c: c.seq_len() < _top(ctx, c.call))
    return shorter.flatmap(lambda short: _longer(ctx, short).map(lambda long: CallPair(short, long)))


def _at_length(call: str, seq_len: int, n: int = 16) -> TableCall:
    """A call whose sequence length is ``seq_len``: n tokens up to seq_len - 1, or the cache."""
    return _window(seq_len - 1, n) if call == "table" else TableCall("cache", length=seq_len)


def _fixed(prop, ctx: TableContext) -> list:
    """Every run tries the sequence lengths L - 1, L, L + 1 around each switch (a short
    call of length L or L + 1 after one of 2 L + 3 for the stateless check), and the
    boundary positions (a cache of 2049 rows)."""
    call = ctx.target.call
    if prop.case_options.get("pair"):
        lengths = [L + k for L in ctx.switches for k in (0, 1)] or [17]
        pairs = [CallPair(_at_length(call, n), _at_length(call, 2 * n + 3)) for n in lengths]
        return [(p, {}) for p in pairs if p.long.seq_len() <= ctx.max_position + 1]
    out = [_at_length(call, L + k) for L in ctx.switches for k in (-1, 0, 1)]
    if call == "table":
        out.append(TableCall("table", tuple(p for p in BOUNDARY if p <= ctx.max_position)))
    else:
        out += [TableCall("cache", length=n) for n in (1, 2049) if n <= ctx.max_position + 1]
    return [(case, {}) for case in out]


def _smoke_inputs(target: Subject, dtype: str):
    if target.call == "cache":
        yield SmokeInput("build(4)", "max_position 4", lambda rope: rope(4))
    else:
        yield SmokeInput(
            "positions 0 .. 3", "positions int64 (4,): 0 .. 3", lambda rope: rope(torch.arange(4, dtype=torch.int64))
        )


def _declare(family: str):
    """The convention of a table builder: the 1-D one (layout, base, rotary_dim, scaling)
    at --rotary-dim R, which it needs (it has no head size); --layout optional (a table of
    R columns needs it); it takes no tensors to rotate (dtype "-") and has no backward."""

    def declare(parameters: dict, own) -> Declaration:
        r = parameters.get("rotary_dim") or getattr(own, "rotary_dim", None)
        if r is None:
            raise FamilyError(
                f"--family {family} needs --rotary-dim R: a builder has no head size, R is the width of its "
                f"tables (R/2 frequencies)"
            )
        given = parameters.get("layout") is not None or own is not None
        layout = parameters.get("layout") or getattr(own, "layout", "half")
        conv = declare_1d({**parameters, "layout": layout, "rotary_dim": r}, own).convention
        table = TableConvention(conv.layout, conv.base, r, conv.scaling, layout_given=given)
        for seq_len in {None, *(L + k for L in conv.scaling.switches() for k in (0, 1))}:
            try:  # LongRoPE's factors must fit r
                table.theta(r, seq_len=seq_len)
            except ValueError as exc:
                raise FamilyError(str(exc)) from None
        return Declaration(table, rotary_dim=r, dtypes=("-",))

    return declare


TABLES = Family(
    "table builder",
    TableContext,
    _cases,
    _fixed,
    smoke_inputs=_smoke_inputs,
    calls=("table", "cache"),
    description="build(positions) -> (cos, sin) or build(max_position) -> cos_sin_cache",
)
TABLE_PROPERTIES: dict
TABLE_PROPERTIES, register = family_registry(TABLES)
TABLE_FAMILIES = (
    TABLES.variant(
        "table-builder",
        _declare("table-builder"),
        "build(positions) -> (cos, sin), positions int64 (n,); each (n, r/2) or (n, r) per --layout",
        calls=("table",),
    ),
    TABLES.variant(
        "cache-builder",
        _declare("cache-builder"),
        "build(max_position) -> cos_sin_cache (max_position, r), row p = cat(cos(p theta), sin(p theta))",
        calls=("cache",),
    ),
)
CALLS = ("table", "cache")


@register(
    name="contract",
    formula="build(positions) -> (cos, sin), each (n, r/2) or (n, r); build(P) -> cos_sin_cache (P, r); "
    "one float dtype, finite",
    calls=CALLS,
)
def check_contract(ctx: TableContext, case: TableCall) -> float:
    ctx.build(case)
    return 0.0


@register(
    name="reference",
    formula="cos[t, i] = A cos(m_t theta_i), sin[t, i] = A sin(m_t theta_i) within A (dphi_i + 6 u32 + u_out) "
    "(a cache: row p = cat(cos, sin) at m = p)",
    calls=CALLS,
)
def check_reference(ctx: TableContext, case: TableCall) -> float:
    return judge(ctx.build(case), ctx.convention, case.position_array(), case.seq_len())


@register(
    name="stateless",
    formula="build(short) and build(long) give the same tables before and after each other",
    calls=CALLS,
    case_options={"pair": True},
)
def check_stateless(ctx: TableContext, pair: CallPair) -> float:
    ctx.build(_at_length(pair.call, 1, 1))  # a first, tiny call: a builder may reset its state on it
    short, long = ctx.build(pair.short), ctx.build(pair.long)
    worst = same_tables(
        short,
        ctx.build(pair.short),
        ctx.convention,
        pair.short.position_array(),
        f"{pair.short.describe()} after {pair.long.describe()} differs from before it: state of the longer call leaks",
    )
    again = same_tables(
        long,
        ctx.build(pair.long),
        ctx.convention,
        pair.long.position_array(),
        f"{pair.long.describe()} repeated differs from its first result",
    )
    return max(worst, again)
