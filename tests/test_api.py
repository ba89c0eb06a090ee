"""The Python API, ``ropecheck.check`` / ``ropecheck.identify``, used the way a kernel
author's own test would use it: a lambda or closure around their kernel, a name the worker
loads, a broken kernel whose report says what is wrong, a target that cannot be called."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import ropecheck
from tests import call_form_kernels as kernels
from tests import mutants

pytest_plugins = ["pytester"]

KERNELS = str(Path(__file__).with_name("call_form_kernels.py"))
FAST = dict(dtypes=["float32"], max_examples=5)


def my_freqs(positions: torch.Tensor, head_dim: int, base: float = 500000.0):
    """A user's own cos/sin helper: interleaved (each angle twice, side by side), float64."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = (positions.double()[..., None] * inv_freq).repeat_interleave(2, dim=-1)
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def my_rope(q, k, cos, sin):
    """A user's interleaved RoPE over q and k (k may have fewer heads), taking cos and sin."""
    def rotate(x):
        pairs = x.double().unflatten(-1, (-1, 2))
        turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return (x.double() * cos + turned * sin).to(x.dtype)

    return rotate(q), rotate(k)


def test_the_readme_example_passes_a_correct_kernel():
    report = ropecheck.check(lambda q, k, pos: my_rope(q, k, *my_freqs(pos, q.shape[-1])),
                             call="qk", layout="interleaved", base=500000.0,
                             dtypes=["bfloat16"], max_position=2**20)
    assert report.passed, report.summary()
    assert report.exit_status == 0 and report.verdict == "passed"
    assert {r.property for r in report.results} >= {"reference", "relativity", "backward"}
    assert report.in_process.startswith("it is a Python object")  # a lambda runs here, and says why
    assert "PASSED" in report.summary()


def test_a_closure_with_the_wrong_base_fails_with_the_reason_and_a_python_reproduce():
    def wrong_base(q, k, pos):  # a closure over the user's helpers, base 10000 instead of 500000
        return my_rope(q, k, *my_freqs(pos, q.shape[-1], base=10000.0))

    report = ropecheck.check(wrong_base, call="qk", layout="interleaved", base=500000.0, **FAST)
    assert not report.passed and report.exit_status == 1
    failed = {r.property for r in report.failures}
    assert "reference" in failed
    text = report.summary()
    assert "base 10000" in text and "FAILED" in text
    reference = next(r for r in report.results if r.property == "reference")
    assert reference.reproduce.startswith("ropecheck.check(wrong_base, call='qk', layout='interleaved'")
    assert "properties=['reference']" in reference.reproduce
    assert "ropecheck" in str(report) and "reference" in str(report)  # the table, then the summary


def test_a_named_target_runs_in_a_worker_process():
    report = ropecheck.check(f"{KERNELS}:qk_correct", call="qk", layout="half", **FAST)
    assert report.passed, report.summary()
    assert report.in_process == ""
    broken = ropecheck.check(f"{KERNELS}:qk_bad_k_backward", call="qk", layout="half", **FAST)
    assert not broken.passed


def test_a_module_function_and_a_target_object_pass_and_their_mutants_fail():
    assert ropecheck.check(kernels.qk_correct, call="qk", layout="half", **FAST).passed
    assert ropecheck.check(mutants.rope, layout="half", **FAST).passed
    report = ropecheck.check(mutants.sign_flipped, layout="half", **FAST)
    assert not report.passed
    assert report.target == "tests.mutants:sign_flipped"


def test_the_report_records_match_the_cli_records(tmp_path):
    report = ropecheck.check("rotate-half", layout="half", properties=["reference", "relativity"], **FAST)
    record = json.loads(report.to_json(tmp_path / "r.json"))
    assert record == json.loads((tmp_path / "r.json").read_text())
    assert record["verdict"] == "passed" and record["target"] == "rotate-half"
    assert {r["property"] for r in record["results"]} == {"reference", "relativity"}
    report.write_junit(tmp_path / "r.xml")
    names = [case.get("name") for case in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")]
    assert "reference[float32]" in names


def test_an_unusable_target_is_a_report_not_an_exception(tmp_path):
    missing = ropecheck.check("no_such_file.py:rope")
    assert missing.verdict == "unusable" and not missing.passed and missing.exit_status == 2
    assert "no such file: no_such_file.py" in missing.summary()
    assert json.loads(missing.to_json())["reason"] == missing.reason

    def raises(x, positions):
        raise RuntimeError("kernel not compiled for this device")

    refused = ropecheck.check(raises, layout="half", dtypes=["float32"])
    assert refused.verdict == "unusable"
    assert "kernel not compiled for this device" in refused.summary()


@pytest.mark.parametrize("keywords, message", [
    (dict(layout="diagonal"), "layout must be one of"),
    (dict(call="kv"), "call must be one of"),
    (dict(profile="fast"), "profile must be one of"),
    (dict(max_position=10), "max_position must be in 255"),
    (dict(family="cube"), "family must be one of"),
    (dict(properties=["no-such-check"]), "no-such-check"),
    (dict(dtypes=["float8"]), "float8"),
])
def test_wrong_arguments_raise_value_error(keywords, message):
    with pytest.raises(ValueError, match=message):
        ropecheck.check(mutants.rope, **keywords)


def test_families_take_list_arguments():
    from ropecheck.reference.nd import mrope

    rotation = mrope([2, 1, 1], layout="half")
    report = ropecheck.check(lambda x, positions: torch.from_numpy(
        rotation.apply(x.detach().double().numpy(), positions.numpy())).to(x.dtype),
        family="mrope", sections=[2, 1, 1], layout="half", backward=False, **FAST)
    assert report.passed, report.summary()


def test_identify_reads_a_lambda_convention_as_check_keywords():
    ident = ropecheck.identify(lambda x, pos: my_rope(x, x, *my_freqs(pos, x.shape[-1]))[0])
    assert ident.rotary
    assert ident.options == {"layout": "interleaved", "base": 500000.0}
    assert ropecheck.identify("rotate-half").flags == "--layout half --base 10000"
    with pytest.raises(ropecheck.api.UnusableTarget, match="no such file"):
        ropecheck.identify("no_such_file.py:rope")


def test_a_users_test_file_runs_under_pytest(pytester):
    """What the README shows, in a project of its own: one test function, no adapter file."""
    pytester.makepyfile(rope_kernel=textwrap.dedent('''
        import torch

        def my_freqs(positions, head_dim):
            inv = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
            angles = positions.float()[..., None] * inv
            return torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()

        def my_rope(x, cos, sin):
            half = x.shape[-1] // 2
            turned = torch.cat((-x[..., half:], x[..., :half]), -1)
            return x * cos[:, :, None].to(x.dtype) + turned * sin[:, :, None].to(x.dtype)
    '''))
    pytester.makepyfile(test_rope=textwrap.dedent('''
        import ropecheck
        from rope_kernel import my_freqs, my_rope

        def test_rope_is_right():
            report = ropecheck.check(lambda x, pos: my_rope(x, *my_freqs(pos, x.shape[-1])),
                                     layout="half", dtypes=["float32"], max_examples=5)
            assert report.passed, report.summary()

        def test_rope_with_the_wrong_layout_fails():
            report = ropecheck.check(lambda x, pos: my_rope(x, *my_freqs(pos, x.shape[-1])),
                                     layout="interleaved", dtypes=["float32"], max_examples=5)
            assert report.passed, report.summary()
    '''))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError*", "*against the float64 reference (interleaved layout*",
                                  "*the target pairs features (i, i + r/2), the half layout*"])
