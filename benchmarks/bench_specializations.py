"""What a GPU compiles for a verdict, and the verdict's time: ``ropecheck check TARGET
--profile P --dtype bfloat16`` of each Triton target, as a user runs it, with the Triton
specializations the run launched (``ropecheck.calling.launches``: Triton's own binder made
for a CUDA target, so the count is the GPU's whether the kernel runs compiled or under the
interpreter) in each row's ``extra_info``: ``specializations`` per dtype, their total, and
on a GPU ``compiled`` (the kernels Triton compiled) and ``compile_seconds``.

Run:  python -m pytest benchmarks/bench_specializations.py --benchmark-enable -p no:cacheprovider
      one row: ``"benchmarks/bench_specializations.py::test_verdict_specializations[triton-qk-ci]"``
      (``-k ci`` selects every row: the module's name holds "ci"); the production rows take
      minutes per target under the interpreter, the input past 2^31 elements on a GPU.

Issue 44's bound: at most 16 specializations per dtype at the ci profile, 32 at production,
per target (the project's kernel is held to it in tests/test_triton_kernel.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("triton", "triton-qk", "triton-packed", "triton-interleaved", "liger-kernel", "flash-attn-rotary")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def verdict(target: str, profile: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "check.json"
        proc = subprocess.run([sys.executable, "-m", "ropecheck", "check", target, "--profile", profile,
                               "--dtype", "bfloat16", "--device", DEVICE, "--json", str(record)],
                              cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if proc.returncode == 2:
            return {"unusable": (proc.stdout + proc.stderr).strip().splitlines()[-1:]}
        return json.loads(record.read_text())


@pytest.mark.parametrize("profile", ["ci", "production"])
@pytest.mark.parametrize("target", TARGETS)
def test_verdict_specializations(benchmark, target, profile):
    if not benchmark.enabled:
        pytest.skip("a verdict of a Triton target takes a minute or more under the interpreter")
    records = []
    benchmark.pedantic(lambda: records.append(verdict(target, profile)), rounds=1, iterations=1)
    record = records[-1]
    if "unusable" in record:
        pytest.skip(f"{target}: {record['unusable']}")
    launched = record.get("triton_launches") or {}
    benchmark.extra_info.update(
        target=target, profile=profile, dtype="bfloat16", device=DEVICE, verdict=record["verdict"],
        specializations=launched.get("by_dtype", {}), total=launched.get("specializations", 0),
        compiled=launched.get("compiled", 0), compile_seconds=launched.get("compile_seconds", 0.0),
    )
