"""The position range a target accepts, probed before the properties run.

A target with a fixed cos/sin table (the max_position_embeddings pattern) raises past its
end. Left to the properties, that one cause fails every one of them; probed first, it is
one finding, "raises for positions >= P", and the properties then run on the positions
the target accepts, so they still judge its values.

The probe calls the target on one token at positions 0, 1, 2, 3, 2^k, 3 * 2^(k-1) and the
declared maximum N. When every call below some probed position is accepted and every
call from it on raises, a bisection finds the smallest raising position P. A target that
raises at 0, accepts a larger position again after raising, or crashes, has no range
limit in this sense: the properties report what it does.
"""

from __future__ import annotations

from typing import Callable, Optional

from ropecheck.properties.accuracy import sweep_positions
from ropecheck.properties.core.contract import CallError

FORMULA = "f(x, m) is defined for every position 0 <= m <= N, the declared --max-position (default 2^24)"


def find_limit(call: Callable[[int], None], limit: int) -> Optional[tuple[int, str]]:
    """(P, why) when ``call(m)`` raises for every probed m >= P and none below (P <= limit),
    else None. ``call`` raises CallError; only refusals ("raised") count."""
    said: dict[int, Optional[str]] = {}

    def refused(m: int) -> Optional[str]:
        if m not in said:
            try:
                call(m)
                said[m] = None
            except CallError as exc:
                if exc.kind == "crashed":
                    raise
                said[m] = str(exc) if exc.kind == "raised" else None
        return said[m]

    points = sorted(set(sweep_positions(limit).tolist()) | {limit})
    try:
        first = next((m for m in points if refused(m)), None)
        if not first or any(refused(m) is None for m in points if m > first):
            return None
        low, high = max(m for m in points if m < first), first
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if refused(middle) else (middle, high)
    except CallError:  # a crash is not a range limit
        return None
    return high, said[high] or ""


def finding(limit_at: int, why: str, least: int = 0) -> str:
    """What a target that raises from position ``limit_at`` on is told; ``least``: the
    smallest --max-position a target may declare (below it, no table size explains it)."""
    said = why.removeprefix("the target raised ")
    if limit_at - 1 < least:
        return (
            f"position range: raises for positions >= {limit_at} ({said}): fewer than the {least + 1} "
            f"positions any table holds, so every property runs over the whole range"
        )
    return (
        f"position range: raises for positions >= {limit_at} ({said}); if {limit_at} is "
        f"the table size it was built for, declare --max-position {limit_at - 1}"
    )
