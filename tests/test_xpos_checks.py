"""xPos checks: a correct float32 torch xPos (both layouts, centred or not) passes every check;
each deliberately broken variant fails the check meant for it; the CLI's exit codes; the two
library adapters."""
import importlib.util
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.properties.xpos_checks import XPOS_MAX_POSITION, XPOS_PROPERTIES, XposConvention
from ropecheck.targets.target import Target
from ropecheck.reference.relatives import apply_xpos
from ropecheck.reference.rope import pair_indices
from ropecheck.cli import main
from tests.mutants import _like_strided

OPTIONS = RunOptions(profile="ci", max_examples=8)


def xpos_target(fn, convention, **kw) -> Target:
    """An xPos target as ``ropecheck check --family xpos`` declares it."""
    return Target("t", fn, convention, **{"family": "xpos", "call": "qk", "max_position": XPOS_MAX_POSITION,
                                          "dtypes": ("float32", "bfloat16"), **kw})


def make_xpos(layout="interleaved", gamma=0.4, key_sign=-1.0, scale_dtype=torch.float32, scaled=True,
              positions_used=True, centre=True, key_grad=None, gqa=None):
    """A float32 torch xPos; the keyword arguments break it one way each. ``key_grad``: a
    hand-written backward (a custom autograd.Function) whose key gradient is "correct",
    takes the "query-scale" zeta^(+p), rotates by +n ("rotation-sign"), or takes the query's
    scale only when k has fewer heads than q ("gqa-query-scale"), or is stored through the
    incoming gradient's strides ("gradient-strides": right for dense gradients, rows share
    memory for a broadcast one). ``gqa``: a bug of the GQA
    path alone (k with fewer heads than q): "unscaled" leaves k unscaled, "head-0" gives
    every k head the values of k head 0 (k head j >= 1 reads the wrong q group's key)."""
    def xpos(q, k, positions):
        d = q.shape[-1]
        grouped = k.shape[2] < q.shape[2]
        if grouped and gqa == "head-0":
            k = k[:, :, :1].expand_as(k)
        first, second = (torch.from_numpy(a) for a in pair_indices(d, layout))
        pos = positions if positions_used else torch.arange(q.shape[1]).expand_as(positions)
        pos = pos.to(torch.float32)
        theta = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angle = pos[..., None, None] * theta  # (b, s, 1, d/2)
        zeta = (torch.arange(0, d, 2, dtype=torch.float32) / d + gamma) / (1 + gamma)
        power = (pos - (pos.max() + 1).floor_divide(2) if centre else pos)[..., None, None] / 512.0
        scale_q = (zeta ** power).to(scale_dtype).to(torch.float32) if scaled else 1.0
        scale_k = (zeta ** (key_sign * power)).to(scale_dtype).to(torch.float32) if scaled else 1.0
        if grouped and gqa == "unscaled":
            scale_k = 1.0

        def rotate(x, scale, sign=1.0):
            a, b = x[..., first].float(), x[..., second].float()
            cos, sin = angle.cos(), sign * angle.sin()
            out = torch.empty_like(x, dtype=torch.float32)
            out[..., first] = (a * cos - b * sin) * scale
            out[..., second] = (a * sin + b * cos) * scale
            return out.to(x.dtype)
        if key_grad is None:
            return rotate(q, scale_q), rotate(k, scale_k)

        class Xpos(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k):
                return rotate(q, scale_q), rotate(k, scale_k)

            @staticmethod
            def backward(ctx, gq, gk):  # VJP: zeta^p R_m^T gq, zeta^-p R_n^T gk
                dk = {"correct": lambda: rotate(gk, scale_k, -1.0), "query-scale": lambda: rotate(gk, scale_q, -1.0),
                      "rotation-sign": lambda: rotate(gk, scale_k),
                      "gqa-query-scale": lambda: rotate(gk, scale_q if grouped else scale_k, -1.0),
                      "gradient-strides": lambda: _like_strided(rotate(gk, scale_k, -1.0), gk)}[key_grad]()
                return rotate(gq, scale_q, -1.0), dk
        return Xpos.apply(q, k)
    return xpos


def _result(fn, prop, layout="interleaved", dtype="float32", **kw):
    target = xpos_target(fn, XposConvention(layout), head_dims=(8, 16), **kw)
    return run_property(XPOS_PROPERTIES[prop], target, dtype, OPTIONS)


def _status(fn, prop, layout="interleaved"):
    return _result(fn, prop, layout).status


def test_reference_layouts_are_one_map_up_to_the_permutation():
    x = np.random.default_rng(0).standard_normal((3, 8))
    p = np.array([0, 5, 900])
    perm = np.stack(pair_indices(8, "half"), -1).reshape(-1)  # half features in interleaved order
    inter = apply_xpos(x[:, perm], p, role="key", layout="interleaved")
    np.testing.assert_allclose(apply_xpos(x, p, role="key", layout="half")[:, perm], inter, rtol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("centre", [True, False])
def test_correct_xpos_passes_every_check(layout, centre):
    for prop in XPOS_PROPERTIES:
        assert _status(make_xpos(layout, centre=centre), prop, layout) == "passed", prop


def _recording(fn, seen: set):
    """fn, noting the (q heads, k heads) of every call in ``seen``."""
    def xpos(q, k, positions):
        seen.add((q.shape[2], k.shape[2]))
        return fn(q, k, positions)
    return xpos


def _heads(counterexample: str) -> tuple:
    """(q heads, k heads) of a qk counterexample ("call qk: q (b, s, h, d), k (b, s, kh, d) ...")."""
    found = re.search(r"call qk: q \(\d+, \d+, (\d+), \d+\), k \(\d+, \d+, (\d+), \d+\)", counterexample)
    assert found, counterexample
    return int(found[1]), int(found[2])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_correct_xpos_passes_every_check_with_gqa_keys(layout):
    """q and k come as one qk call; k may have fewer heads (GQA: q head h attends k head
    h // (q_heads / k_heads); MQA: one k head). Every property sees both and passes."""
    for prop in XPOS_PROPERTIES:
        seen = set()
        assert _status(_recording(make_xpos(layout), seen), prop, layout) == "passed", prop
        assert (4, 2) in seen and any(kh == 1 < qh for qh, kh in seen), (prop, seen)


@pytest.mark.parametrize("gqa", ["unscaled", "head-0"])
def test_a_bug_of_the_gqa_path_fails_reference_scores(gqa):
    result = _result(make_xpos(gqa=gqa), "reference-scores")
    assert result.status == "failed", result.message
    q_heads, k_heads = _heads(result.counterexample)
    assert k_heads < q_heads and f"q head h with k head h // {q_heads // k_heads}" in result.message, result


def test_backward_catches_a_key_gradient_wrong_only_with_gqa():
    fn = make_xpos(key_grad="gqa-query-scale")
    assert _status(fn, "reference-scores") == "passed"  # the forward is right
    result = _result(fn, "backward")
    assert result.status == "failed" and "adjoint identity for k" in result.message, result.message
    q_heads, k_heads = _heads(result.counterexample)
    assert k_heads < q_heads, result.counterexample


@pytest.mark.parametrize("broken, fails", [
    (dict(key_sign=1.0), ("reference-scores", "relativity")),  # q and k both scaled by zeta^(m/s)
    (dict(gamma=0.5), ("reference-scores",)),
    (dict(scaled=False), ("reference-scores",)),
    (dict(scale_dtype=torch.bfloat16), ("reference-scores", "relativity")),  # precision bug
    (dict(scale_dtype=torch.float16), ("reference-scores",)),
    (dict(layout="half"), ("reference-scores",)),  # declared interleaved
    (dict(positions_used=False), ("reference-scores", "position-used")),  # arange: shifts are moot
])
def test_broken_xpos_fails_its_checks(broken, fails):
    for prop in fails:
        assert _status(make_xpos(**broken), prop) == "failed", prop


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("centre", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_backward_passes_a_hand_written_correct_vjp(layout, centre, dtype):
    fn = make_xpos(layout, centre=centre, key_grad="correct")
    assert _result(fn, "backward", layout, dtype).status == "passed"


@pytest.mark.parametrize("key_grad, fails", [
    ("query-scale", "adjoint identity for k"),  # dk scaled by zeta^(+p), the query's scale
    ("rotation-sign", "adjoint identity for k"),  # dk = R_n gk, not R_n^T gk
])
@pytest.mark.parametrize("centre", [True, False])
def test_backward_catches_a_wrong_key_gradient(key_grad, fails, centre):
    result = _result(make_xpos(centre=centre, key_grad=key_grad), "backward")
    assert result.status == "failed" and fails in result.message, result.message


def test_backward_catches_a_key_gradient_wrong_only_on_broadcast_gradients():
    result = _result(make_xpos(key_grad="gradient-strides"), "backward")
    assert result.status == "failed" and "expanded" in result.counterexample, result


@pytest.mark.parametrize("broken", [dict(key_sign=1.0), dict(scaled=False), dict(scale_dtype=torch.bfloat16)])
def test_backward_gradient_scores_catch_what_the_adjoint_cannot(broken):
    """A wrong forward has a VJP that is its exact transpose: the adjoint identity holds, and
    the centre-free gradient scores (float64 reference) fail it."""
    result = _result(make_xpos(**broken), "backward")
    assert result.status == "failed" and "gradient scores" in result.message, result.message


def test_backward_needs_autograd_or_a_declaration():
    good = make_xpos()
    no_autograd = lambda q, k, p: tuple(t.detach() for t in good(q, k, p))
    result = _result(no_autograd, "backward")
    assert result.status == "failed" and "declare --no-backward" in result.message, result.message
    k_detached = lambda q, k, p: (good(q, k, p)[0], good(q, k, p)[1].detach())
    result = _result(k_detached, "backward")
    assert result.status == "failed" and "k_out does not require grad" in result.message, result.message
    result = _result(no_autograd, "backward", backward=False)
    assert result.status == "skipped" and result.message == "target declares no backward"


def _pair_contract_breakers():
    yield lambda q, k, p: q  # one tensor, not a pair
    yield lambda q, k, p: (q, k, q)
    yield lambda q, k, p: (q[:, :1], k)
    yield lambda q, k, p: (q.double(), k)
    yield lambda q, k, p: (q, k * float("nan"))
    yield lambda q, k, p: (q.mul_(2), k)
    yield lambda q, k, p: 1 / 0


def test_contract_turns_bad_outputs_into_findings():
    for fn in _pair_contract_breakers():
        target = xpos_target(fn, XposConvention(), head_dims=(8,))
        result = run_property(XPOS_PROPERTIES["contract"], target, "float32", OPTIONS)
        assert result.status == "failed" and result.message, result


def test_contract_k_out_shaped_as_q_fails_with_fewer_k_heads():
    target = xpos_target(lambda q, k, p: (q.clone(), q.clone()), XposConvention(), head_dims=(8,))
    result = run_property(XPOS_PROPERTIES["contract"], target, "float32", OPTIONS)
    assert result.status == "failed" and "k_out shape" in result.message, result
    q_heads, k_heads = _heads(result.counterexample)
    assert k_heads < q_heads, result.counterexample


def test_cli_xpos_exit_codes(tmp_path):
    good = tmp_path / "xp.py"
    good.write_text("from tests.test_xpos_checks import make_xpos\n"
                    "good = make_xpos('half')\nbad = make_xpos('half', key_sign=1.0)\n"
                    "def single(q, k, p):\n    return good(q, k, p)[0]\n"
                    "def detached(q, k, p):\n    return tuple(t.detach() for t in good(q, k, p))\n")
    run = lambda *a: CliRunner().invoke(main, ["check", *a, "--family", "xpos", "--layout", "half", "--profile", "ci",
                                               "--max-examples", "4", "--dtype", "float32"])
    assert run(f"{good}:good").exit_code == 0
    assert run(f"{good}:bad").exit_code == 1
    r = run(f"{good}:detached")  # no autograd: the backward check fails unless --no-backward says so
    assert r.exit_code == 1 and "declare --no-backward" in r.output, r.output
    r = run(f"{good}:detached", "--no-backward")
    assert r.exit_code == 0 and re.search(r"backward\s*│\s*skip", r.output), r.output
    r = run(f"{good}:single")
    assert r.exit_code == 2 and "expected (q_out, k_out)" in r.output and "Traceback" not in r.output
    r = run(f"{good}:good", "--gamma", "-1")
    assert r.exit_code == 2 and "gamma" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("name, module", [("x-transformers-xpos", "x_transformers"),
                                          ("rotary-embedding-torch-xpos", "rotary_embedding_torch")])
def test_library_adapters(name, module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")
    r = CliRunner().invoke(main, ["check", name, "--profile", "ci", "--max-examples", "6", "--dtype", "float32"])
    assert r.exit_code == 0, r.output
