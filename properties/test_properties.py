"""The property checks as pytest tests: ``pytest --pyargs properties --rope-target T``."""

import pytest

from properties.checks import PROPERTIES
from properties.runner import run_property
from ropecheck.calling import TargetHung
from ropecheck.pytest_plugin import reproduce_hint

_hung = []


@pytest.mark.parametrize("name", list(PROPERTIES))
def test_property(name, rope_callable, rope_dtype, rope_options, request):
    if _hung:
        pytest.skip(f"the target hung earlier ({_hung[0]})")
    try:
        result = run_property(PROPERTIES[name], rope_callable, rope_dtype, rope_options,
                              reproduce_hint=reproduce_hint(request.config, name, rope_dtype))
    except TargetHung as exc:
        _hung.append(f"{name}, {rope_dtype}")
        pytest.fail(f"{name} ({rope_dtype}): {exc}", pytrace=False)
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status != "passed":
        lines = [f"{result.property} ({result.dtype}): {result.formula}", result.message,
                 f"minimal counterexample: {result.counterexample}", f"reproduce: {result.reproduce}"]
        pytest.fail("\n".join(lines), pytrace=False)
