"""N-D checks: correct targets pass, the seed's failure modes fail the property meant for
them; the CLI's --family exit codes; the HF Qwen2-VL adapters."""
import importlib.util
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ropecheck.properties.nd.checks import ND_PROPERTIES
from ropecheck.targets.target import Target
from ropecheck.properties.runner import run_property
from ropecheck.properties.runner import RunOptions
from ropecheck.reference.nd import axial, mrope
from ropecheck.cli import main
from tests.mutants import with_backward

OPTIONS = RunOptions(profile="ci", max_examples=8)
CONV = axial(8, 2, layout="interleaved")


def _torch(conv, transform=lambda p: p):
    """conv's rotation in float64 torch (autograd flows through it) at positions transform(P)."""
    first, second, axis, theta = (torch.from_numpy(np.asarray(a)) for a in conv.arrays)

    def rope(x, positions):
        p = torch.from_numpy(np.ascontiguousarray(transform(positions.numpy())))
        phi = (p[..., axis].double() * theta)[:, :, None, :]  # (b, s, 1, pairs)
        x64 = x.double()
        a, b = x64[..., first], x64[..., second]
        y = x64.clone()
        y[..., first] = a * phi.cos() - b * phi.sin()
        y[..., second] = a * phi.sin() + b * phi.cos()
        return y.to(x.dtype)
    return rope


def _noncommuting(x, positions):  # axis 0 on planes (0,1),(2,3).., axis 1 on (1,2),(3,4)..: B1 B2 != B2 B1
    y = x.double().clone()
    for start, k in ((0, 0), (1, 1)):
        a, b = torch.arange(start, 7, 2), torch.arange(start, 7, 2) + 1
        ang = positions[..., k].double()[:, :, None, None] * 0.5 ** torch.arange(len(a))
        ya, yb = y[..., a], y[..., b]
        y[..., a], y[..., b] = ya * ang.cos() - yb * ang.sin(), ya * ang.sin() + yb * ang.cos()
    return y.to(x.dtype)


def _result(fn, prop, conv=CONV, dtype="float32", declared=True, **kw):
    """``declared``: the target is checked with conv as its convention (else spec-free)."""
    target = Target("t", fn, conv if declared else None, family="axial", n_axes=conv.n_axes,
                    head_dims=(conv.head_dim,), **kw)
    return run_property(ND_PROPERTIES[prop], target, dtype, OPTIONS)


def _status(fn, prop, conv=CONV):
    return _result(fn, prop, conv).status


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


@pytest.mark.parametrize("conv", [CONV, mrope([2, 1, 1]), mrope([4, 2, 2], interleaved=True)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_backward_catches_a_vjp_that_rotates_by_plus_p(conv, dtype):
    """A hand-written backward rotating the gradient by +P (R_P g, not R_P^T g) fails, by the
    adjoint identity without a convention (with one, the shrunk input may show it first in the
    comparison with R_P^T g); the one rotating by -P passes."""
    rope = _torch(conv)
    minus = with_backward(rope, lambda g, p: rope(g, -p))
    plus = with_backward(rope, rope)
    for declared in (True, False):
        assert _result(minus, "backward", conv, dtype, declared).status == "passed"
        result = _result(plus, "backward", conv, dtype, declared)
        assert result.status == "failed", result
        assert declared or "adjoint identity" in result.message, result.message


def test_backward_catches_a_vjp_wrong_only_on_broadcast_gradients():
    """A hand-written backward that stores its result through the incoming gradient's
    strides is right for every dense gradient; a broadcast (stride-0) one, as autograd
    hands the backward of a reduction, makes rows share memory: backward fails it."""
    from tests.mutants import _like_strided
    rope = _torch(CONV)
    strided = with_backward(rope, lambda g, p: _like_strided(rope(g, -p), g))
    assert _result(with_backward(rope, lambda g, p: rope(g, -p)), "backward").status == "passed"
    result = _result(strided, "backward")
    assert result.status == "failed" and "expanded" in result.counterexample, result


def test_backward_reference_catches_a_vjp_right_up_to_the_adjoint():
    """The VJP of a wrong forward passes the adjoint identity (it is that forward's transpose);
    with a declared convention the comparison with R_P^T g fails it."""
    swapped = _torch(CONV, lambda p: p[..., ::-1])  # axes confused, autograd through it
    assert _result(swapped, "backward", declared=False).status == "passed"
    result = _result(swapped, "backward")
    assert result.status == "failed" and "R_P^T g" in result.message, result.message


def test_backward_needs_autograd_or_a_declaration():
    no_autograd = lambda x, p: torch.from_numpy(CONV.apply(x.detach().double().numpy(), p.numpy())).to(x.dtype)
    result = _result(no_autograd, "backward")
    assert result.status == "failed" and "declare --no-backward" in result.message
    result = _result(no_autograd, "backward", backward=False)
    assert result.status == "skipped" and result.message == "target declares no backward"


def test_cli_family_exit_codes(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("from ropecheck.reference.nd import axial\nimport torch\nC = axial(8, 2, layout='half')\n"
                    "def rope(x, p):\n    return torch.from_numpy(C.apply(x.double().numpy(), p.numpy())).to(x.dtype)\n"
                    "def bad(x, p):\n    return rope(x, p.flip(-1))\n")
    # numpy inside: no autograd, so --no-backward (without it the backward check fails)
    run = lambda *a, backward=False: CliRunner().invoke(main, ["check", *a, "--profile", "ci", "--max-examples", "5",
                                                               "--dtype", "float32"] + ([] if backward else ["--no-backward"]))
    axial_flags = ("--family", "axial", "--axes", "2", "--layout", "half", "--split", "4,4")
    r = run(f"{good}:rope", *axial_flags)
    assert r.exit_code == 0 and re.search(r"backward\s*│\s*skip", r.output), r.output
    assert "--no-backward" in r.output  # among the family's flags, as the reproducing command has them
    r = run(f"{good}:rope", *axial_flags, backward=True)  # x.numpy() raises on a tensor that requires grad
    assert r.exit_code == 1 and "requires grad" in r.output, r.output
    assert run(f"{good}:bad", *axial_flags).exit_code == 1
    r = run(f"{good}:rope", "--family", "mrope")
    assert r.exit_code == 2 and "needs --sections" in r.output and "Traceback" not in r.output
    assert run(f"{good}:nothing", "--family", "axial", "--layout", "half").exit_code == 2
    inter = tmp_path / "inter.py"
    inter.write_text("from ropecheck.reference.nd import mrope\nimport torch\nC = mrope([4, 2, 2], interleaved=True)\n"
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


# --- 1-D RoPE is the N-D case with one axis -----------------------------------------------

@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_one_axis_reference_is_the_1d_reference(layout):
    from ropecheck.reference import apply_rope
    conv = axial(16, 1, layout=layout, base=500000.0)
    x = np.random.default_rng(0).standard_normal((2, 5, 3, 16))
    p = np.random.default_rng(1).integers(0, 2**20, (2, 5))
    np.testing.assert_allclose(conv.apply(x, p[..., None]), apply_rope(x, p, layout=layout, base=500000.0),
                               rtol=0, atol=1e-12)


def test_one_axis_cases_hand_1d_targets_their_positions():
    from ropecheck.properties.inputs.cases import Case
    case = Case("float32", 2, 3, 1, 8, ((0, 1, 2), (5, 6, 7)))
    assert case.n_axes == 1 and case.positions_array().shape == (2, 3) and case.axes_array().shape == (2, 3, 1)


@pytest.mark.parametrize("layout,builtin,passes", [("half", "rotate-half", True),
                                                   ("interleaved", "llama-complex", True),
                                                   ("interleaved", "rotate-half", False)])
def test_1d_targets_under_the_nd_checks_with_one_axis(layout, builtin, passes):
    """A 1-D target, called with positions (batch, seq), checked by the N-D family with
    one axis: the right layout passes every N-D property, the wrong one fails reference."""
    from ropecheck.targets.builtins import builtin as make
    conv = axial(8, 1, layout=layout)
    target = Target(builtin, make(builtin).fn, conv, family="axial", n_axes=1, head_dims=(8,))
    statuses = {prop: run_property(ND_PROPERTIES[prop], target, "float32", OPTIONS).status for prop in ND_PROPERTIES}
    if passes:
        assert set(statuses.values()) == {"passed"}, statuses
    else:
        assert statuses["reference"] == "failed" and statuses["relativity-axis"] == "passed", statuses


def test_cli_checks_a_1d_builtin_as_nd_with_one_axis():
    result = CliRunner().invoke(main, ["check", "llama-complex", "--family", "axial", "--axes", "1",
                                       "--layout", "interleaved", "--profile", "ci", "--max-examples", "5",
                                       "--dtype", "float32", "--in-process"])
    assert result.exit_code == 0, result.output
    assert "Family axial: --axes 1 --layout interleaved" in result.output
