"""An interface's argument space (properties/interfaces/space.py, draws.py; issue 41): the
pairwise plan covers every pair of classes that can go together, and no other; each row
of every preset's plan is realized as an input whose call has exactly the row's classes
(a class never drawn fails here); restrictions name what they leave out; the coverage a
run reports counts what its calls had."""

from __future__ import annotations

import itertools

import pytest

from ropecheck.calling.presets import PRESETS
from ropecheck.properties.interfaces import draws
from ropecheck.properties.interfaces.space import NOT_APPLICABLE, Factor, Rule, Space, both_ways, value_class


def _space(rules=()) -> Space:
    return Space(
        (
            Factor("a", tuple(value_class(n) for n in ("1", "2", "3"))),
            Factor("b", tuple(value_class(n) for n in ("x", "y"))),
            Factor("c", tuple(value_class(n) for n in ("p", "q", "r", "s"))),
            Factor("d", tuple(value_class(n) for n in ("u", "v", NOT_APPLICABLE))),
        ),
        tuple(rules),
    )


def _allowed_pairs(space: Space) -> set:
    """Every pair of classes some complete row the rules allow holds (by brute force)."""
    names = [f.name for f in space.factors]
    out: set = set()
    for values in itertools.product(*(f.names for f in space.factors)):
        row = dict(zip(names, values))
        if space.allows(row):
            out |= space.row_pairs(row)
    return out


RULES = [
    (),
    (Rule("a", ("1",), "c", ("p",), "1 needs p"),),
    (Rule("a", ("1",), "c", ("p",)), *both_ways("b", ("y",), "d", (NOT_APPLICABLE,))),
]


@pytest.mark.parametrize("rules", RULES, ids=["free", "one rule", "three rules"])
def test_the_plan_covers_exactly_the_pairs_that_can_go_together(rules):
    space = _space(rules)
    assert space.pairs == frozenset(_allowed_pairs(space))
    assert all(space.allows(row) for row in space.plan)
    assert len(space.plan) < len(list(itertools.product(*(f.names for f in space.factors))))


def test_the_plan_is_the_same_in_every_process():
    assert _space(RULES[2]).plan == Space(_space(RULES[2]).factors, _space(RULES[2]).rules).plan


def test_a_restriction_names_the_classes_it_leaves_out():
    space = _space().restricted("c", ("p", "q"), "--call x was asked for")
    assert space.factor("c").names == ("p", "q")
    assert ("c", "r", "--call x was asked for") in space.unreached
    line = space.coverage(space.plan).line()
    assert line.startswith(f"interface paths: {len(space.pairs)}/{len(space.pairs)} pairs")
    assert "not reached: c=r|s (--call x was asked for)" in line


def test_coverage_counts_what_the_calls_had_and_names_the_first_pair_missing():
    space = _space()
    some = space.plan[:2]
    coverage = space.coverage(some)
    assert 0 < len(coverage.covered) < len(space.pairs)
    assert "not called: " in coverage.line() and f"{len(coverage.missing) - 1} more" in coverage.line()
    record = coverage.to_dict()
    assert record["pairs"] == len(space.pairs) and len(record["covered_pairs"]) == len(coverage.covered)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_row_of_every_presets_plan_is_realized_as_its_classes(name):
    """The fixed input of each row of the plan, observed as a call observes it, has the
    row's classes: a class the drawing cannot reach fails here."""
    preset = PRESETS[name]
    space = preset.space
    cases = draws.plan_cases(space, "float32", None, preset.calls[0], max_position=65535, row_offsets=preset.offsets)
    for row, case in zip(space.plan, cases):
        facts = {
            "call": case.call,
            "positions": case.positions_array(),
            "lengths": case.lengths,
            "q_heads": case.heads,
            "k_heads": case.k_heads,
            "memory": case.memory,
            "separate": case.separate,
            "k_memory": case.k_memory,
            "choices": case.choices,
        }
        assert draws.observe(space, facts) == row, (row, case.describe())
    covered = space.coverage([dict(c.choices) for c in cases])
    assert not covered.missing


def test_a_propertys_space_keeps_only_the_classes_it_takes():
    space = PRESETS["flash-attn"].space
    batch_only = draws.property_space(space, ("x", "qk"), {"min_batch": 2})
    assert batch_only.factor("cu_seqlens").names == ("None",)
    assert set(batch_only.factor("tokens").names) == {"decode", "batch"}
    zeros = draws.property_space(space, ("x", "qk", "packed"), {"positions": False})
    assert zeros.factor("seqlen_offsets").names == ("0",)


def test_drawn_inputs_come_from_the_rows():
    from hypothesis import given, settings

    space = PRESETS["hf"].space
    seen = []

    @settings(max_examples=30, derandomize=True, database=None)
    @given(draws.row_cases(space, "float32", None, "qk", max_position=4096))
    def draw(case):
        seen.append(dict(case.choices))
        assert case.call == "qk" and case.choice("cos rows") in ("(b, s, D)", "(1, s, D)")

    draw()
    assert len({tuple(c.items()) for c in seen}) > 5


def test_the_docs_list_every_class_of_every_preset():
    from pathlib import Path

    from ropecheck.calling.presets import classes_table

    page = (Path(__file__).resolve().parent.parent / "docs" / "presets.md").read_text()
    begin, end = "<!-- classes: begin -->\n", "<!-- classes: end -->"
    assert page[page.index(begin) + len(begin) : page.index(end)] == classes_table(), (
        "docs/presets.md's table of argument classes differs from the presets: make it again with "
        "ropecheck.calling.presets.classes_table()"
    )


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_class_asks_only_what_the_drawing_knows(name):
    asked = {key for f in PRESETS[name].space.factors for c in f.classes for key, _ in c.realize}
    assert asked <= set(draws.REALIZED), asked - set(draws.REALIZED)
