"""Every property check fails on the broken implementations it is meant to catch and
passes every correct built-in target, in every dtype."""

import pytest

from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.targets.builtins import BUILTINS, builtin
from ropecheck.properties.core.dtypes import DTYPES
from ropecheck.targets import triton_builtins as triton_target
from ropecheck.session.prepare import warm_up
from tests.mutants import MUTANTS, mutant_target
from tests.test_fp8_rope import BROKEN as FP8_BROKEN
from tests.test_presets import BROKEN as PRESET_BROKEN


def applicable(target) -> list:
    """The properties that apply to ``target`` (those of library interfaces do not)."""
    return [prop for prop in PROPERTIES.values() if prop.applies_to(target)[0]]

OPTIONS = RunOptions(profile="ci", max_examples=15, timeout=60)
# A correct target's passing runs: 8 drawn examples beside the fixed inputs that carry a pass
# (critical positions, large and size switch inputs, the probes, the accuracy sweep); the
# mutants keep OPTIONS' 15
PASSING = RunOptions(profile="ci", max_examples=8, timeout=60)

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
    # a library interface's own properties catch the broken kernels of tests/test_presets.py
    caught |= {prop for *_, prop, _ in PRESET_BROKEN}
    caught |= {prop for _, _, prop, _ in FP8_BROKEN}  # and the fp8 interface's, tests/test_fp8_rope.py
    assert caught == set(PROPERTIES)


# The Triton built-ins run the suite in tests/test_triton_kernel.py (interpreted there: slow).
GOOD = [(name, dtype) for name in BUILTINS if name not in triton_target.BUILTIN_ENTRIES
        for dtype in DTYPES]


@pytest.mark.parametrize("name,dtype", GOOD, ids=[f"{n}-{d}" for n, d in GOOD])
def test_checks_pass_correct_builtin(name, dtype):
    target = builtin(name)
    for prop in applicable(target):
        result = run_property(prop, target, dtype, PASSING)
        assert result.status == "passed", f"{prop.name} ({dtype}) on {name}: {result.message}"
        assert result.max_error is not None and result.max_error <= 1.0


def test_partial_rotary_builtin_passes():
    target = builtin("rotate-half", rotary_dim=16)
    for prop in applicable(target):
        result = run_property(prop, target, "bfloat16", OPTIONS)
        assert result.status == "passed", f"{prop.name}: {result.message}"


def test_partial_rotary_on_the_wrong_slice_fails():
    import torch
    from ropecheck.targets.target import Convention, Target
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
    import ropecheck.properties.runner as runner
    monkeypatch.setattr(runner, "SHRINK_BUDGET", 0.0)
    result = run_property(PROPERTIES["reference"], mutant_target("sign-flipped"), "float32", OPTIONS)
    assert result.status == "failed"
    assert "shrinking stopped" in result.counterexample
    assert result.max_error > 1.0 and "outside the bound" in result.message


# --- position scaling ------------------------------------------------------------------

SCALED = {
    "linear": "linear:factor=8",
    "yarn": "yarn:factor=4,original_max_position_embeddings=256",
    "llama3": "llama3:factor=8,original_max_position_embeddings=256",
    "dynamic": "dynamic:factor=4,max_position_embeddings=256",
    "longrope": '{"rope_type": "longrope", "short_factor": [1, 1, 1, 1], '
                '"long_factor": [1, 2, 4, 8], "original_max_position_embeddings": 64, "factor": 4}',
}


def _scaled(name: str, rotary_dim: int = 8):
    from ropecheck.reference.scaling import parse
    return builtin("rotate-half", rotary_dim=rotary_dim, scaling=parse(SCALED[name]))


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_checks_pass_correct_scaled_builtin(name, dtype):
    target = _scaled(name)
    for prop in PROPERTIES.values():
        if not prop.applies_to(target)[0]:
            assert prop.needs_table or (target.convention.dynamic and prop.same_theta_across_calls), prop.name
            continue
        result = run_property(prop, target, dtype, PASSING)
        assert result.status == "passed", f"{prop.name} ({dtype}) on {name}: {result.message}"


@pytest.mark.parametrize("name", SCALED)
def test_scaling_not_declared_is_caught(name):
    """The target scales, the declaration does not: the reference check fails."""
    target = _scaled(name).with_(convention=builtin("rotate-half", rotary_dim=8).convention)
    result = run_property(PROPERTIES["reference"], target, "float32", OPTIONS)
    assert result.status == "failed", result.message


def test_missing_attention_factor_is_caught():
    """YaRN declared, the target leaves out cos/sin's attention factor."""
    from dataclasses import replace
    target = _scaled("yarn")
    without = replace(target.convention.scaling, attention_factor_=1.0)
    wrong = target.with_(fn=builtin("rotate-half", rotary_dim=8, scaling=without).fn)
    for prop in ("reference", "orthogonality", "identity"):
        result = run_property(PROPERTIES[prop], wrong, "float32", OPTIONS)
        assert result.status == "failed", f"{prop}: {result.message}"


def test_dynamic_scaling_skips_what_it_does_not_promise():
    target = _scaled("dynamic")
    skipped = {name for name, prop in PROPERTIES.items() if not prop.applies_to(target)[0] and not prop.needs_table}
    assert skipped == {"relativity", "translation", "group-law", "batch-independence"}
