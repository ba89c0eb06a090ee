"""Size switches: production kernels change code path with size (a fused path above a
token x head count, a grid dimension past 65535, int32 offsets), and a bug on the other
side of a switch passes every small input. Every run of the reference property tries, in
each call form the target takes, inputs that cross the usual switch points (``inputs``):

- token x head counts from 2^13 to 2^17, 10240 among them (vLLM's fused QK-norm + RoPE
  kernel changes its heads per warp there, vllm #51049): one sequence (one packed batch of
  four) of T tokens over ``HEADS`` heads (q and k together: 6 and 2), the smallest head
  size of the run with features past a partial rotary dimension;
- a sequence past 65535 tokens, where the target's position range holds it (a grid's y
  and z dimensions stop at 65535);
- at production sizes, more than 65535 sequences: a decode batch of 65537 rows of one
  token, or 65537 one-token packed sequences (a kernel that loops over sequences in
  Python takes seconds on them, too long for every run).

A failure there is searched down to its boundary (``boundary``): the smallest failing
token count and the largest passing one beside it (bisection between the largest size
that passed and the one that failed). It is a size switch when tokens that were right
one token below are wrong at the boundary; the failure then says so ("fails from 1280
tokens x 8 heads (10240 token-heads), passes at 1279") and its counterexample is the
boundary input, instead of a minimal one hypothesis cannot find below the switch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Optional

import numpy as np

from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.core.contract import CallError
from ropecheck.properties.inputs.cases import Case
from ropecheck.properties.inputs.strategies import partial_head_dims

# token x head counts an input crosses (the switch points of production kernels); those up to
# ALWAYS are tried in every run whatever the time budget (10240, the best known, among them),
# unless one call is predicted to take over an eighth of a call's time limit (the runner decides)
TOKEN_HEADS = (2**13, 10240, 2**14, 2**15 + 1, 2**16, 2**17 + 8)
ALWAYS = 2**14
HEADS = 8  # heads of a token x head input: q 6 and k 2 in the (q, k) form
GRID_LIMIT = 65535  # a CUDA grid's y and z dimensions
START = 100  # the first position of a sequence (not 0: a kernel that ignores it shows)
PACKED_SEQUENCES = 4  # a packed token x head input's sequences
# Tokens compared at each end and in the middle of a long input: the kernel rotates them all,
# the float64 reference checks these (a path taken past a switch is wrong on every token, an
# index that overflows at the end)
WINDOW = 256


def windows(seq: int) -> tuple:
    """The sequence's first, middle and last WINDOW tokens, as (start, stop) pairs."""
    middle = seq // 2 - WINDOW // 2
    return ((0, WINDOW), (middle, middle + WINDOW), (seq - WINDOW, seq))


@dataclass(frozen=True)
class SizeInput:
    """One input that crosses a switch point: the case, what it crosses (words), and how
    an input of the same kind with ``count`` tokens (or sequences: ``unit``) is made (the
    boundary search). ``kind``: the inputs of one kind grow one after the other (the
    token x head counts), so the largest that passed bounds the search of the next."""

    case: Case
    crosses: str
    make: Callable[[int], Case]
    count: int
    heads: int
    kind: str
    unit: str = "tokens"
    rows: int = 1  # batch rows of count tokens each

    @property
    def elements(self) -> int:
        return int(np.prod(self.case.shape))

    @property
    def always(self) -> bool:
        """Tried in every run, whatever the time budget (the token x head counts up to ALWAYS;
        the runner still leaves out one a call of which would take an eighth of a call's time limit)."""
        return (
            self.unit == "tokens"
            and self.kind.endswith("token-heads")
            and self.rows * self.count * self.heads <= ALWAYS
        )

    def extras(self, case: Case) -> dict:
        """The check's keywords for ``case``: the windows of its sequence compared."""
        return {"windows": windows(case.seq)} if case.seq > 3 * WINDOW else {}

    def describe(self, count: int) -> str:
        if self.unit != "tokens":
            return f"{count} {self.unit}"
        rows = f"{self.rows} rows of " if self.rows > 1 else ""
        return f"{rows}{count} tokens x {self.heads} heads ({self.rows * count * self.heads} token-heads)"


def _head_dim(rotary_dim: Optional[int]) -> int:
    """The smallest head size the run draws, past a partial rotary dimension if one is declared."""
    if rotary_dim is None:
        return 8
    return min(d for d in partial_head_dims(rotary_dim) if d > rotary_dim)


def _heads(call: str, total: int, k_heads: Optional[int] = None) -> dict:
    """x's heads, and k's in the (q, k) form: ``total`` together, ``k_heads`` of them k's
    (a quarter by default)."""
    if call == "qk":
        k = k_heads or max(1, total // 4)
        return {"heads": total - k, "k_heads": k, "call": "qk", "separate": True}
    return {"heads": total, "call": call}


def _sequences(dtype, call, tokens, heads, head_dim, seed, sequences=PACKED_SEQUENCES, k_heads=None) -> Case:
    """One sequence of ``tokens`` tokens counting up from START (packed: ``sequences`` of
    them, each from a start of its own)."""
    if call == "packed":
        lengths = _split(tokens, sequences)
        flat = np.concatenate([START + 1000 * i + np.arange(n) for i, n in enumerate(lengths)])
        positions = (tuple(flat.tolist()),)
        return Case(
            dtype,
            1,
            tokens,
            head_dim=head_dim,
            positions=positions,
            seed=seed,
            lengths=tuple(lengths),
            **_heads(call, heads, k_heads),
        )
    row = tuple(range(START, START + tokens))
    return Case(dtype, 1, tokens, head_dim=head_dim, positions=(row,), seed=seed, **_heads(call, heads, k_heads))


def _split(total: int, parts: int) -> list:
    base = [total // parts] * parts
    for i in range(total - sum(base)):
        base[i] += 1
    return [n for n in base if n] or [0]


def _decode(dtype, call, rows, heads, head_dim, limit, seed) -> Case:
    """``rows`` sequences of one token each, at positions of their own."""
    positions = ((START + 7 * np.arange(rows)) % (limit + 1)).tolist()
    if call == "packed":
        return Case(
            dtype,
            1,
            rows,
            head_dim=head_dim,
            positions=(tuple(positions),),
            seed=seed,
            lengths=(1,) * rows,
            **_heads(call, heads),
        )
    grid = tuple((p,) for p in positions)
    return Case(dtype, rows, 1, head_dim=head_dim, positions=grid, seed=seed, **_heads(call, heads))


def inputs(
    dtype: str,
    rotary_dim: Optional[int],
    calls: tuple,
    max_position: int,
    grid: bool = False,
    model: Optional[tuple] = None,
) -> list:
    """The inputs that cross the switch points in each of ``calls`` (the call forms the
    target takes), within ``max_position``, smallest first; ``grid``: also more sequences
    than a grid dimension holds (a production run's: a kernel that loops over sequences
    takes seconds on them); ``model``: (q heads, k heads, head size) of one model's run
    (``Sizes.one_model``: a compiled model is handed its own), only the tokens changing."""
    q_heads, k_heads, head_dim = model or (HEADS - 2, 2, _head_dim(rotary_dim))
    out = []
    for call in calls:
        heads = q_heads + k_heads if call == "qk" or not model else q_heads
        few = heads if model else 2 if call == "qk" else 1  # the heads of the long input
        for i, count in enumerate(TOKEN_HEADS):
            tokens = -(-count // heads)
            if START + 1000 * PACKED_SEQUENCES + tokens <= max_position:
                make = partial(_sequences, dtype, call, heads=heads, head_dim=head_dim, seed=60 + i, k_heads=k_heads)
                out.append(SizeInput(make(tokens), f"{count} token-heads", make, tokens, heads, f"{call} token-heads"))
        rows = GRID_LIMIT + 2
        if START + rows <= max_position:
            make = partial(
                _sequences,
                dtype,
                call,
                heads=few,
                head_dim=head_dim,
                seed=71,
                sequences=1,
                k_heads=k_heads if model else 1,
            )
            out.append(SizeInput(make(rows), f"a sequence of {rows} tokens", make, rows, few, f"{call} sequence"))
        if grid:
            make = partial(_decode, dtype, call, heads=few, head_dim=head_dim, limit=max_position, seed=70)
            crosses = f"{rows} sequences (a grid dimension past {GRID_LIMIT})"
            out.append(SizeInput(make(rows), crosses, make, rows, few, f"{call} sequences", "sequences of one token"))
    return sorted(out, key=lambda size: size.elements)


def untried(max_position: int) -> str:
    """The switch points ``inputs`` leaves out for the position range ("" none)."""
    if START + GRID_LIMIT + 2 <= max_position:
        return ""
    return (
        f"size switches: a sequence past {GRID_LIMIT} tokens not tried: its positions would pass the "
        f"target's range (0 .. {max_position}; --max-position {2 * (GRID_LIMIT + 1) - 1} tries it)"
    )


# Token x head counts from which a failing input is searched for a switch (below, a failure
# is a small input's: hypothesis shrinks it)
SEARCHED = 2**12


def _cut(case: Case, tokens: int) -> Case:
    """``case`` with its first ``tokens`` tokens in each row (packed: in all, the last
    sequences cut first)."""
    if case.call == "packed":
        lengths, left = [], tokens
        for n in case.lengths:
            lengths.append(min(n, left))
            left -= lengths[-1]
        return replace(case, seq=tokens, positions=(case.positions[0][:tokens],), lengths=tuple(lengths))
    return replace(case, seq=tokens, positions=tuple(row[:tokens] for row in case.positions))


def from_case(case: Case) -> Optional[SizeInput]:
    """A failing input as the largest of its kind (fewer tokens, the rest kept), for the
    boundary search; None where it is too small to have crossed a switch."""
    heads = case.heads + case.k_heads
    if case.batch * case.seq * heads < SEARCHED or case.n_axes > 1:
        return None
    crosses = f"{case.batch * case.seq * heads} token-heads"
    return SizeInput(case, crosses, partial(_cut, case), case.seq, heads, "failed", rows=case.batch)


def _fails(check, case: Case, extras: dict) -> Optional[BaseException]:
    try:
        check(case, **extras)
    except (CheckFailure, CallError) as failure:
        return failure
    return None


@dataclass(frozen=True)
class Boundary:
    """Where a size-triggered failure starts: the smallest failing input and its failure,
    and the sentence that names the switch."""

    case: Case
    failure: BaseException
    sentence: str


def boundary(size: SizeInput, check, passed: int) -> Optional[Boundary]:
    """The smallest token count of ``size``'s kind that fails ``check`` (a function of a
    case that raises its failure), bisected between ``passed`` tokens (passed, or 0) and
    ``size.count`` (failed); a Boundary when it is a size switch: at it, a token that was
    right one token below is wrong (the failure's worst element is not the one added).
    None where the search finds no switch (a single bad token, or it fails from one token)."""
    low, high = max(passed, 0), size.count
    failure = _fails(check, size.make(high), size.extras(size.make(high)))
    if failure is None:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        case = size.make(middle)
        found = _fails(check, case, size.extras(case))
        if found is None:
            low = middle
        else:
            high, failure = middle, found
    if low < 1:
        return None
    worst = getattr(failure, "where", {})
    token = worst.get("seq") if size.case.batch == 1 else worst.get("batch")
    if token is not None and token >= high - 1:
        return None  # only the token added at the boundary is wrong: not a switch of the whole
    below = f"{low} ({size.rows * low * size.heads} token-heads)" if size.unit == "tokens" else str(low)
    sentence = f"size switch: fails from {size.describe(high)}, passes at {below}"
    return Boundary(size.make(high), failure, sentence)
