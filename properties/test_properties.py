"""The property checks as pytest tests: ``pytest --pyargs ropecheck.properties --rope-target T``."""

from dataclasses import replace

import pytest

from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import replay_pytest_command, run_property
from ropecheck.calling import TargetHung

_hung = []


def _report(result):
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status != "passed":
        lines = [f"{result.property} ({result.dtype}): {result.formula}", result.message,
                 f"likely cause: {result.diagnosis}" if result.diagnosis else "",
                 f"minimal counterexample: {result.counterexample}", f"reproduce: {result.reproduce}"]
        pytest.fail("\n".join(line for line in lines if line), pytrace=False)


def test_position_range(rope_range):
    """The target accepts every position 0 .. --rope-max-position (one finding if not)."""
    _report(rope_range[0])


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_property(name, rope_range, rope_dtype, rope_mode, rope_options, request):
    if _hung:
        pytest.skip(f"the target hung earlier ({_hung[0]})")
    target = rope_range[1] if rope_mode == "eager" else replace(rope_range[1], mode=rope_mode)
    try:
        result = run_property(PROPERTIES[name], target, rope_dtype, rope_options,
                              reproduce_hint=replay_pytest_command(request.config, name, rope_dtype))
    except TargetHung as exc:
        _hung.append(f"{name}, {rope_dtype}")
        pytest.fail(f"{name} ({rope_dtype}): {exc}", pytrace=False)
    for note in result.notes:
        print(f"support note ({rope_dtype}): {note}")
    _report(result)
