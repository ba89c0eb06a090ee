"""--mode: a kernel right in eager and wrong under torch.compile or torch.autocast fails that
mode alone, named in the table, the failure and the reproduce line; a correct kernel
passes every mode. CUDA graphs need a GPU: here only their refusal is tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ropecheck
from ropecheck.calling import modes
from tests.test_cli import FP32, check

KERNELS = str(Path(__file__).with_name("mode_kernels.py"))
QUICK = ("--layout", "half", *FP32, "--property", "reference", "--max-examples", "3", "--profile", "ci")


def run(tmp_path, name: str, *run_modes: str):
    record = tmp_path / f"{name}.json"
    result = check(f"{KERNELS}:{name}", *QUICK, *[w for m in run_modes for w in ("--mode", m)],
                   "--json", str(record))
    return result, json.loads(record.read_text())


def verdicts(record: dict) -> dict:
    return {r["mode"]: r["status"] for r in record["results"] if r["property"] == "reference"}


def test_mode_names():
    assert modes.parse(()) == ["eager"]
    assert modes.parse(["eager,compile", "autocast", "compile"]) == ["eager", "compile", "autocast"]
    with pytest.raises(ValueError, match="unknown --mode fast"):
        modes.parse(["fast"])


def test_a_correct_kernel_passes_every_mode(tmp_path):
    result, record = run(tmp_path, "correct", "eager", "compile", "autocast", "autocast-fp16")
    assert result.exit_code == 0, result.output
    assert verdicts(record) == dict.fromkeys(("eager", "compile", "autocast", "autocast-fp16"), "passed")
    assert record["modes"] == ["eager", "compile", "autocast", "autocast-fp16"]
    assert "float32 compile" in result.output and "float32 autocast" in result.output  # its columns


def test_angles_from_a_matmul_fail_under_autocast_only(tmp_path):
    result, record = run(tmp_path, "matmul_angles", "eager", "autocast")
    assert result.exit_code == 1, result.output
    assert verdicts(record) == {"eager": "passed", "autocast": "failed"}
    assert "FAILED reference (float32 autocast)" in result.output
    failed = next(r for r in record["results"] if r["status"] == "failed")
    assert failed["reproduce"].split("  (in Python")[0].endswith("--property reference --mode autocast")


def test_a_compile_only_branch_fails_under_compile_only(tmp_path):
    result, record = run(tmp_path, "compile_branch", "eager", "compile")
    assert result.exit_code == 1, result.output
    assert verdicts(record) == {"eager": "passed", "compile": "failed"}
    assert "--mode compile" in next(r for r in record["results"] if r["status"] == "failed")["reproduce"]


def test_junit_names_carry_the_mode(tmp_path):
    junit = tmp_path / "r.xml"
    result = check(f"{KERNELS}:matmul_angles", *QUICK, "--mode", "eager", "--mode", "autocast",
                   "--junit", str(junit))
    assert result.exit_code == 1
    text = junit.read_text()
    assert 'name="reference[float32]"' in text and 'name="reference[float32-autocast]"' in text


def test_the_api_takes_modes_and_reproduces_them():
    from tests import mode_kernels

    report = ropecheck.check(mode_kernels.matmul_angles, layout="half", dtypes=["float32"],
                             properties=["reference"], max_examples=3, modes=["eager", "autocast"])
    assert not report.passed
    (failed,) = report.failures
    assert failed.mode == "autocast" and "modes=['autocast']" in failed.reproduce


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cudagraph_needs_a_cuda_device(tmp_path):
    result = check("rotate-half", *FP32, "--mode", "cudagraph")
    assert result.exit_code == 2
    assert "--mode cudagraph needs --device cuda" in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_correct_kernel_passes_in_a_cuda_graph(tmp_path):
    result = check(f"{KERNELS}:correct", *QUICK, "--device", "cuda", "--mode", "eager", "--mode", "cudagraph")
    assert result.exit_code == 0, result.output


# --- compile as production compiles ---------------------------------------------------------


def _rotate_half(x, positions):
    d = x.shape[-1]
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.to(torch.float32)[..., None] * inv
    cos, sin = torch.cat([angles.cos(), angles.cos()], -1)[..., None, :], torch.cat([angles.sin()] * 2, -1)[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def test_compile_routes_the_first_signatures_static_and_the_rest_to_one_dynamic_graph():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = modes.Compiled(_rotate_half)
    lengths = (3, 5, 7, 9, 11, 13, 17, 19, 23, 29)
    for seq in lengths:
        x = torch.randn(2, seq, 2, 8)
        positions = torch.arange(seq).expand(2, seq).contiguous()
        y = compiled(x, positions)
        assert torch.allclose(y, _rotate_half(x, positions), atol=1e-5)
    assert len(compiled.static_signatures) == modes.STATIC_SIGNATURES
    # the static artefact compiled one graph per static signature; the dynamic one at most
    # two for the seven other lengths (dynamo's first call is static, the second generalises)
    assert counters["stats"]["unique_graphs"] <= modes.STATIC_SIGNATURES + 2, dict(counters["stats"])
    # the same signature always goes to the same artefact
    x = torch.randn(2, 3, 2, 8)
    assert compiled._static((x, torch.arange(3).expand(2, 3).contiguous()))


def test_inference_shares_one_graph_across_single_tokens_and_batches():
    """Decode (one token, one sequence) and prefill share the inference graph: a dynamic size
    of 1 is not specialised (serving's backed_size_oblivious)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = modes.Compiled(_rotate_half)
    shapes = [(2, 3), (3, 5), (1, 7)] + [(b, s) for b in (1, 2, 3) for s in (1, 4, 9)]
    with torch.no_grad():
        for batch, seq in shapes:
            x = torch.randn(batch, seq, 2, 8)
            positions = torch.arange(seq).expand(batch, seq).contiguous()
            assert torch.allclose(compiled(x, positions), _rotate_half(x, positions), atol=1e-5)
    # (dynamo compiles the dynamic artefact a second time: a guard of its first fails to evaluate)
    assert counters["stats"]["unique_graphs"] <= modes.STATIC_SIGNATURES + 2, dict(counters["stats"])


def test_one_process_keeps_one_compiled_target_across_its_executions():
    from ropecheck.calling.execution import Execution

    first, second = Execution(_rotate_half), Execution(_rotate_half)
    assert first.in_mode("compile") is second.in_mode("compile")
    assert Execution(lambda x, p: x).in_mode("compile") is not first.in_mode("compile")


def test_a_compile_run_compiles_one_model_not_one_graph_per_drawn_shape():
    """No recompile storm: the checks of a compile run draw one model's shapes, so a whole ci
    run of the correct kernel compiles a handful of graphs: the static ones, one for
    inference and two for training (a batch of 1 specialised; a training call's sequence
    is longer than a token). Drawing every head size, layout and dtype compiled over a
    hundred and hit dynamo's recompile limit; one model's run that still probed exotic
    layouts, swept accuracy at another head size, fed decode calls views (their strides)
    and trained on single tokens compiled 12."""
    from torch._dynamo.utils import counters

    from tests import mode_kernels

    torch._dynamo.reset()
    counters.clear()
    report = ropecheck.check(mode_kernels.correct, layout="half", dtypes=["float32"], profile="ci",
                             modes=["compile"], in_process=True)
    assert report.passed, report
    assert counters["stats"]["unique_graphs"] <= modes.STATIC_SIGNATURES + 1 + 2, dict(counters["stats"])
    assert not any("recompile limit" in message for message, _ in report.session.compile_notes)


def test_dynamic_dims_are_the_token_dimensions():
    assert list(modes.dynamic_dims(torch.zeros(2, 5, 4, 8))) == [0, 1]
    assert list(modes.dynamic_dims(torch.zeros(7, 4, 8))) == [0]
    assert list(modes.dynamic_dims(torch.zeros(7, 32))) == [0]
    assert list(modes.dynamic_dims(torch.zeros(2, 5, dtype=torch.int64))) == [0, 1]
    assert list(modes.dynamic_dims(3)) == []


def test_a_compiling_call_has_a_compile_allowance_once_per_signature():
    from ropecheck.calling.caller import COMPILE_ALLOWANCE, Caller

    x, positions = torch.zeros(1, 4, 2, 8), torch.arange(4)[None]
    compiled = Caller(executor=None, timeout=5.0, mode="compile")
    assert compiled.time_limit("call", (x,), positions, None) == 5.0 + COMPILE_ALLOWANCE
    assert compiled.time_limit("call", (x,), positions, None) == 5.0
    assert compiled.time_limit("vjp", (x,), positions, None) == 5.0 + COMPILE_ALLOWANCE
    assert Caller(executor=None, timeout=5.0).time_limit("call", (x,), positions, None) == 5.0


def test_what_torch_compile_warns_of_is_counted_not_printed(capsys):
    import logging
    import warnings

    modes.take_notes()
    with modes.collecting():
        logging.getLogger("torch._dynamo").warning("recompiling: shape changed\nwith details")
        logging.getLogger("torch._inductor.lowering").warning("fallback to aten")
        warnings.warn("a library's fallback", UserWarning)
    captured = capsys.readouterr()
    assert captured.err == captured.out == ""
    notes = dict(modes.take_notes())
    assert notes == {"recompiling: shape changed": 1, "fallback to aten": 1, "UserWarning: a library's fallback": 1}
    assert modes.take_notes() == []  # handed over once
    line = modes.summary(sorted(notes.items()))
    assert line.startswith("torch.compile warned 3 times (3 kinds,") and "--debug" in line


def test_a_compile_run_reports_torch_compiles_warnings_in_one_line(tmp_path):
    result, record = run(tmp_path, "warns_when_compiled", "compile")
    assert result.exit_code == 0, result.output
    assert record["compile_warnings"], record["compile_warnings"]
    lines = [line for line in result.output.splitlines() if "torch.compile warned" in line]
    assert len(lines) == 1 and "Graph break" not in result.output.replace(lines[0], ""), result.output
