"""The ``opcheck`` row of a run (``--opcheck``): in each column (dtype x mode), what
``torch.library.opcheck`` said of the custom ops the column's checks' calls made.

It is a run-level row, like the position-range probe, and not a property: a property
judges values on the inputs it draws and stops at its first failure (shrinking it), while
a registration is judged on every input of every check (the checks' calls are what the
caller follows with opcheck: ``ropecheck.calling.opcheck``), and a broken one shows on many
of them. So the row is made after the column's checks, from their results' records: each
op and test that failed is one finding, with the first input that showed it (the op's
arguments, and the drawn call they came from), the number of distinct inputs it failed on
out of those it was checked on, and the reproduce line of the check that showed it first.
A column whose calls made no custom-op call is skipped with a note."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

from ropecheck.calling.opcheck import BUILTIN_NAMESPACES, FULLGRAPH, TESTS
from ropecheck.properties.runner import Result

NAME = "opcheck"
FORMULA = (
    f"torch.library.opcheck ({', '.join(TESTS)}) passes on every custom-op call the checks make; "
    "under --mode compile, torch.compile(fullgraph=True) traces each call whole"
)


@dataclass(frozen=True)
class Finding:
    """One op and test that failed in a column: the first failure's message, the op's
    arguments and the call they came from, the property whose calls showed it first, and
    on how many distinct inputs it failed of those it was tried on."""

    op: str
    test: str
    message: str
    args: str
    call: str
    property: str
    inputs: int
    tried: int
    reproduce: str = ""

    def text(self) -> str:
        what = "torch.compile(fullgraph=True) broke the graph" if self.test == FULLGRAPH else f"{self.test} failed"
        return f"{self.op}: {what} on {self.inputs} of {self.tried} inputs tried: {self.message}"

    def first_input(self) -> str:
        args = f"{self.op}({self.args}) from " if self.args else ""
        return f"{args}the call {self.call} (in the calls of {self.property})"


def findings(results: list[Result], reproduce: Callable[[str], str]) -> list[Finding]:
    """The findings of these results' records, in the order first seen: one per op and
    test (``reproduce(property)``: how the check that showed it first is rerun)."""
    first: dict = {}  # (op, test) -> (Checked, Called, property)
    failed: dict = {}  # (op, test) -> the keys of the inputs it failed on
    tried: dict = {}  # (op, test) (fullgraph: the test alone) -> the keys of the inputs tried
    for r in results:
        for called in r.opchecks:
            for c in called.checked:
                tried.setdefault((c.op, c.test) if c.test != FULLGRAPH else FULLGRAPH, set()).add(c.key)
                if c.failed:
                    first.setdefault((c.op, c.test), (c, called, r.property))
                    failed.setdefault((c.op, c.test), set()).add(c.key)
    out = []
    for (op, test), (c, called, prop) in first.items():
        keys = tried.get((op, test) if test != FULLGRAPH else FULLGRAPH, set())
        out.append(
            Finding(op, test, c.message, c.args, called.call, prop, len(failed[(op, test)]), len(keys), reproduce(prop))
        )
    return out


def row(results: list[Result], dtype: str, mode: str, reproduce: Callable[[str], str]) -> Result:
    """The column's opcheck Result: failed with its findings (message, first input and
    reproduce line each; the JSON record's ``input.findings``), passed with what was
    checked, or skipped with a note when no call made a custom-op call."""
    result = Result(NAME, dtype, "passed", FORMULA, mode=mode)
    called = [c for r in results for c in r.opchecks]
    ops = list(dict.fromkeys(op for c in called for op in c.ops))
    found = findings(results, reproduce)
    result.examples = len(called)
    if found:
        result.status, result.shrunk = "failed", False
        first = found[0]
        result.message = first.text()
        if len(found) > 1:  # the first input and reproduce line shown after it are 1.'s
            result.message = f"{len(found)} findings, one per op and test (the first input below is 1.'s):"
            for n, f in enumerate(found, 1):
                result.message += f"\n  {n}. {f.text()}"
                if f.first_input() != first.first_input():
                    result.message += f"\n     first input: {f.first_input()}"
                if f.reproduce != first.reproduce:
                    result.message += f"\n     reproduce: {f.reproduce}"
        result.counterexample = first.first_input()
        result.reproduce = first.reproduce
        result.signature = "opcheck: " + "; ".join(f"{f.op} {f.test}" for f in found)
        result.input = {"findings": [asdict(f) for f in found]}
        return result
    trials = sum(1 for c in called for k in c.checked if k.test == FULLGRAPH)
    traced = f"; torch.compile(fullgraph=True) traced the {trials} calls tried whole" if trials else ""
    if not ops:
        result.status = "skipped"
        result.message = (
            f"the target called no custom op (a torch.library operator outside {', '.join(BUILTIN_NAMESPACES)}) "
            f"in the {len(called)} classes of calls followed: nothing for opcheck to check{traced}"
        )
        return result
    inputs = len({k.key for c in called for k in c.checked if k.test != FULLGRAPH})
    result.message = f"{', '.join(ops)}: every opcheck test passed on {inputs} inputs{traced}"
    return result
