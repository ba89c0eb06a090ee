"""Wall time of a whole verdict, as a user runs it: ``ropecheck check TARGET --profile ci
--dtype float32`` in a fresh process, with the target in its worker process and the checks
shared with a helper (the default), in its worker alone (``--jobs 1``) and in ropecheck's
own process (``--in-process``), side by side in one session. The ratio of the last two
medians is what crash isolation costs: a pipe round trip per call; the first two, what
the helper gains.

Run:  python -m pytest benchmarks/bench_verdict.py --benchmark-enable -p no:cacheprovider
(``--benchmark-group-by=param:target`` puts each target's two modes together).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("rotate-half", "llama-complex", "cached")
MODES = {"worker": (), "worker-alone": ("--jobs", "1"), "in-process": ("--in-process",)}


def verdict(target: str, mode: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "ropecheck", "check", target, "--profile", "ci",
                           "--dtype", "float32", *MODES[mode]],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return proc.returncode


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("target", TARGETS)
def test_verdict_time(benchmark, target, mode):
    if not benchmark.enabled and target != TARGETS[0]:
        pytest.skip("smoke run: one target is enough")
    code = benchmark.pedantic(verdict, args=(target, mode), rounds=3, iterations=1)
    assert code == 0
    benchmark.extra_info.update(target=target, mode=mode, profile="ci", dtype="float32")
