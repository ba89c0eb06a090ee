"""N-D checks: correct targets pass, the seed's failure modes fail the property meant for
them; the CLI's --family exit codes; the HF Qwen2-VL adapters."""
import importlib.util

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from properties.nd_checks import ND_PROPERTIES, NDTarget, run_nd_property
from properties.runner import RunOptions
from reference.nd import axial, mrope
from ropecheck.cli import main

OPTIONS = RunOptions(profile="ci", max_examples=8)
CONV = axial(8, 2, layout="interleaved")


def _torch(conv, transform=lambda p: p):
    def rope(x, positions):
        y = conv.apply(x.double().numpy(), transform(positions.numpy()))
        return torch.from_numpy(y).to(x.dtype)
    return rope


def _noncommuting(x, positions):  # axis 0 on planes (0,1),(2,3).., axis 1 on (1,2),(3,4)..: B1 B2 != B2 B1
    y = x.double().clone()
    for start, k in ((0, 0), (1, 1)):
        a, b = torch.arange(start, 7, 2), torch.arange(start, 7, 2) + 1
        ang = positions[..., k].double()[:, :, None, None] * 0.5 ** torch.arange(len(a))
        ya, yb = y[..., a], y[..., b]
        y[..., a], y[..., b] = ya * ang.cos() - yb * ang.sin(), ya * ang.sin() + yb * ang.cos()
    return y.to(x.dtype)


def _status(fn, prop, conv=CONV):
    return run_nd_property(ND_PROPERTIES[prop], NDTarget("t", fn, conv.n_axes, conv, (conv.head_dim,)),
                           "float32", OPTIONS).status


@pytest.mark.parametrize("conv", [CONV, mrope([2, 1, 1]), mrope([4, 2, 2], interleaved=True)])
def test_correct_targets_pass(conv):
    for prop in ND_PROPERTIES:
        assert _status(_torch(conv), prop, conv) == "passed", prop


def test_seed_failure_modes_fail_their_property():
    plus = _torch(CONV, lambda p: np.repeat(p.sum(-1, keepdims=True), 2, -1))  # R_{x+y}, eq. 14
    assert _status(plus, "invertibility") == "failed"
    assert _status(plus, "relativity-axis") == "passed"  # relative, but lossy
    assert _status(_noncommuting, "relativity-axis") == "failed"
    assert _status(_noncommuting, "commutation") == "failed"
    assert _status(_torch(CONV, lambda p: p[..., ::-1].copy()), "reference") == "failed"  # axes swapped
    # sections in chunks where the declared scheme interleaves them (Qwen2-VL code on a Qwen3-VL model)
    assert _status(_torch(mrope([4, 2, 2])), "reference", mrope([4, 2, 2], interleaved=True)) == "failed"


def test_cli_family_exit_codes(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("from reference.nd import axial\nimport torch\nC = axial(8, 2, layout='half')\n"
                    "def rope(x, p):\n    return torch.from_numpy(C.apply(x.double().numpy(), p.numpy())).to(x.dtype)\n"
                    "def bad(x, p):\n    return rope(x, p.flip(-1))\n")
    run = lambda *a: CliRunner().invoke(main, ["check", *a, "--profile", "ci", "--max-examples", "5",
                                               "--dtype", "float32"])
    assert run(f"{good}:rope", "--family", "axial", "--axes", "2", "--layout", "half", "--split", "4,4").exit_code == 0
    assert run(f"{good}:bad", "--family", "axial", "--axes", "2", "--layout", "half", "--split", "4,4").exit_code == 1
    r = run(f"{good}:rope", "--family", "mrope")
    assert r.exit_code == 2 and "needs --sections" in r.output and "Traceback" not in r.output
    assert run(f"{good}:nothing", "--family", "axial", "--layout", "half").exit_code == 2
    inter = tmp_path / "inter.py"
    inter.write_text("from reference.nd import mrope\nimport torch\nC = mrope([4, 2, 2], interleaved=True)\n"
                     "def rope(x, p):\n    return torch.from_numpy(C.apply(x.double().numpy(), p.numpy())).to(x.dtype)\n")
    assert run(f"{inter}:rope", "--family", "mrope", "--sections", "4,2,2", "--mrope-interleaved").exit_code == 0
    assert run(f"{inter}:rope", "--family", "mrope", "--sections", "4,2,2").exit_code == 1


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed (pip install transformers==5.23.0 torch==2.13.0)")
def test_hf_qwen2vl_adapters():
    from ropecheck.adapters.transformers_nd import (QWEN3_SECTIONS, SECTIONS, build_mrope, build_qwen3vl_mrope,
                                                    build_rope_index)
    conv = mrope(SECTIONS)
    for prop in ("reference", "relativity-axis", "invertibility"):
        assert _status(build_mrope(), prop, conv) == "passed"
    qwen3 = build_qwen3vl_mrope()
    assert _status(qwen3, "reference", mrope(QWEN3_SECTIONS, interleaved=True)) == "passed"
    assert _status(qwen3, "reference", mrope(QWEN3_SECTIONS)) == "failed"  # it does interleave
    build = build_rope_index()
    assert build([("text", 2), ("image", 2, 3), ("text", 1)])[-1].tolist() == [5, 5, 5]
    # the defect: after a video with t > max(h, w) the text restarts inside the video's time span
    assert build([("video", 2, 1, 1), ("text", 1)])[-1].tolist() == [1, 1, 1]  # reference: [2, 2, 2]


@pytest.mark.parametrize("family, body", [
    (["--family", "nd", "--axes", "2"], "def f(x, positions):\n    time.sleep(60)\n    return x\n"),
    (["--family", "xpos"], "def f(q, k, positions):\n    if positions.shape[1] > 3:\n        time.sleep(60)\n"
                           "    return q.clone(), k.clone()\n"),
])
def test_cli_family_a_hanging_target_is_a_finding_and_stops_the_run(tmp_path, family, body):
    module = tmp_path / "hang.py"
    module.write_text("import time\n" + body)
    result = CliRunner().invoke(main, ["check", f"{module}:f", *family, "--timeout", "1", "--dtype", "float32",
                                       "--profile", "ci", "--max-examples", "3"])
    assert result.exit_code == 1, result.output
    assert "did not return within 1 s" in result.output and "stopped early" in result.output
    assert "Traceback" not in result.output
