"""Hypothesis strategies for RoPE inputs, composed from small named pieces.

Shapes: head_dim not a power of two, heads 1, seq 1, batch > 1, the head sizes models
pair with a partial rotary dimension, the memory layouts models produce (cases.LAYOUTS;
exotic ones are probed apart). Positions: offsets as in KV-cache
decode, different per batch row, sparse, large up to 2^24, and values across 2^k
boundaries and the int16 / float16 / bfloat16 limits.

Memory budget: a target that tabulates cos/sin up to the largest position it sees holds
(max position x head_dim) floats, so the largest position any call uses (shifts and
steps included) shrinks as head_dim grows (POSITION_BUDGET / head_dim, at most 2^24):
2^24 with head_dim <= 8, 2^20 with 128. With 2^27 floats (512 MiB) per table, a table that
doubles past the largest position and the temporaries of building it stay within a few
GiB; at 2^29 a correct doubling table (nanotron's) needed more than 12 GiB.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from hypothesis import strategies as st

from ropecheck.properties.core.sizes import TOY, Shape, Sizes, common_head_dim, pool_head_dim, pool_shapes
from ropecheck.properties.inputs.cases import GRAD_LAYOUTS, MEMORY_LAYOUTS, Case

MAX_POSITION = 2**24
POSITION_BUDGET = 2**27

# Integer limits of the dtypes positions get wrongly held in, and 2^k +- 1.
LIMITS = (255, 256, 257, 2047, 2048, 2049, 32767, 32768, 65504, 65505, 65535, 65536)
BOUNDARIES = tuple(
    sorted({v for k in range(1, 25) for v in (2**k - 1, 2**k, 2**k + 1) if v <= MAX_POSITION} | set(LIMITS))
)

# Three head sizes per run: a small one (minimal counterexamples; >= 4 so the layouts
# differ), one that is not a multiple of 64 (special paths), and the common 128. Few
# distinct sizes keep targets that build a cos/sin table per head size from rebuilding
# it on every call; the sizes are the same in every run, so verdicts do not depend on
# the seed.
FREE_HEAD_DIMS = TOY.head_dims  # the production sizes draw more (properties.core.sizes)


def scales(dtype: str) -> tuple[float, ...]:
    """Input magnitudes: unit, small, large, and (where the dtype holds it) beyond float16's
    range, as the outlier activations of large models are: a kernel that passes bf16 or
    fp32 data through float16 overflows there."""
    return (1.0, 0.01, 100.0) + (() if dtype == "float16" else (1e5,))


def max_position_for(head_dim: int) -> int:
    return int(min(MAX_POSITION, POSITION_BUDGET // max(head_dim, 1)))


def partial_head_dims(rotary_dim: int) -> tuple[int, ...]:
    """Head sizes models pair with a partial rotary dimension r: r itself, 2r (ChatGLM),
    4r (GPT-NeoX, GPT-J) and r + 48 (Phi-2's 32 of 80; not a power of two). An odd head
    size is exotic: the layouts probe tries r + 1."""
    return tuple(dict.fromkeys((rotary_dim, rotary_dim + 48, 2 * rotary_dim, 4 * rotary_dim)))


def head_dim_choices(rotary_dim: int | None = None, sizes: Sizes = TOY) -> tuple[int, ...]:
    """The sizes' head sizes when the whole head rotates; with a partial rotary dimension
    r, ``partial_head_dims(r)``; one model's (``Sizes.one_model``): the common one of them."""
    dims = sizes.head_dims if rotary_dim is None else partial_head_dims(rotary_dim)
    return (common_head_dim(dims),) if sizes.model else tuple(dims)


def shape_head_dim(shape: Shape, rotary_dim: int | None = None, sizes: Sizes = TOY) -> int:
    """The head size of a pool's shape at these sizes (with a partial rotary dimension r,
    among the head sizes models pair with r)."""
    return pool_head_dim(shape.head, sizes.head_dims if rotary_dim is None else partial_head_dims(rotary_dim))


def heads_relation(heads: int, k_heads: int) -> str:
    """How a (q, k) input's heads relate: k=None, one head each, one key head for several
    query heads (MQA), as many (MHA), or grouped (GQA)."""
    if not k_heads:
        return "none"
    if heads == 1:
        return "single"
    return "one" if k_heads == 1 else "all" if k_heads == heads else "grouped"


def head_dims(rotary_dim: int | None = None, sizes: Sizes = TOY) -> st.SearchStrategy[int]:
    return st.sampled_from(head_dim_choices(rotary_dim, sizes))


def model_qk_heads(sizes: Sizes) -> tuple[int, int]:
    """One model's (q heads, k heads): grouped-query attention, two query heads per key
    head at the toy sizes, Llama's 32 per 8 at sizes with q/k ratios. One model's q and k
    come in tensors of their own, as its projections make them."""
    return (32, 8) if sizes.ratios else (4, 2)


# Strategies are immutable: the ones built from draw-dependent arguments are cached, so a
# draw reuses them instead of building (and validating) new strategy objects each time,
# which was a third of a run's time. The same strategies, so the same draws.


@lru_cache(maxsize=None)
def offsets(limit: int) -> st.SearchStrategy[int]:
    """A starting position: small, cache-sized, at a boundary, or anywhere up to limit."""
    return st.one_of(
        st.integers(0, min(16, limit)),
        st.integers(0, min(4096, limit)),
        st.sampled_from([b for b in BOUNDARIES if b <= limit] or [0]),
        st.integers(0, limit),
    )


@lru_cache(maxsize=None)
def _lists(element: st.SearchStrategy, size: int) -> st.SearchStrategy[list]:
    return st.lists(element, min_size=size, max_size=size)


@lru_cache(maxsize=None)
def _scattered(limit: int) -> st.SearchStrategy[int]:
    return st.one_of(offsets(limit), st.integers(0, limit))


# Tokens whose scattered positions hypothesis draws one by one; past this, a drawn seed
# spreads them (hypothesis' choice budget holds a few thousand draws).
DRAWN_TOKENS = 256


def scattered_positions(draw, batch: int, seq: int, limit: int) -> np.ndarray:
    """(batch, seq) positions in no order, each in [0, limit]: drawn one by one for a short
    input, spread from a drawn seed past DRAWN_TOKENS of them (``draw``: hypothesis')."""
    if batch * seq > DRAWN_TOKENS:
        return _spread_positions(draw(st.integers(0, 2**32 - 1)), batch, seq, limit)
    values = draw(_lists(_scattered(limit), batch * seq))
    return np.asarray(values, dtype=np.int64).reshape(batch, seq)


@st.composite
def _position_grids(draw, batch: int, seq: int, limit: int, row_offsets: bool = False) -> np.ndarray:
    kind = draw(st.sampled_from(("row-offsets", "shared-offset") + (() if row_offsets else ("scattered",))))
    if kind == "scattered" or limit < seq - 1:
        return scattered_positions(draw, batch, seq, limit)
    top = limit - (seq - 1)
    if kind == "shared-offset":
        starts = [draw(offsets(top))] * batch
    else:
        starts = draw(_lists(offsets(top), batch))
    return np.asarray(starts, dtype=np.int64)[:, None] + np.arange(seq, dtype=np.int64)


def _spread_positions(seed: int, batch: int, seq: int, limit: int) -> np.ndarray:
    """Scattered positions of a long input: the boundaries up to ``limit`` first (2^k +- 1,
    the int16 / float16 limits), then uniform in [0, limit] and small ones."""
    rng = np.random.default_rng(seed)
    size = batch * seq
    marked = np.asarray([b for b in BOUNDARIES if b <= limit] or [0], dtype=np.int64)
    values = np.where(
        rng.random(size) < 0.5, rng.integers(0, limit + 1, size), rng.integers(0, min(limit, 4096) + 1, size)
    )
    values[: min(size, marked.size)] = marked[:size]
    return values.reshape(batch, seq)


@lru_cache(maxsize=None)
def position_grids(
    batch: int, seq: int, limit: int = MAX_POSITION, row_offsets: bool = False
) -> st.SearchStrategy[np.ndarray]:
    """(batch, seq) int64 positions, every value in [0, limit]; ``row_offsets``: offset +
    arange(seq) in every row."""
    return _position_grids(batch, seq, limit, row_offsets)


# Sequence lengths of production inputs besides the drawn ones: around the powers of two
# where a kernel's block size changes, and the context lengths models are served at.
LONG_SEQS = (127, 128, 129, 1000, 2048, 4095, 4096, 8191, 8192)


# The checks that compare attention scores hold (batch, heads, seq, seq) arrays: at
# production sizes their sequences stop here (the per-element checks take the longest).
SCORES_MAX_SEQ = 128


@lru_cache(maxsize=None)
def seq_lengths(short: st.SearchStrategy, min_seq: int, max_seq: int) -> st.SearchStrategy[int]:
    """A family's sequence lengths at sizes whose longest is ``max_seq``: its own ``short``
    ones at the toy sizes' (24); else short ones, the LONG_SEQS that fit, and any."""
    if max_seq == TOY.max_seq:
        return short
    top = max(min_seq, max_seq)
    long = [n for n in LONG_SEQS if min_seq <= n <= top]
    return st.one_of(
        st.integers(min_seq, max(min_seq, min(8, top))),
        st.integers(min_seq, top),
        *([st.sampled_from(long)] if long else []),
    )


@lru_cache(maxsize=None)
def sequence_lengths(min_seq: int, max_seq: int = 24) -> st.SearchStrategy[int]:
    short = st.one_of(st.integers(min_seq, 8), st.integers(min_seq, 24), st.just(max(min_seq, 1)))
    return seq_lengths(short, min_seq, max_seq)


@lru_cache(maxsize=None)
def _heads(counts: tuple) -> st.SearchStrategy[int]:
    """x's heads: a run 1 .. n is drawn as an integer (it shrinks to 1), others sampled."""
    if counts == tuple(range(1, len(counts) + 1)):
        return st.integers(1, len(counts))
    return st.sampled_from(counts)


def head_counts(sizes: Sizes, short: st.SearchStrategy) -> st.SearchStrategy[int]:
    """A family's head counts: its own ``short`` ones at the toy sizes' heads, else the sizes'."""
    return short if sizes.heads == TOY.heads else _heads(sizes.heads)


def small_offsets(draw, count: int, spread: int) -> np.ndarray:
    """``count`` integers in [0, spread]: drawn one by one for a short input, from a drawn
    seed past DRAWN_TOKENS of them (hypothesis' choice budget)."""
    if count > DRAWN_TOKENS:
        return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, spread + 1, count)
    return np.asarray(draw(st.lists(st.integers(0, spread), min_size=count, max_size=count)), dtype=np.int64)


def fitted_seq(seq: int, min_seq: int, elements_per_token: int, sizes: Sizes) -> int:
    """A drawn sequence cut so that the input holds at most the sizes' ``max_elements``."""
    return max(min_seq, 1, min(seq, sizes.max_elements // max(elements_per_token, 1)))


def cut_lengths(lengths, min_seq: int, elements_per_token: int, sizes: Sizes) -> list:
    """Packed sequence lengths cut (the last ones first) to the sizes' element budget."""
    out, left = [], fitted_seq(sum(lengths), min_seq, elements_per_token, sizes)
    for n in lengths:
        out.append(min(n, left))
        left -= out[-1]
    return out


@st.composite
def _cases(
    draw,
    dtype,
    rotary_dim,
    min_batch,
    min_seq,
    max_position,
    memory,
    positions,
    call="x",
    k_optional=False,
    row_offsets=False,
    sizes=TOY,
    max_seq=None,
    choices=(),
    k_layouts=(),
) -> Case:
    longest = min(sizes.max_seq, max_seq or sizes.max_seq)
    if call == "packed":
        return draw(_packed_cases(dtype, rotary_dim, min_seq, max_position, memory, positions, sizes, longest))
    pool = tuple(s for s in pool_shapes(sizes) if s.batch >= min_batch) or pool_shapes(sizes)
    shape = draw(st.sampled_from(pool)) if pool else None
    batch = max(shape.batch, min_batch) if shape else draw(st.integers(min_batch, max(min_batch, 3)))
    seq = draw(sequence_lengths(min_seq, longest))
    if shape is not None:
        heads, kv = (shape.heads, 0) if call == "x" else (shape.q_heads, shape.k_heads)
        if call == "qk" and k_optional:
            kv = draw(st.sampled_from((kv, 0)))
    elif call == "x":
        heads, kv = draw(_heads(sizes.heads)), 0
    elif sizes.model:
        heads, kv = model_qk_heads(sizes)
    elif sizes.ratios:
        heads, kv = draw(grouped_heads(sizes.ratios, k_optional))
    else:  # k's heads drawn last (below), as runs before production sizes drew them
        heads, kv = draw(st.sampled_from(Q_HEADS)), None
    head_dim = shape_head_dim(shape, rotary_dim, sizes) if shape else draw(head_dims(rotary_dim, sizes))
    seq = fitted_seq(seq, min_seq, batch * (heads + (heads if kv is None else kv)) * head_dim, sizes)
    limit = min(max_position, max_position_for(head_dim))
    grid = draw(position_grids(batch, seq, limit, row_offsets)) if positions else np.zeros((batch, seq), dtype=np.int64)
    case = Case(
        dtype=dtype,
        batch=batch,
        seq=seq,
        heads=heads,
        head_dim=head_dim,
        positions=tuple(map(tuple, grid.tolist())),
        memory=_layout(draw, memory, sizes),
        scale=draw(st.sampled_from(scales(dtype))),
        seed=draw(st.integers(0, 2**16)),
    )
    if call == "qk":
        kv = draw(k_heads(heads, k_optional)) if kv is None else kv
        case = replace(case, call="qk", k_heads=kv, separate=sizes.model or draw(st.booleans()))
    # an interface's argument classes, and k's own layout (drawn only for interfaces that
    # have them: every other target's inputs are drawn as before)
    if choices:
        case = replace(case, choices=tuple((factor, draw(st.sampled_from(names))) for factor, names in choices))
    if k_layouts and case.call == "qk" and case.separate and case.k_heads:
        case = replace(case, k_memory=_layout(draw, k_layouts, sizes))
    return case


def _layout(draw, layouts: tuple, sizes: Sizes) -> str:
    """A drawn memory layout; one model's (``Sizes.one_model``): the first of them."""
    return layouts[0] if sizes.model else draw(st.sampled_from(layouts))


# q heads of a (q, k) call: with k's, few enough to keep the checks' calls small
Q_HEADS = (1, 2, 4, 6)


@lru_cache(maxsize=None)
def k_heads(q_heads: int, k_optional: bool) -> st.SearchStrategy[int]:
    """k's heads for q_heads query heads: one (MQA) half the time, else any divisor (GQA,
    MHA), or none (k=None) where the target accepts it."""
    divisors = tuple(d for d in range(1, q_heads + 1) if q_heads % d == 0)
    return st.one_of(st.just(1), st.sampled_from(divisors + ((0,) if k_optional else ())))


# k heads of a production (q, k) call; q has ratio x as many, 64 at most
GROUPED_K_HEADS = (1, 2, 8)


@lru_cache(maxsize=None)
def grouped_heads(ratios: tuple, k_optional: bool) -> st.SearchStrategy[tuple]:
    """(q heads, k heads) of a production (q, k) call: q/k ratio from ``ratios`` (1: MHA,
    4 and 8: GQA as Llama's, 32: one key head for 32 query heads), k_heads 0 (k=None)
    where the target accepts it."""

    def pair(ratio_and_k):
        ratio, k = ratio_and_k
        k = min(k, max(1, 64 // ratio))
        return ratio * k, k

    drawn = st.tuples(st.sampled_from(ratios), st.sampled_from(GROUPED_K_HEADS)).map(pair)
    if k_optional:
        drawn = st.one_of(drawn, st.sampled_from((1, 8, 32)).map(lambda q: (q, 0)))
    return drawn


PACKED_MEMORY = ("contiguous", "qkv-slice", "strided-heads", "padded", "padded-64")


def packed_layouts(memory) -> tuple:
    """The layouts of ``memory`` a packed (total, heads, head_dim) input can be drawn in."""
    return tuple(m for m in memory if m in PACKED_MEMORY) or ("contiguous",)


@lru_cache(maxsize=None)
def packed_lengths(min_total: int, max_seq: int = 24) -> st.SearchStrategy[list]:
    """Sequence lengths of a packed batch: one to four sequences of different lengths,
    empty ones among them (with longer ``max_seq``: long ones too)."""
    length = st.one_of(st.just(0), st.integers(1, 8), st.integers(1, 24))
    if max_seq > TOY.max_seq:
        length = st.one_of(length, st.integers(1, max_seq))
    return st.lists(length, min_size=1, max_size=4).filter(lambda ls: sum(ls) >= max(min_total, 1))


@st.composite
def _packed_cases(draw, dtype, rotary_dim, min_seq, max_position, memory, positions, sizes=TOY, max_seq=24) -> Case:
    pool = pool_shapes(sizes)
    shape = draw(st.sampled_from(pool)) if pool else None
    head_dim = shape_head_dim(shape, rotary_dim, sizes) if shape else draw(head_dims(rotary_dim, sizes))
    limit = min(max_position, max_position_for(head_dim))
    if positions:
        lengths = draw(packed_lengths(min_seq, max_seq))
        if draw(st.booleans()):  # serving: each sequence at its own offset (its cache length)
            starts = [draw(offsets(max(limit - n, 0))) for n in lengths]
        else:  # training: every sequence from a shared offset, 0 mostly
            starts = [draw(st.sampled_from((0, 0, min(7, max(limit - max(lengths), 0)))))] * len(lengths)
    else:  # every position 0: sequences of one token (and empty ones)
        lengths = [min(n, 1) for n in draw(packed_lengths(1))]
        lengths += [1] * max(min_seq - sum(lengths), 0)
        starts = [0] * len(lengths)
    heads = shape.heads if shape else draw(_heads(sizes.heads))
    lengths = cut_lengths(lengths, min_seq, heads * head_dim, sizes)
    row = np.concatenate([o + np.arange(n, dtype=np.int64) for o, n in zip(starts, lengths)])
    usable = packed_layouts(memory)
    return Case(
        dtype=dtype,
        batch=1,
        seq=int(row.size),
        heads=heads,
        head_dim=head_dim,
        positions=(tuple(row.tolist()),),
        memory=_layout(draw, usable, sizes),
        scale=draw(st.sampled_from(scales(dtype))),
        seed=draw(st.integers(0, 2**16)),
        call="packed",
        lengths=tuple(lengths),
    )


@lru_cache(maxsize=None)
def cases(
    dtype: str,
    rotary_dim: int | None = None,
    *,
    min_batch: int = 1,
    min_seq: int = 1,
    max_position: int = MAX_POSITION,
    memory=MEMORY_LAYOUTS,
    positions=True,
    call: str = "x",
    k_optional: bool = False,
    row_offsets: bool = False,
    sizes: Sizes = TOY,
    max_seq: int | None = None,
    choices: tuple = (),
    k_layouts: tuple = (),
) -> st.SearchStrategy[Case]:
    """RoPE inputs (Case records) in ``dtype``, in the target's call form, at ``sizes``
    (``max_seq``: a property's own cap on the sequence); ``row_offsets``: positions offset
    + arange(seq) in every row; ``choices``: ((factor, its classes), ...) of an interface's
    argument space, one class of each drawn per input; ``k_layouts``: the layouts k is
    drawn in when q and k are separate tensors."""
    return _cases(
        dtype,
        rotary_dim,
        min_batch,
        min_seq,
        max_position,
        tuple(memory),
        positions,
        call,
        k_optional,
        row_offsets,
        sizes,
        max_seq,
        tuple(choices),
        tuple(k_layouts),
    )


@lru_cache(maxsize=None)
def prime_step(cap: int, limit: int) -> int:
    """A position step: ``cap``, or the largest prime <= limit when that is smaller (a
    prime step does not land on the period of a table or a frequency)."""
    import sympy

    return min(cap, int(sympy.prevprime(limit + 1)))


def grad_layouts(ctx, case):
    """A backward property's extras: the incoming gradient's layout, dense in one of the
    layouts autograd produces or broadcast (stride 0) from a reduction."""
    return st.fixed_dictionaries({"grad_layout": st.sampled_from(GRAD_LAYOUTS)})


def example_grad_layout(ctx, case) -> dict:
    """The gradient layout of a fixed input (one per seed, so the fixed inputs vary it)."""
    return {"grad_layout": GRAD_LAYOUTS[case.seed % len(GRAD_LAYOUTS)]}
