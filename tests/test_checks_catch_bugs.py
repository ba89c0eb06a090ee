"""Every property check fails on the broken implementations it is meant to catch and
passes every correct built-in target, in every dtype."""

import pytest

from properties.checks import PROPERTIES
from properties.runner import RunOptions, run_property
from ropecheck.builtins import BUILTINS, builtin
from ropecheck.dtypes import DTYPES
from ropecheck.kernels import target as triton_target
from ropecheck.session import warm_up
from tests.mutants import MUTANTS, mutant_target

OPTIONS = RunOptions(profile="ci", max_examples=15, timeout=60)

# dtype in which each mutant's bug shows (a dtype change is invisible in float32)
MUTANT_DTYPE = {"changes-dtype": "bfloat16"}

CATCHES = [(prop, mutant) for mutant, (_, props) in MUTANTS.items() for prop in sorted(props)]


@pytest.mark.parametrize("prop,mutant", CATCHES, ids=[f"{p}-catches-{m}" for p, m in CATCHES])
def test_check_catches_mutant(prop, mutant):
    target = mutant_target(mutant)
    warm_up(target)
    result = run_property(PROPERTIES[prop], target, MUTANT_DTYPE.get(mutant, "float32"), OPTIONS)
    assert result.status == "failed", (f"{prop} did not catch {mutant}: {result.status}, "
                                       f"max error {result.max_error}, {result.message}")
    assert result.counterexample, "a failure must name its counterexample"
    assert prop in result.property


def test_every_check_catches_some_mutant():
    caught = {prop for _, props in MUTANTS.values() for prop in props}
    assert caught == set(PROPERTIES)


# The Triton built-ins run the suite in tests/test_triton_kernel.py (interpreted there: slow).
GOOD = [(name, dtype) for name in BUILTINS if name not in triton_target.BUILTIN_ENTRIES
        for dtype in DTYPES]


@pytest.mark.parametrize("name,dtype", GOOD, ids=[f"{n}-{d}" for n, d in GOOD])
def test_checks_pass_correct_builtin(name, dtype):
    target = builtin(name)
    for prop in PROPERTIES.values():
        result = run_property(prop, target, dtype, OPTIONS)
        assert result.status == "passed", f"{prop.name} ({dtype}) on {name}: {result.message}"
        assert result.max_error is not None and result.max_error <= 1.0


def test_partial_rotary_builtin_passes():
    target = builtin("rotate-half", rotary_dim=16)
    for prop in PROPERTIES.values():
        result = run_property(prop, target, "bfloat16", OPTIONS)
        assert result.status == "passed", f"{prop.name}: {result.message}"


def test_partial_rotary_on_the_wrong_slice_fails():
    import torch
    from ropecheck.target import Convention, Target
    correct = builtin("rotate-half", rotary_dim=16)

    def last_features(x, p):  # rotates the last 16 features instead of the first
        flipped = correct(x.flip(-1).contiguous(), p)
        return flipped.flip(-1)

    target = Target("wrong-slice", last_features, Convention("half", 10000.0, 16))
    result = run_property(PROPERTIES["reference"], target, "float32", OPTIONS)
    assert result.status == "failed"
    del torch


def test_shrinking_stops_at_its_budget(monkeypatch):
    """A slow target's failing verdict is bounded: past the budget the smallest failing
    example found so far is reported, and said to be perhaps not minimal."""
    import properties.runner as runner
    monkeypatch.setattr(runner, "SHRINK_BUDGET", 0.0)
    result = run_property(PROPERTIES["reference"], mutant_target("sign-flipped"), "float32", OPTIONS)
    assert result.status == "failed"
    assert "shrinking stopped" in result.counterexample
    assert result.max_error > 1.0 and "outside the bound" in result.message
