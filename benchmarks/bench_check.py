"""Wall time of a full check run: every property in properties.checks.PROPERTIES against
the built-in 'rotate-half' target in float32, ci profile (derandomized), 10 examples per
check, the way ``ropecheck check --dtype float32 --profile ci --max-examples 10`` runs
them (without the CLI's warm-up calls and rich output).

Run:  python -m pytest benchmarks/bench_check.py --benchmark-only -p no:cacheprovider
extra_info records the examples run per round (the sum of Result.examples; the fixed
critical inputs included) and examples/s from the mean round time.
"""

from __future__ import annotations

from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.targets.builtins import builtin

TARGET = "rotate-half"
DTYPE = "float32"
OPTIONS = RunOptions(profile="ci", max_examples=10)


def full_check(target):
    return [run_property(prop, target, DTYPE, OPTIONS) for prop in PROPERTIES.values() if prop.offered_to(target)]


def test_full_check_rotate_half_float32(benchmark):
    target = builtin(TARGET)
    results = benchmark.pedantic(full_check, args=(target,), rounds=3, iterations=1, warmup_rounds=1)
    assert len(results) == sum(prop.offered_to(target) for prop in PROPERTIES.values())
    assert [r.property for r in results if r.status != "passed"] == [], \
        {r.property: (r.status, r.message) for r in results}
    examples = sum(r.examples for r in results)
    assert examples > 0
    benchmark.extra_info.update(target=TARGET, dtype=DTYPE, profile=OPTIONS.profile,
                                max_examples=OPTIONS.max_examples, properties=len(results),
                                examples=examples)
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["examples_per_s"] = examples / benchmark.stats.stats.mean
