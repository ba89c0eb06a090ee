"""The fixed inputs every run tries besides the drawn ones (the critical small cases, the
large ones where dispatch thresholds bite, the production ones and the input past 2^31
elements), and the case transforms the checks share: a case in a call form
(``in_form``), inside a position range (``within``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ropecheck.properties.core.contract import segment_lengths
from ropecheck.properties.core.sizes import HUGE_ELEMENTS, TOY, Sizes, common_head_dim, pool_shapes
from ropecheck.properties.inputs.cases import Case
from ropecheck.properties.inputs.strategies import (
    FREE_HEAD_DIMS,
    PACKED_MEMORY,
    fitted_seq,
    head_dim_choices,
    heads_relation,
    max_position_for,
    model_qk_heads,
    packed_layouts,
    partial_head_dims,
    scales,
    shape_head_dim,
)


def critical_cases(dtype: str, rotary_dim: int | None = None, call: str = "x") -> list[Case]:
    """Inputs every run tries first, whatever the seed: decode at large per-row offsets,
    every boundary position up to 2^24 on a non-power-of-two head size, per-row
    offsets on a padded view, two rows of a transposed view; in the target's call form,
    and for the qk form a grouped-query input (``gqa_case``)."""
    r = rotary_dim
    small = FREE_HEAD_DIMS[0] if r is None else r
    other = FREE_HEAD_DIMS[1] if r is None else r + 48
    mid = FREE_HEAD_DIMS[2] if r is None else 4 * r
    boundary = [0, 1, 255, 256, 257, 2047, 2048, 2049, 4095, 4096, 32767, 32768, 65504, 65505, 2**20 + 1, 2**24]
    limit_other = max_position_for(other)
    cap = [min(p, limit_other) for p in boundary]
    return [
        in_form(case, call)
        for case in (
            Case(dtype, 2, 1, 2, mid, ((4097,), (70001,)), "transposed", 1.0, 1),
            Case(dtype, 1, len(cap), 1, other, (tuple(cap),), "contiguous", 1.0, 2),
            Case(dtype, 1, len(boundary), 2, small, (tuple(boundary),), "strided-heads", 1.0, 3),
            Case(
                dtype,
                3,
                5,
                2,
                mid,
                tuple(tuple(o + i for i in range(5)) for o in (0, 1000, 70000)),
                "padded",
                scales(dtype)[-1],
                4,
            ),
            # HF's layout with two rows: its one-token slices (decode steps) have a row stride
            # that is not heads x head_dim
            Case(dtype, 2, 4, 2, small, ((0, 1, 2, 3), (100, 101, 102, 103)), "transposed", 1.0, 5),
        )
    ] + ([gqa_case(dtype, small)] if call == "qk" else [])


def switch_cases(dtype: str, switches, rotary_dim: int | None = None, call: str = "x") -> list[Case]:
    """For each length L at which a declared scaling switches (``Scaling.switches``:
    LongRoPE's short/long factors, dynamic NTK's base), three calls of 16 tokens counting
    up to L - 2, L - 1 and L: seq_len (largest position + 1) one below, at and one above
    L, so that a ``>`` written ``>=`` or a seq_len one short is wrong at every position
    of one of them, whatever the draws."""
    head_dim = FREE_HEAD_DIMS[0] if rotary_dim is None else rotary_dim
    out = []
    for n, length in enumerate(switches):
        for k, top in enumerate((length - 2, length - 1, length)):
            if top >= 15:
                row = tuple(range(top - 15, top + 1))
                out.append(in_form(Case(dtype, 1, 16, 2, head_dim, (row,), "contiguous", 1.0, 50 + 3 * n + k), call))
    return out


def gqa_case(dtype: str, head_dim: int) -> Case:
    """The qk form's fixed grouped-query input: 4 query heads sharing 2 key heads (q head h
    attends k head h // 2), in storages of their own, two rows at different offsets: a
    kernel that maps q heads to k heads wrongly, or reads k's heads with q's stride, fails
    whatever the draws (MHA and MQA have no group to get wrong)."""
    return Case(
        dtype,
        2,
        3,
        4,
        head_dim,
        ((0, 1, 2), (500, 501, 502)),
        "contiguous",
        1.0,
        6,
        call="qk",
        k_heads=2,
        separate=True,
    )


def large_cases(dtype: str, rotary_dim: int | None = None, call: str = "x") -> list[Case]:
    """Fixed large inputs every run tries, for a kernel that takes another path above a
    size: 2^14 and 2^15 + 1 token x head products, head_dim 256 (4 r with a partial
    rotary dim r), and 32 query heads with one key head."""
    r = rotary_dim
    small, wide = r or FREE_HEAD_DIMS[0], 256 if r is None else 4 * r

    def rows(*starts, seq):
        return tuple(tuple(range(o, o + seq)) for o in starts)

    # the small head size where the threshold is in tokens x heads: the same dispatch, an
    # eighth of the float64 reference's work
    return [
        in_form(case, call, large=True)
        for case in (
            Case(dtype, 2, 1024, 8, small, rows(0, 5000, seq=1024), "contiguous", 1.0, 21),
            Case(dtype, 1, 3641, 9, small, rows(100, seq=3641), "contiguous", 1.0, 22),
            Case(dtype, 1, 64, 4, wide, rows(70000, seq=64), "transposed", 1.0, 23),
            Case(dtype, 1, 64, 33, r or FREE_HEAD_DIMS[2], rows(4000, seq=64), "contiguous", 1.0, 24),
        )
    ]


def production_cases(dtype: str, rotary_dim: int | None = None, call: str = "x", sizes: Sizes = TOY) -> list[Case]:
    """Fixed inputs at production sizes: a long prefill (the longest sequence, 8 heads and
    the common head size), the widest head, a head size past 128 that is not a power of
    two (a kernel's block of the next power of two, masked), and a decode batch; each cut
    to the sizes' element budget. Empty for sizes that are not production ones."""
    if not sizes.production:
        return []
    dims = sizes.head_dims if rotary_dim is None else partial_head_dims(rotary_dim)
    common = common_head_dim(dims)
    widest = max(dims)
    odd = next((d for d in dims if d > 128 and d & (d - 1)), widest)

    def fitted(batch, seq, heads, head_dim, start, memory, seed) -> Case:
        seq = fitted_seq(seq, 1, batch * heads * head_dim, sizes)
        rows = tuple(tuple(range(start + 1000 * b, start + 1000 * b + seq)) for b in range(batch))
        return Case(dtype, batch, seq, heads, head_dim, rows, memory, 1.0, seed)

    return [
        in_form(case, call, large=True)
        for case in (
            fitted(1, sizes.max_seq, 9, common, 0, "contiguous", 31),
            fitted(2, 256, 5, widest, 4000, "transposed", 32),
            fitted(1, 1000, 5, odd, 100, "padded", 33),
            fitted(64, 1, 33, common, 8000, "contiguous", 34),
        )
    ]


def for_model(case: Case, sizes: Sizes, rotary_dim: int | None, layouts: tuple) -> Case:
    """A fixed input in one model's shapes (``Sizes.one_model``), its positions (within the
    table budget of the model's head size) and its batch and sequence kept: the head size,
    the heads (q's and k's; k=None stays), the first of ``layouts``, q and k apart."""
    head_dim = head_dim_choices(rotary_dim, sizes)[0]
    if case.call == "qk":
        heads, k_heads = model_qk_heads(sizes)
        case = replace(case, heads=heads, k_heads=k_heads if case.k_heads else 0, separate=True)
    else:
        case = replace(case, heads=max(sizes.heads))
    if case.call == "packed":
        layouts = packed_layouts(layouts)
    case = replace(case, head_dim=head_dim, memory=layouts[0], k_memory="")
    return within(case, max_position_for(head_dim), keep_rows=True)


def onto_pool(case: Case, sizes: Sizes, rotary_dim: int | None, large: bool = False) -> Case:
    """A fixed input in a pooled run (``Sizes.pool``), in a shape of the pool: its heads
    (k=None stays) and head size, the input's layout. A small input goes to a shape with
    room for its rows, whose heads relate as its own do (MQA, GQA, one head), of the
    nearest head size (in that order of preference); it keeps its rows (their positions
    are its point: clipped to the head size's table budget), repeated up to the shape's
    batch. A large one goes to the shape of the nearest head size (of those, the one
    with the most heads), takes the shape's batch and keeps its token x head product
    (what a size switch sees), each row counting up from a start of its rows (moved
    down into the budget); a packed one keeps its sequences."""
    pool = pool_shapes(sizes)
    if not pool:
        return case
    qk = case.call == "qk"

    def heads_of(s) -> tuple:
        return (s.q_heads, s.k_heads) if qk else (s.heads, 0)

    def relation(heads: int, k_heads: int) -> str:
        return heads_relation(heads, k_heads) if qk else "single" if heads == 1 else "several"

    def near(s) -> tuple:
        distance = abs(shape_head_dim(s, rotary_dim, sizes) - case.head_dim)
        related = relation(*heads_of(s)) == relation(case.heads, case.k_heads)
        return (distance, -sum(heads_of(s))) if large else (s.batch < case.batch, not related, distance)

    shape = min(pool, key=near)
    heads, k_heads = heads_of(shape)
    out = replace(case, heads=heads, head_dim=shape_head_dim(shape, rotary_dim, sizes))
    if case.call == "qk":
        out = replace(out, k_heads=k_heads if case.k_heads else 0)
    if not large and case.call != "packed" and shape.batch > case.batch:  # its rows again, as more rows
        out = replace(
            out, batch=shape.batch, positions=tuple(case.positions[b % case.batch] for b in range(shape.batch))
        )
    if large and case.call != "packed":
        first = case.positions_array()[:, 0]
        tokens = -(-case.batch * case.seq * (case.heads + case.k_heads) // (shape.batch * (heads + out.k_heads)))
        starts = [int(first[b % len(first)]) + (b // len(first)) * tokens for b in range(shape.batch)]
        grid = tuple(tuple(range(o, o + tokens)) for o in starts)
        out = replace(out, batch=shape.batch, seq=tokens, positions=grid)
    return within(out, max_position_for(out.head_dim), keep_rows=large)


def huge_case(dtype: str, rotary_dim: int | None = None, call: str = "x") -> Case:
    """The input past 2^31 elements (``sizes.HUGE_ELEMENTS``): 64 rows of 32 heads
    of 128 (4 r with a partial rotary dim r) counting up from different offsets; a kernel
    that indexes with int32 offsets wraps around past element 2^31 - 1."""
    head_dim = 128 if rotary_dim is None else 4 * rotary_dim
    heads, batch = 32, 64
    seq = -(-HUGE_ELEMENTS // (batch * heads * head_dim))
    rows = tuple(tuple(range(o, o + seq)) for o in range(0, 7 * batch, 7))
    return in_form(Case(dtype, batch, seq, heads, head_dim, rows, "contiguous", 1.0, 41), call, large=True)


def counts_up(case: Case) -> bool:
    """Whether every row of the case's positions (every packed sequence) is offset + arange."""
    p = case.positions_array()
    if case.call == "packed" and case.lengths and sum(case.lengths) == p.size:
        starts = np.cumsum((0,) + tuple(case.lengths[:-1]))
        return all(bool((np.diff(p[0, s : s + n]) == 1).all()) for s, n in zip(starts, case.lengths))
    return bool((np.diff(p, axis=1) == 1).all())


def within(case: Case, limit: int, keep_rows: bool = False) -> Case:
    """A fixed input with its positions in [0, limit]: clipped, or moved down as a whole
    (they keep counting up) per packed sequence, and per row with ``keep_rows``."""
    p = case.positions_array()
    if keep_rows and case.call != "packed":
        return case.with_positions(np.maximum(p - np.maximum(p.max(1, keepdims=True) - limit, 0), 0))
    if case.call != "packed":
        return case.with_positions(np.minimum(p, limit))
    row, out, start = p[0], [], 0
    for n in case.lengths:
        seq = row[start : start + n]
        out.append(seq - max(int(seq.max(initial=0)) - limit, 0))
        start += n
    return case.with_positions(np.maximum(np.concatenate(out)[None, :], 0))


def in_form(case: Case, call: str, large: bool = False) -> Case:
    """A fixed input in another call form. qk: x's heads become q's and k's (one key
    head, or as many as q's on odd seeds; a large input's last head is its one key head),
    in storages of their own on even seeds. packed: each row's runs of consecutive
    positions become sequences, an empty one after the first."""
    if call == "qk":
        if large:
            return replace(case, call="qk", heads=case.heads - 1, k_heads=1)
        k = case.heads if case.seed % 2 else 1
        return replace(case, call="qk", k_heads=k, separate=case.seed % 2 == 0)
    if call == "packed":
        rows = case.positions_array()
        lengths = [n for row in rows for n in segment_lengths(row)]
        lengths.insert(1, 0)
        memory = case.memory if case.memory in PACKED_MEMORY else "contiguous"
        return replace(
            case,
            call="packed",
            batch=1,
            seq=int(rows.size),
            positions=(tuple(rows.reshape(-1).tolist()),),
            memory=memory,
            lengths=tuple(lengths),
        )
    return case
