"""Verdicts people can trust: wrong answers fail, refusals of inputs no model produces are
support notes, crashes are failures that never take ropecheck down, one cause is one
finding, and every exit leaves its verdict, exit status and records.

Each target is a small file written into tmp_path; the CLI runs in-process (CliRunner)
unless the case is about how the process ends, which runs it as the ``ropecheck``
command does (``python -m ropecheck``) in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.test_cli import CORRECT, FAST, FP32, check, failed

ROOT = Path(__file__).resolve().parents[1]

META_COMPLEX = textwrap.dedent('''
    import torch


    def rope(x, positions):  # Meta LLaMA: freqs_cis and view_as_complex, as in llama/model.py
        d = x.shape[-1]
        freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2)[: d // 2].float() / d))
        angles = positions.float()[..., None] * freqs
        freqs_cis = torch.polar(torch.ones_like(angles), angles)[:, :, None, :]
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * freqs_cis).flatten(3).type_as(x)
''')

TABLE = CORRECT + textwrap.dedent('''
    ROWS = 2**21  # a cos/sin table of max_position_embeddings rows
    _tables = {}


    def rope(x, positions):
        r = x.shape[-1]
        if r not in _tables:
            theta = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float32) / r)
            _tables[r] = torch.outer(torch.arange(ROWS, dtype=torch.float32), theta)
        angles = _tables[r][positions]  # IndexError past the table
        angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]
        return (x.float() * angles.cos() + rotate_half(x.float()) * angles.sin()).to(x.dtype)
''')


def write(tmp_path: Path, name: str, source: str, attr: str = "rope") -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return f"{path}:{attr}"


def with_rope(body: str) -> str:
    """CORRECT plus a ``rope`` built on correct_rope."""
    return CORRECT + textwrap.dedent(body)


def run_ropecheck(*args, cwd=ROOT, timeout=240, env=None):
    """The CLI as the ``ropecheck`` command runs it, in a subprocess."""
    environment = dict(os.environ, COLUMNS="250", PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ropecheck", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=environment)


# --- realistic layouts by default, exotic ones as a probe ------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_view_as_complex_passes_with_a_support_note(tmp_path, dtype):
    result = check(write(tmp_path, "meta", META_COMPLEX), "--layout", "interleaved", "--dtype", dtype, *FAST)
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output
    if dtype == "float32":  # x.float() copies a low-precision x into a fresh tensor
        assert "support notes" in result.output
        assert "raises on views with an odd row stride" in result.output
        assert "raises on views with an odd storage offset" in result.output


def test_strict_layouts_makes_a_refusal_fail(tmp_path):
    result = check(write(tmp_path, "meta", META_COMPLEX), "--layout", "interleaved", *FP32, *FAST,
                   "--property", "contract", "--strict-layouts")
    assert result.exit_code == 1, result.output
    assert failed(result.output, "contract", "float32")
    assert "stride divisible by 2" in result.output or "storage_offset divisible by 2" in result.output


@pytest.mark.parametrize("layout_test", [
    "x.stride(0) < x.stride(1)",  # (seq, batch, heads, head_dim) storage: Megatron's sbhd
    "x.stride(2) == x.shape[3] + 8",  # rows padded to head_dim + 8
], ids=["sbhd", "padded"])
def test_wrong_on_a_realistic_layout_fails_contract(tmp_path, layout_test):
    source = with_rope(f'''
        def rope(x, positions):
            y = correct_rope(x, positions)
            return -y if x.dim() == 4 and x.shape[0] > 1 and {layout_test} else y
    ''')
    result = check(write(tmp_path, "wrong_layout", source), "--layout", "half", *FP32, *FAST,
                   "--property", "contract")
    assert result.exit_code == 1, result.output
    assert failed(result.output, "contract", "float32")
    assert "differs from f on its contiguous copy" in result.output


def test_wrong_on_an_accepted_exotic_layout_fails(tmp_path):
    source = with_rope('''
        def rope(x, positions):
            y = correct_rope(x, positions)
            return -y if x.storage_offset() % 2 else y  # right unless the offset is odd
    ''')
    result = check(write(tmp_path, "odd_offset", source), "--layout", "half", *FP32, *FAST,
                   "--property", "contract")
    assert result.exit_code == 1, result.output
    assert "odd-offset" in result.output


# --- a declared position range -----------------------------------------------------------

def test_fixed_table_is_one_position_range_finding(tmp_path):
    path = tmp_path / "out.json"
    result = check(write(tmp_path, "table", TABLE), "--layout", "half", *FP32, *FAST, "--json", str(path))
    assert result.exit_code == 1, result.output
    assert "raises for positions >= 2097152" in result.output
    assert "declare --max-position 2097151" in result.output
    report = json.loads(path.read_text())
    statuses = {r["property"]: r["status"] for r in report["results"]}
    assert statuses.pop("position-range") == "failed"
    assert set(statuses.values()) == {"passed"}, statuses  # the rest judged inside the range


def test_a_target_that_raises_past_position_0_fails_there_and_everywhere(tmp_path):
    """Found on an H200 (a kernel mixing devices at every position > 0): a range too small
    for any table is a finding, not "internal error" from restricting the target to it;
    the properties then run over the whole range and fail with the same cause."""
    spec = write(tmp_path, "position_zero_only", with_rope('''
        def rope(x, positions):
            if int(positions.max()) > 0:
                raise RuntimeError("Expected all tensors to be on the same device")
            return correct_rope(x, positions)
    '''))
    result = check(spec, "--layout", "half", *FP32, *FAST)
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output
    assert "raises for positions >= 1" in result.output and "every property runs over the whole range" in result.output
    assert "ROOT CAUSE" in result.output and "Expected all tensors to be on the same device" in result.output


def test_fixed_table_passes_with_its_declared_range(tmp_path):
    result = check(write(tmp_path, "table", TABLE), "--layout", "half", *FP32, *FAST,
                   "--max-position", "2097151")
    assert result.exit_code == 0, result.output
    assert "positions 0 .. 2097151" in result.output


@pytest.mark.parametrize("table", ["positions % 4096", "positions.clamp(max=4095)"], ids=["wraps", "clamps"])
@pytest.mark.parametrize("declared", [(), ("--max-position", "2097151")], ids=["default", "declared"])
def test_wrapping_or_clamping_table_still_fails_reference(tmp_path, table, declared):
    source = with_rope(f'''
        def rope(x, positions):
            return correct_rope(x, {table})  # a 4096-row table that never raises
    ''')
    result = check(write(tmp_path, "table4096", source), "--layout", "half", *FP32, *FAST,
                   "--property", "reference", *declared)
    assert result.exit_code == 1, result.output
    assert failed(result.output, "reference", "float32")


def test_declared_range_bounds_every_input(tmp_path):
    source = with_rope('''
        def rope(x, positions):
            assert int(positions.max()) <= 4096, int(positions.max())
            return correct_rope(x, positions)
    ''')
    result = check(write(tmp_path, "small_range", source), "--layout", "half", *FP32, *FAST,
                   "--max-position", "4096")
    assert result.exit_code == 0, result.output


# --- crashes, exits, threads ---------------------------------------------------------------

CRASHERS = {
    "segfault": "import ctypes; ctypes.string_at(0)",
    "os_exit": "import os; os._exit(3)",
    "sys_exit": "import sys; sys.exit(0)",
}


@pytest.mark.parametrize("kind", list(CRASHERS))
def test_crashing_target_fails_with_its_input(tmp_path, kind):
    source = with_rope(f'''
        def rope(x, positions):
            if x.requires_grad:  # only in the gradient checks: the other checks stay green
                {CRASHERS[kind]}
            return correct_rope(x, positions)
    ''')
    out = tmp_path / "out.json"
    proc = run_ropecheck("check", write(tmp_path, kind, source), "--layout", "half", *FP32, *FAST,
                         "--json", str(out))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "Traceback" not in output and output.rstrip().endswith("FAILED")
    said = {"segfault": "crashed the process (SIGSEGV)", "os_exit": "ended the process (exit status 3",
            "sys_exit": "called sys.exit(0)"}[kind]
    assert said in output
    report = json.loads(out.read_text())
    statuses = {r["property"]: r["status"] for r in report["results"]}
    assert statuses["backward"] == statuses["inverse"] == "failed"
    assert statuses["reference"] == statuses["contract"] == "passed"  # the worker was replaced
    crash = next(r for r in report["results"] if r["property"] == "backward")
    assert said in crash["message"] and "shape" in crash["counterexample"]


def test_target_crashing_on_every_call(tmp_path):
    out = tmp_path / "out.json"
    proc = run_ropecheck("check", write(tmp_path, "always", "import os\n\ndef rope(x, positions):\n    os._exit(7)\n"),
                         "--layout", "half", *FP32, *FAST, "--json", str(out))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "ROOT CAUSE C1" in output and "exit status 7" in output
    assert json.loads(out.read_text())["verdict"] == "failed"



@pytest.mark.parametrize("args", [("check", "--profile", "no-such-profile"),
                                  ("check", "rotate-half", *FP32, *FAST, "--property", "identity")],
                         ids=["usage-error", "passing-run"])
def test_the_early_worker_leaves_nothing_behind(tmp_path, args):
    """``ropecheck check`` starts its worker before it knows whether the run gets that far;
    an exit before the target is loaded stops it, as the end of a run does."""
    proc = run_ropecheck(*args, env={"TMPDIR": str(tmp_path)})
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    assert list(tmp_path.glob("ropecheck-worker-*")) == []


@pytest.mark.parametrize("kind", ["none", "segfault", "os_exit"])
def test_position_builder_runs_in_the_worker(tmp_path, kind):
    """A position builder (--family mrope-builder) is a target like any other: its crash is
    a failure with the segments it was given, not the end of ropecheck."""
    crash = "" if kind == "none" else f"""
            if any(segment[0] == "video" for segment in segments):
                {CRASHERS[kind]}"""
    source = textwrap.dedent(f'''
        from ropecheck.reference.multimodal import reference_builder

        _reference, _ = reference_builder("mrope")


        def build_positions(segments):{crash}
            return _reference(segments)
    ''')
    out = tmp_path / "out.json"
    # two of its properties: each crash costs a new worker (the others run the same way)
    proc = run_ropecheck("check", write(tmp_path, f"builder_{kind}", source, "build_positions"),
                         "--family", "mrope-builder", *FAST, "--property", "contract", "--property", "reference",
                         "--json", str(out))
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output
    report = json.loads(out.read_text())
    if kind == "none":
        assert proc.returncode == 0 and report["verdict"] == "passed", output
        return
    assert proc.returncode == 1 and report["verdict"] == "failed", output
    said = {"segfault": "crashed the process (SIGSEGV)", "os_exit": "ended the process (exit status 3"}[kind]
    failures = [r for r in report["results"] if r["status"] == "failed"]
    assert failures and all(said in r["message"] and "video" in r["message"] for r in failures), failures

@pytest.mark.parametrize("mode", [(), ("--in-process",)], ids=["worker", "in-process"])
def test_lingering_thread_does_not_hold_the_verdict(tmp_path, mode):
    source = with_rope('''
        import threading, time


        def rope(x, positions):
            threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon
            return correct_rope(x, positions)
    ''')
    proc = run_ropecheck("check", write(tmp_path, "thread", source), "--layout", "half", *FP32, *FAST,
                         "--property", "identity", *mode, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("PASSED")


def test_in_process_sys_exit_is_a_finding(tmp_path):
    source = with_rope('''
        import sys


        def rope(x, positions):
            sys.exit(0)
    ''')
    result = check(write(tmp_path, "exits", source), "--layout", "half", *FP32, *FAST, "--in-process")
    assert result.exit_code == 1, result.output
    assert "called sys.exit(0)" in result.output


# --- what comes back ---------------------------------------------------------------------------

@pytest.mark.parametrize("returned, said", [
    ("None", "returned NoneType"),
    ("correct_rope(x, positions).numpy()", "returned ndarray"),
    ("(correct_rope(x, positions),)", "returned a tuple of 1"),
], ids=["none", "numpy", "tuple"])
def test_unusable_return_fails_contract(tmp_path, returned, said):
    source = with_rope(f'''
        def rope(x, positions):
            with torch.no_grad():
                return {returned}
    ''')
    result = check(write(tmp_path, "returns", source), "--layout", "half", *FP32, *FAST)
    assert result.exit_code == 1, result.output
    assert said in result.output and "ERROR" not in result.output
    assert failed(result.output, "contract", "float32")


def test_invertibility_noise_counts_only_the_rotated_features():
    """Distinctness of f(x, m) and f(x, m + k) is judged against the rounding noise of the
    rotated block: the features past a partial rotary dim are the same at m and m + k.
    Counting them failed transformers' correct Phi-3 LongRoPE (rotary 64 of a 256 head) in
    bfloat16; a partial-rotary target that ignores positions still fails."""
    from ropecheck.properties.checks import PROPERTIES
    from ropecheck.properties.runner import RunOptions, run_property
    from ropecheck.session.loading import load
    from ropecheck.targets.target import Target

    options = RunOptions(profile="ci")
    phi3 = load("hf-phi3-longrope")
    assert run_property(PROPERTIES["invertibility"], phi3, "bfloat16", options).status == "passed"
    frozen = Target(name="frozen", fn=lambda x, positions: phi3.fn(x, positions * 0),
                    convention=phi3.convention, rotary_dim=phi3.rotary_dim)
    assert run_property(PROPERTIES["invertibility"], frozen, "bfloat16", options).status == "failed"


def test_an_output_holding_nan_is_not_a_changed_output():
    """NaN != NaN: a previous output holding NaN (its input held inf) is unchanged when its
    bits are; only a real change is the aliasing finding."""
    import torch

    from ropecheck.calling.execution import Execution

    buffer = torch.zeros(1, 1, 1, 4)

    def returns_its_buffer(x, positions):
        buffer.copy_(x * 0 + x)  # inf * 0 is NaN
        return buffer

    fresh = Execution(lambda x, positions: x * 0 + x)
    shared = Execution(returns_its_buffer)
    nan_input, other = torch.full((1, 1, 1, 4), float("inf")), torch.ones(1, 1, 1, 4)
    positions = torch.zeros(1, 1, dtype=torch.int64)
    for execution, aliased in ((fresh, False), (shared, True)):
        execution.call((nan_input,), positions)
        violations = execution.call((other,), positions).violations
        assert any(kind == "aliased" for kind, _ in violations) is aliased, violations


def test_statelessness_example_keeps_to_the_other_dtypes_magnitudes():
    """The explicit distractor of statelessness is the case in another dtype: at float16 it
    must not carry the 1e5 scale float16 cannot hold (an input no model produces)."""
    from ropecheck.properties.inputs.cases import Case
    from ropecheck.properties.checks import PROPERTIES, Context
    from ropecheck.properties.inputs.strategies import scales
    from ropecheck.targets.builtins import builtin

    target = builtin("rotate-half").with_(dtypes=("float32", "float16"))
    ctx = Context(target=target, dtype="float32")
    case = Case("float32", 1, 2, 1, 8, ((0, 1),), "contiguous", 1e5, 0)
    other = PROPERTIES["statelessness"].example_extras(ctx, case)["other"]
    assert other.dtype == "float16" and other.scale <= max(scales("float16"))
    assert other.positions_array().min() > 1  # later positions


@pytest.mark.parametrize("change, said", [
    ("torch.set_default_dtype(torch.float64)", "default dtype"),
    ("torch.set_grad_enabled(False)", "grad mode"),
    ("torch.manual_seed(0)", "random generator state"),
], ids=["default-dtype", "grad-mode", "rng"])
def test_state_changing_target_is_a_contract_finding(tmp_path, change, said):
    source = with_rope(f'''
        def rope(x, positions):
            {change}
            return correct_rope(x, positions)
    ''')
    result = check(write(tmp_path, "state", source), "--layout", "half", *FP32, *FAST,
                   "--property", "contract", "--property", "reference")
    assert result.exit_code == 1, result.output
    assert f"the target changed torch's {said}" in result.output
    assert failed(result.output, "contract", "float32")
    assert not failed(result.output, "reference", "float32")  # restored: values are still judged


def test_grad_mode_switched_off_is_not_called_missing_backward(tmp_path):
    source = with_rope('''
        def rope(x, positions):
            torch.set_grad_enabled(False)
            return correct_rope(x, positions)
    ''')
    result = check(write(tmp_path, "grad_off", source), "--layout", "half", *FP32, *FAST,
                   "--property", "backward")
    assert result.exit_code == 1, result.output
    assert "switched grad mode off" in result.output
    assert "declare --no-backward" not in result.output


# the right gradient, written into grad_output's memory
WRITES_GRAD = with_rope('''
    class _Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, positions):
            ctx.save_for_backward(positions)
            return correct_rope(x, positions)

        @staticmethod
        def backward(ctx, g):
            (positions,) = ctx.saved_tensors
            g.copy_(correct_rope(g, -positions))
            return g, None


    def rope(x, positions):
        return _Rope.apply(x, positions)
''')


def test_backward_writing_into_grad_output_is_its_own_finding(tmp_path):
    result = check(write(tmp_path, "writes_grad", WRITES_GRAD), "--layout", "half", *FP32, *FAST,
                   "--property", "backward", "--property", "inverse")
    assert result.exit_code == 1, result.output
    assert "backward wrote into grad_output" in result.output
    assert "outside the bound" not in result.output  # not reported as a wrong value


def test_a_failing_verdict_does_not_hang_on_how_busy_the_machine_is(tmp_path, monkeypatch):
    """Hypothesis, asked for every distinct bug, goes on drawing after the first failure
    for up to 10 s of wall time, so how many inputs it drew (and so where shrinking
    started) hung on the machine's load; under load the test above was once reported for
    the raise of a broadcast gradient instead of its grad_output write. ropecheck reports
    one failure per property: hypothesis stops drawing at the first. Here every reading of
    hypothesis' clock is 6 s later than the last (before: 24 inputs instead of 28)."""
    import time
    import types

    from hypothesis.internal.conjecture import engine

    target = write(tmp_path, "writes_grad", WRITES_GRAD)

    def verdict(name):
        record = tmp_path / f"{name}.json"
        result = check(target, "--layout", "half", *FP32, *FAST, "--property", "backward", "--json", str(record))
        assert result.exit_code == 1, result.output
        return [(r["property"], r["message"], r["counterexample"], r["examples"])
                for r in json.loads(record.read_text())["results"]]

    idle = verdict("idle")
    late = [0.0]

    def busy_clock():
        late[0] += 6.0
        return time.monotonic() + late[0]

    monkeypatch.setattr(engine, "time", types.SimpleNamespace(monotonic=busy_clock, perf_counter=time.perf_counter))
    assert verdict("busy") == idle


def test_a_verdict_does_not_hang_on_what_else_the_process_imported(tmp_path):
    """Hypothesis draws some values from the literals of every local module loaded in the
    process; ropecheck's runs draw from the seed alone, so a module full of numbers (as
    another kernel or a user's own code may be) leaves every input the target is called
    with as it was (before, 4 of 19 calls changed)."""
    import importlib

    calls = tmp_path / "calls.txt"
    target = write(tmp_path, "seen", CORRECT + textwrap.dedent(f'''

        def rope(x, positions):
            with open({str(calls)!r}, "a") as log:
                log.write(f"{{tuple(x.shape)}} {{positions.tolist()}}\\n")
            return correct_rope(x, positions)
    '''))

    def called_with():
        calls.write_text("")
        result = check(target, "--layout", "half", *FP32, *FAST, "--property", "reference")
        assert result.exit_code == 0, result.output
        return calls.read_text().splitlines()

    before = called_with()
    (tmp_path / "numbers_elsewhere.py").write_text(f"NUMBERS = {tuple(range(1001, 60000, 997))}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        importlib.import_module("numbers_elsewhere")
        assert called_with() == before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("numbers_elsewhere", None)


@pytest.mark.parametrize("layout", ["expanded-head", "expanded-feature"])
def test_a_broadcast_gradient_reaches_the_backward_as_a_broadcast(layout):
    """The private copy of a stride-0 gradient keeps its strides (the backward sees what
    autograd would hand it), and a backward that zeroes it (zero_ works on overlapping
    memory, where copy_ and mul_ raise) is still the grad_output finding."""
    import torch

    from ropecheck.properties.inputs.cases import Case
    from ropecheck.calling.execution import Execution

    seen = []

    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, positions):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            seen.append(g.stride())
            out = g.clone()
            g.zero_()  # scratch memory: the incoming gradient is the caller's
            return out, None

    case = Case("float32", 2, 3, 2, 8, ((0, 1, 2), (3, 4, 5)))
    g, x = case.tensor(1, memory=layout), case.tensor(0)
    assert 0 in g.stride()
    outcome = Execution(Rope.apply).vjp((x,), case.positions_tensor(), (g,))
    assert seen == [g.stride()]
    (kind, message), = outcome.violations
    assert kind == "grad-output" and "backward wrote into grad_output" in message
    assert torch.equal(outcome.outputs[1], g)  # the gradient itself was right: a copy of g


# --- say what is wrong, and how badly ------------------------------------------------------------

def test_message_and_counterexample_describe_the_same_failure(tmp_path):
    source = with_rope('''
        def rope(x, positions):
            y = correct_rope(x, positions)
            if int(positions.max()) > 1000:
                return torch.full_like(y, float("nan"))  # one failure: NaN at large positions
            return -y if x.shape[-1] == 80 else y  # another: wrong values on head_dim 80
    ''')
    from ropecheck.properties.checks import PROPERTIES
    from ropecheck.properties.runner import RunOptions, run_property
    from ropecheck.session.loading import load

    target = load(write(tmp_path, "two_failures", source))
    target = target.with_(convention=__import__("ropecheck.target", fromlist=["Convention"]).Convention("half"))
    for seed in range(4):
        result = run_property(PROPERTIES["reference"], target, "float32",
                              RunOptions(profile="dev", max_examples=60, seed=seed))
        assert result.status == "failed"
        positions = [int(p) for p in __import__("re").findall(r"-?\d+", result.counterexample.split("positions [")[1].split("]")[0])]
        if "non-finite" in result.message:
            assert max(positions) > 1000, (result.message, result.counterexample)
        else:
            assert "outside the bound" in result.message
            assert ", 80)" in result.counterexample.split(" float32")[0], result.counterexample


def test_table_cell_shows_the_largest_error_seen(tmp_path):
    """An error that grows with the position: the shrunk counterexample is barely over the
    bound, the run (the accuracy sweep to 2^24 included) saw far more; the result keeps the
    largest."""
    source = with_rope('''
        def rope(x, positions):
            drift = 1e-9 * positions.to(torch.float32)[:, :, None, None]  # absolute, grows with m
            return (correct_rope(x, positions).float() + drift).to(x.dtype)
    ''')
    from ropecheck.properties.checks import PROPERTIES
    from ropecheck.properties.runner import RunOptions, run_property
    from ropecheck.session.loading import load
    from ropecheck.targets.target import Convention

    target = load(write(tmp_path, "drifts", source)).with_(convention=Convention("half"))
    result = run_property(PROPERTIES["reference"], target, "float32", RunOptions(profile="ci", max_examples=20))
    assert result.status == "failed"
    shrunk = float(re.search(r"\(([0-9.e+]+) x tolerance\)", result.message).group(1))
    assert result.max_error >= max(result.accuracy["error"])
    assert result.max_error > 10 * shrunk, (result.max_error, shrunk)


# --- every exit leaves its record, every hint is true ----------------------------------------------

def test_records_are_written_on_exit_2(tmp_path):
    out, xml = tmp_path / "out.json", tmp_path / "out.xml"
    result = check(f"{tmp_path / 'missing.py'}:rope", *FP32, *FAST, "--json", str(out), "--junit", str(xml))
    assert result.exit_code == 2
    record = json.loads(out.read_text())
    assert record["schema_version"] == 2 and record["exit_status"] == 2
    assert "no such file" in record["reason"] and record["results"] == []
    assert "no such file" in ET.parse(xml).getroot().find(".//error").get("message")


def test_records_are_written_on_a_usage_error(tmp_path):
    out = tmp_path / "out.json"
    result = check("--profile", "no-such-profile", "--json", str(out))
    assert result.exit_code == 2
    assert "usage error" in json.loads(out.read_text())["reason"]


def test_a_directory_is_not_called_a_missing_file(tmp_path):
    (tmp_path / "kernels").mkdir()
    result = check(f"{tmp_path / 'kernels'}/:rope", *FP32, *FAST)
    assert result.exit_code == 2
    assert "is a directory" in result.output and "no such file" not in result.output


def test_refused_dtype_is_named_in_verdict_json_and_junit(tmp_path):
    source = with_rope('''
        def rope(x, positions):
            if x.dtype == torch.bfloat16:
                raise ValueError("bfloat16 is not supported by this kernel")
            return correct_rope(x, positions)
    ''')
    out, xml = tmp_path / "out.json", tmp_path / "out.xml"
    result = check(write(tmp_path, "no_bf16", source), "--layout", "half", *FAST, "--property", "identity",
                   "--json", str(out), "--junit", str(xml))
    assert result.exit_code == 0, result.output
    verdict = result.output.rstrip().splitlines()[-1]
    assert verdict.startswith("PASSED; bfloat16 not supported: raises ValueError" ) or \
        verdict.startswith("PASSED; bfloat16 not supported:"), verdict
    assert "ValueError" in verdict
    assert "bfloat16" in json.loads(out.read_text())["unsupported_dtypes"]
    skipped = [c for c in ET.parse(xml).getroot().iter("testcase") if c.get("name") == "dtype[bfloat16]"]
    assert skipped and skipped[0].find("skipped") is not None


PACKAGE_TARGET = "from mykernels.rope import rope\n"
PACKAGE_ROPE = CORRECT + "\nrope = correct_rope\n"


@pytest.mark.parametrize("front_door", ["ropecheck", "pytest"])
def test_target_file_importing_its_own_package(tmp_path, front_door):
    (tmp_path / "mykernels").mkdir()
    (tmp_path / "mykernels" / "__init__.py").write_text("")
    (tmp_path / "mykernels" / "rope.py").write_text(PACKAGE_ROPE)
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "target.py").write_text(PACKAGE_TARGET)
    spec = "checks/target.py:rope"
    # launchers in a bin/ folder, as the installed scripts are: their sys.path[0] is bin/,
    # not the project's root
    (tmp_path / "bin").mkdir()
    if front_door == "ropecheck":
        launcher = "from ropecheck.cli import entry\nentry()\n"
        args = ["check", spec, "--layout", "half", *FP32, *FAST, "--property", "identity"]
    else:
        launcher = "import sys\nimport pytest\nsys.exit(pytest.main())\n"
        args = ["-q", "-p", "no:cacheprovider", "--pyargs", "ropecheck.properties", "--rope-target", spec,
                "--rope-layout", "half", "--rope-dtype", "float32", "--rope-profile", "ci",
                "--rope-max-examples", "5", "-k", "identity"]
    (tmp_path / "bin" / front_door).write_text(launcher)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(tmp_path / "bin" / front_door), *args], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pytest_plugin_declares_the_position_range(tmp_path):
    spec = write(tmp_path, "small_range", with_rope('''
        def rope(x, positions):
            if int(positions.max()) > 4096:
                raise IndexError(f"position {int(positions.max())} past the 4097-row table")
            return correct_rope(x, positions)
    '''))
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "ropecheck.properties",
            "--rope-target", spec, "--rope-layout", "half", "--rope-dtype", "float32",
            "--rope-profile", "ci", "--rope-max-examples", "5", "-k", "position_range or reference"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    undeclared = subprocess.run(base, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert undeclared.returncode == 1, undeclared.stdout
    assert "raises for positions >= 4097" in undeclared.stdout
    assert "1 failed, 1 passed" in undeclared.stdout  # reference runs inside the range found
    declared = subprocess.run(base + ["--rope-max-position", "4096"], capture_output=True, text=True,
                              timeout=240, cwd=tmp_path, env=env)
    assert declared.returncode == 0, declared.stdout


@pytest.mark.parametrize("family", [
    ("--family", "axial", "--axes", "2", "--layout", "half"),
    ("--family", "xpos"),
], ids=["axial", "xpos"])
def test_families_keep_to_the_declared_range(tmp_path, family):
    axial = family[1] == "axial"
    source = textwrap.dedent(f'''
        import torch
        from ropecheck.reference import nd
        from ropecheck.reference.relatives import apply_xpos

        def rope({"x, positions" if axial else "q, k, positions"}):
            assert int(positions.max()) <= 300, int(positions.max())
            {"conv = nd.axial(x.shape[-1], 2, layout='half')" if axial else ""}
            {"return torch.from_numpy(conv.apply(x.double().numpy(), positions.numpy())).to(x.dtype)" if axial else
             "return tuple(torch.from_numpy(apply_xpos(t.double().numpy(), positions.numpy(), role=r)).to(t.dtype) for t, r in ((q, 'query'), (k, 'key')))"}
    ''')
    # numpy inside, no autograd: --no-backward
    result = check(write(tmp_path, "range_nd", source), *family, *FP32, *FAST, "--max-position", "300",
                   "--no-backward")
    assert result.exit_code == 0, result.output


def test_in_process_hang_that_swallows_the_interrupt_is_named_so(tmp_path):
    source = "import time\n\n\ndef rope(x, positions):\n    while True:\n        try:\n            time.sleep(100)\n" \
             "        except BaseException:\n            pass\n"
    out = tmp_path / "out.json"
    proc = run_ropecheck("check", write(tmp_path, "swallows", source), "--layout", "half", *FP32, *FAST,
                         "--timeout", "1", "--in-process", "--json", str(out), timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "caught the interrupt and went on" in output and "native code" not in output
    assert json.loads(out.read_text())["exit_status"] == 2
