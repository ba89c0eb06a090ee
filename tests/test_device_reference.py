"""The float64 reference computed where the data is (``properties.device_reference``):
on a CUDA device for large inputs; here forced onto the CPU through torch, it must give the
host's verdicts and error ratios, and the host's reference judges it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ropecheck.properties import device_reference
from ropecheck.properties.checks import PROPERTIES
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.targets.builtins import builtin
from ropecheck.targets.target import Convention, Target

OPTIONS = RunOptions(profile="ci", max_examples=6, timeout=60)
REFERENCE = PROPERTIES["reference"]


def _run(target, dtype, on_device, monkeypatch):
    monkeypatch.setattr(device_reference, "FORCED", "cpu" if on_device else None)
    return run_property(REFERENCE, target, dtype, OPTIONS)


def _wrong_base(x, positions):
    """rotate-half at base 10000, declared below at 500000: wrong at every position > 0."""
    return builtin("rotate-half").fn(x, positions)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_device_path_gives_the_host_s_verdict_and_ratio(dtype, monkeypatch):
    correct = builtin("rotate-half")
    wrong = Target("wrong-base", _wrong_base, Convention("half", 500000.0))
    for target, status in ((correct, "passed"), (wrong, "failed")):
        host, device = _run(target, dtype, False, monkeypatch), _run(target, dtype, True, monkeypatch)
        assert host.status == device.status == status, (host.message, device.message)
        assert device.max_error == pytest.approx(host.max_error, rel=1e-9)
        if status == "failed":
            assert device.counterexample == host.counterexample


def test_the_host_reference_judges_the_device_s(monkeypatch):
    """A device reference one part in 2^40 off the host's is ropecheck's own error."""
    monkeypatch.setattr(device_reference, "FORCED", "cpu")
    target = builtin("rotate-half")
    ctx = REFERENCE.context(target, "float32", 60, OPTIONS.drawn_sizes)
    x = torch.randn(1, 5, 2, 8)
    at = np.arange(5)[None] * 1000
    _, expected, bound = device_reference.reference_and_bound(ctx, x, at, inverse=False, seq_len=None, device="cpu")
    device_reference.judge(ctx, x, at, expected, bound, inverse=False, seq_len=None)  # agrees
    with pytest.raises(RuntimeError, match="reference computed on cpu disagrees with the host's"):
        device_reference.judge(ctx, x, at, expected * (1 + 2.0**-40), bound, inverse=False, seq_len=None)


def test_large_inputs_on_a_cuda_device_are_judged_there(monkeypatch):
    monkeypatch.setattr(device_reference, "FORCED", None)
    big = torch.empty(device_reference.DEVICE_ELEMENTS + 1, device="meta")
    on_cuda = builtin("rotate-half").with_(device="cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_reference.device_for(on_cuda, big) == torch.device("cuda:0")
    assert device_reference.device_for(on_cuda, torch.empty(8, device="meta")) is None  # small: the host
    assert device_reference.device_for(builtin("rotate-half"), big) is None  # a CPU target: the host
