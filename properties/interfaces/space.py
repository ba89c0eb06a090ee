"""An interface's argument space: the classes of values each of its parameters takes in its
library's real callers, which of them go together, a pairwise covering plan of them, and
how much of it a run covered.

A ``Factor`` is one parameter (or one aspect of one: a tensor's memory layout, its token
shape) with its ``ValueClass``es; each class says what the inputs of a call in it look like
(``realize``: what the drawing of a case must give it, ``properties.interfaces.draws``), and
the factor cites where the library's callers pass those values (``source``). A ``Rule``
says which classes go together. A ``Space`` is an interface's factors and rules; its
``plan`` is a covering array (``covertable``): rows of one class per factor such that every
pair of classes of two factors that can go together is in some row. A run draws its inputs
from the rows and tries every row as a fixed input, so every pair is called; the classes
each call really had are observed where its arguments are made and counted here
(``coverage``).

A class named ``NOT_APPLICABLE`` stands where a factor has no value in a row (the key's
layout of a call with key None); pairs with it are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from itertools import combinations

NOT_APPLICABLE = "n/a"


@dataclass(frozen=True)
class ValueClass:
    """One class of values of a factor: ``name`` (what a row and the coverage call it),
    ``what`` (the values, in the interface's words), ``realize`` (what a case in this class
    must be: ``draws.REALIZED`` names the keys)."""

    name: str
    what: str = ""
    realize: tuple = ()  # ((key, value), ...): a dict, kept hashable

    @property
    def settings(self) -> dict:
        return dict(self.realize)


def value_class(name: str, what: str = "", **realize) -> ValueClass:
    return ValueClass(name, what, tuple(sorted(realize.items())))


@dataclass(frozen=True)
class Factor:
    """One parameter of an interface, or one aspect of one, and the classes its library's
    callers pass (``source``: repository and file where they do)."""

    name: str
    classes: tuple
    source: str = ""
    what: str = ""

    @property
    def names(self) -> tuple:
        return tuple(c.name for c in self.classes)

    def value(self, name: str) -> ValueClass:
        for c in self.classes:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no class {name!r}; its classes: {', '.join(self.names)}")


@dataclass(frozen=True)
class Rule:
    """Classes that go together: in a row where ``factor`` is one of ``when``, ``other`` is
    one of ``then`` (``why`` says which caller or code makes it so)."""

    factor: str
    when: tuple
    other: str
    then: tuple
    why: str = ""

    def allows(self, row) -> bool:
        if self.factor not in row or self.other not in row:
            return True
        return row[self.factor] not in self.when or row[self.other] in self.then

    def constraint(self) -> dict:
        """The rule as a covertable constraint (evaluated once both factors are in the row)."""
        return {"operator": "fn", "requires": [self.factor, self.other], "evaluate": self.allows}


def both_ways(factor: str, when: tuple, other: str, then: tuple, why: str = "") -> tuple:
    """Two rules: ``factor`` in ``when`` exactly where ``other`` is in ``then``."""
    return (Rule(factor, when, other, then, why), Rule(other, then, factor, when, why))


Pair = tuple  # ((factor, class), (factor, class)), the factors in the space's order


@dataclass(frozen=True)
class Space:
    """An interface's factors, the rules between their classes, and the classes a run
    cannot reach (``unreached``: (factor, class, why): restricted by the run's options or
    the target's own signature)."""

    factors: tuple
    rules: tuple = ()
    unreached: tuple = ()

    def factor(self, name: str) -> Factor:
        for f in self.factors:
            if f.name == name:
                return f
        raise KeyError(f"no factor {name!r}; the factors: {', '.join(f.name for f in self.factors)}")

    def has(self, name: str) -> bool:
        return any(f.name == name for f in self.factors)

    def allows(self, row: dict) -> bool:
        return all(rule.allows(row) for rule in self.rules)

    def extended(self, factor: Factor, rules: tuple = ()) -> "Space":
        """This space with one factor more (a run's own: an M-RoPE run's media) and its rules."""
        return replace(self, factors=self.factors + (factor,), rules=self.rules + tuple(rules))

    def restricted(self, name: str, allowed, why: str) -> "Space":
        """This space with ``name``'s classes cut to ``allowed`` (the others recorded as
        unreached, with ``why``)."""
        f = self.factor(name)
        kept = tuple(c for c in f.classes if c.name in allowed)
        dropped = tuple((name, c.name, why) for c in f.classes if c.name not in allowed)
        if not dropped:
            return self
        if not kept:
            raise ValueError(f"{name}: no class left of {', '.join(f.names)} ({why})")
        factors = tuple(replace(g, classes=kept) if g.name == name else g for g in self.factors)
        return replace(self, factors=factors, unreached=self.unreached + dropped)

    # --- the plan ------------------------------------------------------------------------
    @cached_property
    def plan(self) -> tuple:
        """The covering array: rows (dicts factor -> class name) such that every pair of
        classes that can go together is in one; the same rows in every run and process."""
        from covertable import make

        factors = {f.name: list(f.names) for f in self.factors}
        if len(factors) < 2:
            return tuple({name: c} for name, classes in factors.items() for c in classes)
        rows = make(factors, constraints=[r.constraint() for r in self.rules])
        order = [f.name for f in self.factors]
        return tuple({name: row[name] for name in order} for row in rows if self.allows(row))

    @cached_property
    def pairs(self) -> frozenset:
        """Every pair of classes of two factors that can go together (not applicable ones
        aside): those the plan holds, which covers every one that can."""
        return frozenset(p for row in self.plan for p in self.row_pairs(row))

    def row_pairs(self, row: dict) -> set:
        """The pairs a call whose classes are ``row`` exercises."""
        items = [(f.name, row.get(f.name, NOT_APPLICABLE)) for f in self.factors]
        items = [(name, c) for name, c in items if c != NOT_APPLICABLE]
        return set(combinations(items, 2))

    def coverage(self, rows) -> "Coverage":
        covered: set = set()
        for row in rows:
            covered |= self.row_pairs(row)
        return Coverage(self, frozenset(covered & self.pairs))


@dataclass(frozen=True)
class Coverage:
    """The pairs of an interface's space a run exercised."""

    space: Space
    covered: frozenset

    @property
    def missing(self) -> list:
        return sorted(self.space.pairs - self.covered)

    def line(self) -> str:
        """One line: "interface paths: 41/41 pairs of argument classes", and what was not
        reached (the first missing pair, the unreached classes)."""
        total, done = len(self.space.pairs), len(self.covered)
        out = f"interface paths: {done}/{total} pairs of argument classes"
        missing = self.missing
        if missing:
            (f1, c1), (f2, c2) = missing[0]
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            out += f"; not called: {f1}={c1} with {f2}={c2}{more}"
        if self.space.unreached:
            shown = "; ".join(f"{f}={c} ({why})" for f, c, why in _grouped(self.space.unreached))
            out += f"; not reached: {shown}"
        return out

    def to_dict(self) -> dict:
        def pair(p):
            return {f: c for f, c in p}

        return {
            "pairs": len(self.space.pairs),
            "covered": len(self.covered),
            "missing": [pair(p) for p in self.missing],
            "covered_pairs": [pair(p) for p in sorted(self.covered)],
            "unreached": [{"factor": f, "class": c, "why": why} for f, c, why in self.space.unreached],
        }


def _grouped(unreached) -> list:
    """(factor, "a|b", why): the classes of one factor unreached for one reason, together."""
    out: dict = {}
    for f, c, why in unreached:
        out.setdefault((f, why), []).append(c)
    return [(f, "|".join(cs), why) for (f, why), cs in out.items()]
