"""Wall time of a ``--profile ci`` verdict of a kernel checked through its library's
interface (``--api vllm``: ropecheck makes the cos_sin_cache, flattens the tokens and calls
it in place) beside the same kernel wrapped as ``rope(x, positions)`` (the wrapper builds
the cache and reshapes), side by side in one session (issue 25: within 1.5x). Each run is a
fresh ``ropecheck check`` process, float32, the target in its worker process.

Run:  python -m pytest benchmarks/bench_presets.py --benchmark-enable -p no:cacheprovider
Without ``--benchmark-enable`` (the test suite's smoke run) each runs its reference check
once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = "tests/preset_kernels.py"
FORMS = {
    "preset": (f"{KERNELS}:vllm_correct", "--api", "vllm"),
    # the preset's table length; no autograd (as vllm)
    "wrapped": (f"{KERNELS}:vllm_wrapped", "--max-position", "65535", "--no-backward"),
}


def verdict(form: str, smoke: bool) -> int:
    only = ("--property", "reference") if smoke else ()
    proc = subprocess.run([sys.executable, "-m", "ropecheck", "check", *FORMS[form], "--layout", "half",
                           "--profile", "ci", "--dtype", "float32", *only],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return proc.returncode


@pytest.mark.parametrize("form", list(FORMS))
def test_preset_verdict_time(benchmark, form):
    code = benchmark.pedantic(verdict, args=(form, not benchmark.enabled), rounds=3, iterations=1)
    assert code == 0
    benchmark.extra_info.update(form=form, target=FORMS[form][0], profile="ci", dtype="float32")
