"""The inputs of a target called through a library interface, drawn from its argument
space (``space.Space``): one covering-array strategy for every preset.

Each row of the space's plan names one class per factor; a class says what the input of a
call in it must be (``ValueClass.realize``, the keys of ``REALIZED``), and the rest is drawn
freely: the head size, the heads, the sequence lengths, the positions within the class's
pattern, the values. ``row_cases`` draws a row, then an input in it (hypothesis shrinks
both); ``plan_cases`` makes one fixed input per row, so that every pair of classes that can
go together is called in every run, whatever the draws. ``observe`` says which class of
each factor a call really had, from its tensors and the values its arguments were given
(the coverage a run reports counts those, not the plan).

The factor constructors here (``tokens``, ``layouts``, ``keys``, ``key_layouts``,
``choice``) are the vocabulary the presets declare their spaces with.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Optional

import numpy as np
from hypothesis import strategies as st

from ropecheck.properties.core.sizes import TOY, Sizes, pool_shapes
from ropecheck.properties.inputs.cases import MEMORY_LAYOUTS, Case
from ropecheck.properties.inputs.strategies import (
    BOUNDARIES,
    PACKED_MEMORY,
    fitted_seq,
    head_dim_choices,
    heads_relation,
    max_position_for,
    model_qk_heads,
    offsets,
    scales,
    scattered_positions,
    sequence_lengths,
    shape_head_dim,
)
from ropecheck.properties.interfaces.space import NOT_APPLICABLE, Factor, Rule, Space, both_ways, value_class

# What a class can require of an input (``ValueClass.realize``):
REALIZED = {
    "call": "the canonical call form: x (a batch), packed (sequences with cu_seqlens), qk",
    "batch": "one or several sequences (batch rows, or packed sequences)",
    "seq": "one or several tokens per sequence",
    "positions": "counting (each sequence up from its own start), scattered (tokens in no order), zero (every "
    "sequence from 0), shared (every sequence from one start > 0), distinct (each from a start of its own)",
    "rows": "same: every batch row at the same positions",
    "memory": "the memory layout of x (of q and k in one buffer)",
    "k": "k's heads: none (k None), one, grouped (1 < k < q), all (as many as q)",
    "k_memory": "k's own storage in this layout ('' : q's buffer)",
    "media": "an M-RoPE call's tokens: text (t = h = w), an image's patches, a video's (Qwen2-VL's positions)",
}

# --- the vocabulary of factors ---------------------------------------------------------


def tokens(source: str, scattered: bool = True, name: str = "tokens") -> Factor:
    """The token shape of a call: the classes every RoPE caller makes (decode with one token
    per sequence and a batch of them, a prefill, a batch of sequences; ``scattered``:
    tokens at positions in no order, for an interface that takes a position per token)."""
    classes: tuple = (
        value_class("one token", "one sequence of one token", batch="one", seq="one"),
        value_class(
            "decode", "several sequences of one token each, at positions of their own", batch="several", seq="one"
        ),
        value_class("prefill", "one sequence of several tokens", batch="one", seq="several"),
        value_class(
            "batch",
            "several sequences of several tokens (packed: of different lengths, an empty one)",
            batch="several",
            seq="several",
        ),
    )
    if scattered:
        classes += (
            value_class(
                "scattered",
                "tokens at positions in no order (a mixed prefill + decode batch)",
                seq="several",
                positions="scattered",
            ),
        )
    return Factor(name, classes, source, "the tokens of a call")


def layouts(name: str, names: tuple, source: str) -> Factor:
    """The memory layouts a tensor (q and k in one buffer) is handed in."""
    return Factor(name, tuple(value_class(m, m, memory=m) for m in names), source, "its memory layout")


KEYS = {
    "None": ("k is None (MLA, cross-attention, cross-layer KV sharing)", "none"),
    "one head": ("one key head for every query head (MQA)", "one"),
    "grouped": ("1 < key heads < query heads (GQA)", "grouped"),
    "as many as q": ("as many key heads as query heads (MHA)", "all"),
}


def keys(source: str, optional: bool) -> Factor:
    """The key: None (where the interface takes it), one head, grouped, as many as q."""
    names = tuple(KEYS) if optional else tuple(k for k in KEYS if k != "None")
    return Factor("key", tuple(value_class(n, KEYS[n][0], k=KEYS[n][1]) for n in names), source, "its heads")


def key_layouts(names: tuple, source: str, optional: bool) -> tuple:
    """(the factor, its rules): k in q's buffer (a fused projection split into views) or in
    a tensor of its own in one of ``names``; not applicable where the key is None."""
    classes: tuple = (value_class("q's buffer", "k a view of the same buffer as q (qkv split)", k_memory=""),)
    classes += tuple(value_class(m, f"k a tensor of its own, {m}", k_memory=m) for m in names)
    if optional:
        classes += (value_class(NOT_APPLICABLE, "no key"),)
    factor = Factor("key layout", classes, source, "k's storage")
    rules = both_ways("key", ("None",), "key layout", (NOT_APPLICABLE,), "k None has no layout") if optional else ()
    return factor, rules


MROPE_MEDIA = (
    "huggingface/transformers: src/transformers/models/qwen2_vl/modeling_qwen2_vl.py get_rope_index (text "
    "(n, n, n); an image's or a video's patches (t, h, w) on from the text before; the text after from their "
    "largest + 1); vllm-project/vllm: vllm/model_executor/layers/rotary_embedding/mrope.py (positions [3, "
    "num_tokens]; text-only batches: the three rows equal)"
)
MEDIA = ("text", "image", "video")


def media(source: str) -> Factor:
    """The tokens of an M-RoPE call: text only (its three position rows equal, 1-D RoPE),
    an image's patches between text (t fixed, h and w a grid), a video's (t per frame)."""
    return Factor(
        "media",
        (
            value_class("text", "text tokens only: t = h = w (the three rows equal)", media="text"),
            value_class("image", "an image's patches between text: t fixed, h and w its grid", media="image"),
            value_class("video", "a video's patches: t per frame, h and w its grid", media="video"),
        ),
        source,
        "the tokens' (t, h, w) positions",
    )


def media_rules(space: Space) -> tuple:
    """An image or a video has several patches: a call of one token per sequence is text."""
    if not space.has("tokens"):
        return ()
    several = tuple(c.name for c in space.factor("tokens").classes if c.settings.get("seq") == "several")
    return (Rule("media", ("image", "video"), "tokens", several, "an image or a video has several patches"),)


def media_of(axes: np.ndarray) -> str:
    """The media class of a call's (b, s, 3) M-RoPE positions: text where every token's
    axes agree, else a video where some non-text token's t differs from another's in its
    row, else an image."""
    p = np.asarray(axes)
    patch = ~(p == p[..., :1]).all(-1)  # tokens whose axes differ
    if not patch.any():
        return "text"
    for row, marks in zip(p, patch):
        t = row[marks, 0]
        if t.size and (t != t[0]).any():
            return "video"
    return "image"


def choice(name: str, classes, source: str, what: str = "") -> Factor:
    """A factor whose classes are values the call passes (a format, a dtype, a flag): each
    class a (name, what it is) pair or a name."""
    made = tuple(value_class(*c) if isinstance(c, tuple) else value_class(c) for c in classes)
    return Factor(name, made, source, what)


def packed_rules(call_factor: str, packed: tuple, layout_factor: str, tokens_factor: str) -> tuple:
    """Rules: a packed call's (total, heads, head_dim) tensor comes only in the layouts a
    packed batch has, and its tokens are never scattered (each sequence counts up)."""
    return (
        Rule(call_factor, packed, layout_factor, PACKED_MEMORY, "a packed batch is (total, heads, head_dim)"),
        Rule(
            call_factor,
            packed,
            tokens_factor,
            ("one token", "decode", "prefill", "batch"),
            "a packed sequence counts up from its offset",
        ),
    )


# --- the properties' spaces ------------------------------------------------------------


def settings(space: Space, row: dict) -> dict:
    """What the row's classes require of an input (their ``realize`` merged)."""
    out: dict = {}
    for f in space.factors:
        name = row.get(f.name)
        if name is not None and name in f.names:
            out.update(f.value(name).settings)
    return out


def property_space(space: Space, calls: tuple, options: dict) -> Space:
    """The space a property draws from: its classes cut to what the property takes (its
    call forms, ``min_batch``, ``min_seq``, ``positions`` False: every position 0,
    ``memory``); a factor none of whose classes fit is left whole."""
    for f in space.factors:
        kept = tuple(c.name for c in f.classes if _fits_property(c.settings, calls, options))
        if kept and len(kept) < len(f.classes):
            space = space.restricted(f.name, kept, "not drawn for this property")
    return space


def _fits_property(s: dict, calls: tuple, options: dict) -> bool:
    if "call" in s and s["call"] not in calls:
        return False
    if options.get("min_batch", 1) > 1 and s.get("batch") == "one":
        return False
    if options.get("min_seq", 1) > 1 and s.get("seq") == "one":
        return False
    if options.get("positions", True) is False and s.get("positions") in ("scattered", "shared", "distinct"):
        return False
    memory = options.get("memory")
    return not (memory is not None and "memory" in s and s["memory"] not in memory)


# --- drawing an input in a row ---------------------------------------------------------


class _Drawn:
    """Choices drawn by hypothesis (they shrink)."""

    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, max(lo, hi)))

    def sample(self, options):
        return self.draw(st.sampled_from(tuple(options)))

    def start(self, limit: int) -> int:
        return self.draw(offsets(max(limit, 0)))

    def scattered(self, count: int, limit: int) -> np.ndarray:
        return scattered_positions(self.draw, 1, count, limit).reshape(-1)

    def seq(self, min_seq: int, longest: int) -> int:
        return self.draw(sequence_lengths(min_seq, longest))


class _Fixed:
    """Choices made from a row's index: small inputs, the starts at the boundaries where a
    position held in a narrow type or a table's length goes wrong."""

    STARTS = (0, 4097, 1, 70001, 1000, 2**20 + 1, 255, 65504)

    def __init__(self, index: int):
        self.index = index
        self.rng = np.random.default_rng([41, index])

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, max(lo, hi) + 1))

    def sample(self, options):
        options = tuple(options)
        return options[int(self.rng.integers(len(options)))]

    def start(self, limit: int) -> int:
        return min(self.STARTS[(self.index + int(self.rng.integers(4))) % len(self.STARTS)], max(limit, 0))

    def scattered(self, count: int, limit: int) -> np.ndarray:
        marked = [b for b in BOUNDARIES if b <= limit] or [0]
        values = self.rng.integers(0, limit + 1, count)
        values[::2] = np.asarray(marked)[self.rng.integers(len(marked), size=values[::2].size)]
        return values.astype(np.int64)

    def seq(self, min_seq: int, longest: int) -> int:
        return self.integer(max(min_seq, 2), max(min(longest, 6), min_seq, 2))


Drawn, FixedChoices = _Drawn, _Fixed  # what another family's interface draws choose with


def _qk_heads(kind: Optional[str], pick, sizes: Sizes) -> tuple:
    """(q heads, k heads) for a key of ``kind`` (none, one, grouped, all)."""
    if sizes.model:
        q, k = model_qk_heads(sizes)
        return q, 0 if kind == "none" else k
    if sizes.ratios:  # production: q/k ratios of real models
        if kind == "none":
            return pick.sample((1, 8, 32)), 0
        if kind == "one":
            return pick.sample((8, 32)), 1
        if kind == "all":
            k = pick.sample((2, 8))
            return k, k
        ratio = pick.sample(tuple(r for r in sizes.ratios if r > 1) or (4,))
        k = pick.sample((2, 8))
        return ratio * min(k, max(1, 64 // ratio)), min(k, max(1, 64 // ratio))
    if kind == "none":
        return pick.sample((1, 2, 4)), 0
    if kind == "one":
        return pick.sample((1, 2, 4, 6)), 1
    if kind == "all":
        k = pick.sample((2, 4))
        return k, k
    q = pick.sample((4, 6))
    return q, pick.sample(tuple(d for d in range(2, q) if q % d == 0))


def _pool_shape(pool: tuple, pick, form: str, kind: str, several: bool):
    """A pooled run's shape (``Sizes.pool``) for an input of the row's classes: one whose
    heads relate as the row's key class says (one key head, grouped, all; any for none)
    and whose batch is several or one as the row says, as near as the pool has; None
    where the run is not pooled."""
    if not pool:
        return None

    def relates(shape) -> bool:  # one head each is both one key head and as many
        relation = heads_relation(shape.q_heads, shape.k_heads)
        return form != "qk" or kind in ("none", relation) or (relation == "single" and kind in ("one", "all"))

    related = [shape for shape in pool if relates(shape)] or list(pool)
    return pick.sample(tuple(shape for shape in related if (shape.batch > 1) == several) or tuple(related))


def _starts(count: int, limit: int, pattern: str, pick) -> list:
    """The first position of ``count`` sequences, each fitting ``limit``."""
    if pattern == "zero":
        return [0] * count
    if pattern == "shared":
        return [max(1, pick.start(limit)) if limit >= 1 else 0] * count
    starts = [pick.start(limit) for _ in range(count)]
    if pattern == "distinct" and count > 1 and len(set(starts)) == 1 and limit >= count:
        starts = [(starts[0] + i * max(1, limit // count)) % (limit + 1) for i in range(count)]
    return starts


def realize(
    space: Space,
    row: dict,
    pick,
    *,
    dtype: str,
    rotary_dim: Optional[int],
    call: str,
    sizes: Sizes = TOY,
    max_position: int,
    min_seq: int = 1,
    max_seq: Optional[int] = None,
    positions: bool = True,
    row_offsets: bool = False,
) -> Case:
    """An input in ``row`` (its classes' ``realize``), the rest chosen by ``pick``
    (``_Drawn`` or ``_Fixed``): in the call form the row says (else ``call``, the target's),
    within the sizes and the position range; every position 0 where ``positions`` is False
    (packed: sequences of one token). One model's sizes (``Sizes.one_model``) keep its
    heads and its first memory layout, as a compiled model is handed them."""
    s = settings(space, row)
    form = s.get("call", call)
    several = s.get("batch") == "several"
    shape = _pool_shape(pool_shapes(sizes), pick, form, s.get("k", "one"), several)
    head_dim = shape_head_dim(shape, rotary_dim, sizes) if shape else pick.sample(head_dim_choices(rotary_dim, sizes))
    limit = min(max_position, max_position_for(head_dim))
    longest = max(1, min(sizes.max_seq, max_seq or sizes.max_seq))
    tokens = s.get("seq") == "several" or min_seq > 1
    if shape is not None:
        heads, k_heads = (
            (shape.q_heads, 0 if s.get("k") == "none" else shape.k_heads) if form == "qk" else (shape.heads, 0)
        )
    elif form == "qk":
        heads, k_heads = _qk_heads(s.get("k", "one"), pick, sizes)
    else:
        heads, k_heads = pick.sample(sizes.heads), 0
    width = (heads + k_heads) * head_dim
    pattern = s.get("positions", "counting")
    if pattern == "scattered" and (row_offsets or form == "packed"):
        pattern = "counting"
    if form == "packed":
        lengths = _lengths(pick, several, tokens and positions, max(min_seq, 1), longest)
        lengths = _cut(lengths, fitted_seq(sum(lengths), max(min_seq, 1), width, sizes))
        starts = _starts(len(lengths), max(limit - max(lengths), 0), pattern if positions else "zero", pick)
        grid = np.concatenate([o + np.arange(n, dtype=np.int64) for o, n in zip(starts, lengths)])[None, :]
        allowed: tuple = PACKED_MEMORY
    else:
        lengths = []
        if shape is not None and (shape.batch > 1) == several:
            batch = shape.batch
        else:
            batch = pick.integer(2, 3) if several else 1
        seq = fitted_seq(pick.seq(max(2, min_seq), longest) if tokens else 1, min_seq, batch * width, sizes)
        if pattern == "scattered":
            grid = pick.scattered(batch * seq, limit).reshape(batch, seq)
        else:
            starts = _starts(batch, max(limit - (seq - 1), 0), pattern, pick)
            grid = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(seq, dtype=np.int64)
        if s.get("rows") == "same":
            grid = np.repeat(grid[:1], batch, axis=0)
        if not positions:
            grid = np.zeros_like(grid)
        allowed = MEMORY_LAYOUTS
    memory = allowed[0] if sizes.model else s.get("memory") or pick.sample(allowed)
    if form == "packed" and memory not in allowed:
        memory = allowed[0]
    case = Case(
        dtype=dtype,
        batch=grid.shape[0],
        seq=grid.shape[1],
        heads=heads,
        head_dim=head_dim,
        positions=tuple(map(tuple, grid.tolist())),
        memory=memory,
        scale=pick.sample(scales(dtype)),
        seed=pick.integer(0, 2**16),
        call=form,
        lengths=tuple(lengths),
        choices=tuple(row.items()),
    )
    if form == "qk":
        k_memory = "" if sizes.model else s.get("k_memory", "")
        case = replace(case, k_heads=k_heads, separate=bool(k_memory) or sizes.model, k_memory=k_memory * bool(k_heads))
    return case


def _lengths(pick, several: bool, tokens: bool, min_total: int, longest: int) -> list:
    """Packed sequence lengths: several sequences of different lengths with an empty one
    among them, several of one token, one of several tokens, or one token."""
    if several and tokens:
        lengths = [pick.seq(2, longest) for _ in range(pick.integer(2, 3))]
        if len(set(lengths)) == 1:
            lengths[-1] -= 1
        return [lengths[0], 0, *lengths[1:]]
    if several:
        return [1] * max(pick.integer(2, 4), min_total)
    if tokens:
        return [pick.seq(max(2, min_total), longest)]
    return [1] * min_total


def _cut(lengths: list, total: int) -> list:
    """Lengths cut to ``total`` tokens, the last sequences first."""
    out, left = [], total
    for n in lengths:
        out.append(min(n, left))
        left -= out[-1]
    return out


@lru_cache(maxsize=None)
def row_cases(
    space: Space,
    dtype: str,
    rotary_dim: Optional[int],
    call: str,
    sizes: Sizes = TOY,
    max_position: int = 2**24,
    min_seq: int = 1,
    max_seq: Optional[int] = None,
    positions: bool = True,
    row_offsets: bool = False,
) -> st.SearchStrategy[Case]:
    """A row of ``space``'s plan, then an input in it."""
    plan = space.plan

    @st.composite
    def drawn(draw) -> Case:
        row = plan[draw(st.integers(0, len(plan) - 1))]
        return realize(
            space,
            row,
            _Drawn(draw),
            dtype=dtype,
            rotary_dim=rotary_dim,
            call=call,
            sizes=sizes,
            max_position=max_position,
            min_seq=min_seq,
            max_seq=max_seq,
            positions=positions,
            row_offsets=row_offsets,
        )

    return drawn()


def plan_cases(space: Space, dtype: str, rotary_dim: Optional[int], call: str, **options) -> list:
    """One fixed input per row of ``space``'s plan (the same in every run)."""
    return [
        realize(space, row, _Fixed(index), dtype=dtype, rotary_dim=rotary_dim, call=call, **options)
        for index, row in enumerate(space.plan)
    ]


# --- what a call had -------------------------------------------------------------------


def _shape(call: str, positions: np.ndarray, lengths: tuple) -> dict:
    """What the classes of a call's tokens ask about: how many non-empty sequences, whether
    one has several tokens, whether each counts up, their first positions, whether every
    batch row is at the same positions."""
    p = np.asarray(positions, dtype=np.int64)
    if call == "packed" and lengths and sum(lengths) == p.size:
        flat = p.reshape(-1)
        sizes = np.asarray([n for n in lengths if n], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) if sizes.size else sizes
        steps = np.diff(flat) == 1
        steps[starts[1:] - 1] = True  # a sequence boundary is not a step
        first = flat[starts] if sizes.size else flat[:0]
        rows_same = True
    else:
        rows = p.reshape(p.shape[0], -1) if p.size else p.reshape(0, 0)
        sizes = np.full(rows.shape[0], rows.shape[1], dtype=np.int64) if rows.shape[1] else np.zeros(0, np.int64)
        steps = np.diff(rows, axis=1) == 1
        first = rows[:, 0] if rows.shape[1] else rows[:, :0].reshape(-1)
        rows_same = bool((rows == rows[:1]).all()) if rows.size else True
    return {
        "sequences": int(sizes.size),
        "long": bool((sizes > 1).any()),
        "counting": bool(steps.all()),
        "starts": first,
        "rows_same": rows_same,
    }


def _consistent(key: str, value: str, facts: dict) -> bool:
    shape = facts["shape"]
    if key == "call":
        return value == facts["call"]
    if key == "batch":
        return (shape["sequences"] > 1) == (value == "several")
    if key == "seq":
        return shape["long"] == (value == "several")
    if key == "positions":
        counting, starts = shape["counting"], shape["starts"]
        return {
            "counting": counting,
            "scattered": not counting,
            "zero": counting and not bool(starts.any()),
            "shared": counting and starts.size > 0 and bool((starts == starts[0]).all()) and int(starts[0]) > 0,
            "distinct": counting and (starts.size < 2 or not bool((starts == starts[0]).all())),
        }.get(value, True)
    if key == "rows":
        return value != "same" or shape["rows_same"]
    if key == "memory":
        return value == facts["memory"]
    if key == "k":
        hq, hk = facts["q_heads"], facts["k_heads"]
        return {"none": hk == 0, "one": hk == 1, "grouped": 1 < hk < hq, "all": hk == hq and hk > 0}[value]
    if key == "media":
        return facts.get("axes") is not None and media_of(facts["axes"]) == value
    if key == "k_memory":
        own = facts["k_memory"] or facts["memory"]
        return (value == "") == (not facts["separate"]) and (not value or value == own)
    return True


def observe(space: Space, facts: dict) -> dict:
    """factor -> the class of it a call had. ``facts``: its call form, positions ((batch,
    seq) array), packed lengths, q's and k's heads, memory layouts, whether k is a tensor of
    its own, the case's choices, and ``passed``: the classes the call path itself saw in the
    values it passed (an offset passed as an int or a tensor). A class whose requirements the
    call does not meet is not claimed: the case's choice where it fits, else the first that
    fits, else "?"."""
    facts = {**facts, "shape": _shape(facts["call"], facts["positions"], facts.get("lengths", ()))}
    chosen, passed = dict(facts.get("choices", ())), facts.get("passed", {})
    out = {}
    for f in space.factors:
        if f.name in passed:
            out[f.name] = passed[f.name]
            continue
        if facts["k_heads"] == 0 and NOT_APPLICABLE in f.names:
            out[f.name] = NOT_APPLICABLE
            continue
        fitting = [c.name for c in f.classes if all(_consistent(k, v, facts) for k, v in c.realize)]
        want = chosen.get(f.name)
        out[f.name] = want if want in fitting else (fitting[0] if fitting else "?")
    return out
