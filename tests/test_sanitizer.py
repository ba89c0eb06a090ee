"""ropecheck.calling.sanitizer: compute-sanitizer's command line around a worker, whether it can
run here, and the parser of its reports (on the samples in tests/data/sanitizer/, written
in the documented formats: see that folder's README); and the two planted kernels of
tests/gpu_kernels.py, numerically right and memory-unsafe.

No GPU here: the sanitizer itself never runs in these tests. ``wrap`` is run through a
stand-in executable that checks the option list and runs what follows ``--``."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ropecheck.calling import sanitizer, sanitizer_reports
from ropecheck.kernels.triton_env import triton_missing

DATA = Path(__file__).parent / "data" / "sanitizer"


def sample(name: str) -> str:
    return (DATA / f"{name}.txt").read_text()


# ---------------------------------------------------------------- wrap / available


def test_wrap_memcheck_puts_the_sanitizer_before_the_worker():
    argv = [sys.executable, "-c", "print('worker')"]
    wrapped = sanitizer.wrap(argv, log_file="/tmp/san-%p.log", executable="/opt/cs")
    assert wrapped[0] == "/opt/cs"
    assert wrapped[-4:] == ["--"] + argv, "the worker's argv follows '--', unchanged"
    options = wrapped[1:wrapped.index("--")]
    pairs = dict(zip(options[::2], options[1::2]))
    assert pairs == {"--tool": "memcheck", "--print-limit": str(sanitizer.PRINT_LIMIT),
                     "--error-exitcode": str(sanitizer.ERROR_EXITCODE),
                     "--target-processes": "all", "--require-cuda-init": "no", "--show-backtrace": "no",
                     "--padding": str(sanitizer.PADDING), "--log-file": "/tmp/san-%p.log"}


@pytest.mark.parametrize("tool", ["racecheck", "initcheck", "synccheck"])
def test_wrap_other_tools(tool):
    wrapped = sanitizer.wrap(["python", "-c", "0"], tool, print_limit=0, error_exitcode=3,
                             extra=("--kernel-name", "regex:rope"), executable="cs")
    options = wrapped[1:wrapped.index("--")]
    assert options[:2] == ["--tool", tool]
    assert "--padding" not in options, "padding is memcheck's"
    assert ("--racecheck-report" in options) == (tool == "racecheck")
    assert options[options.index("--print-limit") + 1] == "0"
    assert options[options.index("--error-exitcode") + 1] == "3"
    assert options[-2:] == ["--kernel-name", "regex:rope"]
    assert "--log-file" not in options


@pytest.mark.parametrize("bad", [dict(tool="asan"), dict(argv=[]), dict(print_limit=-1),
                                 dict(tool="racecheck", padding=32)])
def test_wrap_refuses(bad):
    argv = bad.pop("argv", ["python"])
    with pytest.raises(ValueError):
        sanitizer.wrap(argv, **bad)


def test_wrapped_command_runs_the_worker(tmp_path):
    """Through a stand-in compute-sanitizer that checks the options it gets and runs what
    follows '--': the worker runs with its own argv and the worker's exit status comes back."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        "seen=()\n"
        "while [ \"$1\" != -- ]; do seen+=(\"$1\"); shift; done; shift\n"
        "[ \"${seen[0]} ${seen[1]}\" = '--tool memcheck' ] || exit 97\n"
        "exec \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    code = "import sys; print('worker ran', sys.argv[1:]); sys.exit(7)"
    wrapped = sanitizer.wrap([sys.executable, "-c", code, "--looks-like-an-option"],
                             executable=str(fake))
    done = subprocess.run(wrapped, capture_output=True, text=True, env=sanitizer.environment())
    assert done.returncode == 7, done.stderr
    assert "worker ran ['--looks-like-an-option']" in done.stdout
    broken = [str(fake), "--tool", "racecheck", "--", sys.executable, "-c", "0"]
    assert subprocess.run(broken).returncode == 97, "the stand-in checks what it is given"


def test_environment_turns_the_caching_allocator_off():
    env = sanitizer.environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" in sanitizer.environment()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reason given where there is no CUDA")
def test_available_says_why_not_without_cuda():
    why = sanitizer.available()
    assert why is not None and "no CUDA device" in why


def test_available_looks_for_the_executable(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("COMPUTE_SANITIZER", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    if sanitizer.find_executable() is not None:
        pytest.skip("this machine has a CUDA toolkit's compute-sanitizer at its usual place")
    assert "not on the PATH" in sanitizer.available()
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert sanitizer.available() is None
    assert sanitizer.find_executable() == str(fake)
    monkeypatch.setenv("COMPUTE_SANITIZER", str(tmp_path / "absent"))
    assert sanitizer.find_executable() is None


# ---------------------------------------------------------------- parse


def test_memcheck_past_row_read():
    reports = sanitizer_reports.parse(sample("memcheck_past_row_read"))
    assert len(reports) == 2 == sanitizer_reports.error_summary(sample("memcheck_past_row_read"))
    first = reports[0]
    assert (first.tool, first.kind, first.access, first.space, first.size) == (
        "memcheck", "out-of-bounds", "read", "global", 2)
    assert (first.kernel, first.offset, first.location) == (
        "_past_row_read_kernel", "0x3b0", "gpu_kernels.py:83")
    assert (first.thread, first.block, first.address) == ((64, 0, 0), (41, 0, 0), "0x7f2a1c000a00")
    assert first.allocation == "is 0 bytes after the nearest allocation at 0x7f2a1c000000 of size 2,560 bytes"
    assert "\n" not in first.message and "out of bounds" in first.message
    assert "_past_row_read_kernel (gpu_kernels.py:83)" in first.message
    (finding,) = sanitizer_reports.findings(reports)
    assert finding.count == 2 and finding.first is first
    assert finding.message.endswith("(and 1 more like it)")


def test_memcheck_captured_on_an_h100():
    """The real thing (see tests/data/sanitizer/README.md): the out-of-bounds reads are one
    finding with its kernel and line, the faulted context's API errors follow."""
    text = sample("h100_memcheck_past_row_read")
    reports = sanitizer_reports.parse(text, "memcheck")
    assert len(reports) == 4 == sanitizer_reports.error_summary(text)
    assert [r.kind for r in reports] == ["out-of-bounds", "out-of-bounds", "api-error", "api-error"]
    assert (reports[0].access, reports[0].size, reports[0].kernel, reports[0].location) == (
        "read", 2, "_past_row_read_kernel", "gpu_kernels.py:80")
    found = sanitizer_reports.findings(reports)
    assert found[0].count == 2 and "is 1 bytes after the nearest allocation" in found[0].message
    said = sanitizer_reports.said(found)  # the faulted context's API errors counted, the first shown
    assert said.startswith("Invalid __global__ read of size 2 bytes; in _past_row_read_kernel")
    assert said.endswith("; then 2 CUDA API errors (the first: Program hit cudaErrorLaunchFailure (error 719) "
                         "due to \"unspecified launch failure\" on CUDA API call to cudaFree.)")


def test_memcheck_past_head_store_and_api_error():
    reports = sanitizer_reports.parse(sample("memcheck_past_head_store"))
    assert [r.kind for r in reports] == ["out-of-bounds", "out-of-bounds", "api-error"]
    assert [(r.access, r.size) for r in reports[:2]] == [("write", 4), ("write", 4)]
    assert reports[1].thread == (102, 0, 0) and "4 bytes after" in reports[1].allocation
    assert reports[2].other == ("cuStreamSynchronize",) and "error 719" in reports[2].message
    assert [f.count for f in sanitizer_reports.findings(reports)] == [2, 1]
    assert sanitizer_reports.error_summary(sample("memcheck_past_head_store")) == 3


def test_memcheck_misaligned_shared_legacy_and_leak():
    reports = sanitizer_reports.parse(sample("memcheck_misaligned_legacy"))
    assert [r.kind for r in reports] == ["misaligned", "out-of-bounds", "out-of-bounds", "leak"]
    misaligned, shared, legacy, leak = reports
    assert (misaligned.kernel, misaligned.offset, misaligned.location) == ("unaligned_rope", "0x50", None)
    assert "inside the nearest allocation" in misaligned.allocation
    assert (shared.space, shared.size, shared.kernel, shared.location) == (
        "shared", 16, "tile_rope", "tile_rope.cu:57")
    assert (legacy.size, legacy.kernel, legacy.offset) == (8, "rotate_pairs", "0x000000c8")
    assert (leak.size, leak.address) == (1024, "0x7a10c2800000")


def test_racecheck_analysis():
    reports = sanitizer_reports.parse(sample("racecheck_analysis"))
    assert [r.kind for r in reports] == ["race"] * 3
    assert all(r.tool == "racecheck" and r.space == "shared" for r in reports)
    one_line, split, three = reports
    assert (one_line.access, one_line.kernel, one_line.location, one_line.hazards) == (
        "write", "stage_tile", "stage_tile.cu:41", 508)
    assert one_line.other == ("read access at stage_tile+0x100 (stage_tile.cu:51)",)
    assert (split.kernel, split.offset, split.location, split.hazards) == (
        "reduce_pairs", "0xb0", "reduce_pairs.cu:28", 1024)
    assert split.other == ("read access at reduce_pairs+0xc0 (reduce_pairs.cu:30)",)
    assert (three.access, three.kernel, three.location, three.hazards) == (
        "read", "warp_sum", "./warp_sum.cu:4", 8)
    assert len(three.other) == 2
    assert sanitizer_reports.error_summary(sample("racecheck_analysis")) == 3


def test_racecheck_hazards():
    raw, waw = sanitizer_reports.parse(sample("racecheck_hazard"))
    assert (raw.kind, raw.hazard, raw.address, raw.block, raw.thread, raw.access) == (
        "hazard", "RAW", "0x8c", (0, 0, 0), (35, 0, 0), "write")
    assert raw.other == ("read by thread (32, 0, 0)",)
    assert (waw.hazard, waw.block, waw.location) == ("WAW", (1, 0, 0), "stage_tile.cu:20")


def test_initcheck_and_synccheck():
    reports = sanitizer_reports.parse(sample("initcheck"))
    assert [(r.tool, r.kind, r.access, r.size) for r in reports] == [
        ("initcheck", "uninitialized", "read", 4)] * 2
    assert reports[0].address == "0x7f3c7ec000fc"
    (finding,) = sanitizer_reports.findings(reports)
    assert finding.count == 2
    (barrier,) = sanitizer_reports.parse(sample("synccheck"))
    assert (barrier.tool, barrier.kind, barrier.kernel, barrier.thread) == (
        "synccheck", "barrier", "tile_rope", (16, 0, 0))


def test_clean_run():
    assert sanitizer_reports.parse(sample("clean")) == []
    assert sanitizer_reports.error_summary(sample("clean")) == 0


def test_tool_given_overrides_and_is_checked():
    reports = sanitizer_reports.parse(sample("memcheck_past_row_read"), tool="initcheck")
    assert {r.tool for r in reports} == {"initcheck"}
    with pytest.raises(ValueError):
        sanitizer_reports.parse("", tool="valgrind")


def test_broken_or_foreign_text_gives_no_reports():
    """The parser reads the sanitizer's prefixed lines only: the same words in the
    program's own output, a truncated log, or a changed report are not taken for errors."""
    text = sample("memcheck_past_row_read")
    unprefixed = "\n".join(line.lstrip("= ") for line in text.splitlines())
    assert sanitizer_reports.parse(unprefixed) == [] and sanitizer_reports.error_summary(unprefixed) is None
    truncated = text[:text.index("Invalid")]
    assert sanitizer_reports.parse(truncated) == [] and sanitizer_reports.error_summary(truncated) is None
    changed = sanitizer_reports.parse(text.replace("is out of bounds", "is misaligned"))
    assert [r.kind for r in changed] == ["misaligned", "misaligned"]
    reads_as_writes = sanitizer_reports.parse(text.replace("read of size 2", "write of size 16"))
    assert [(r.access, r.size) for r in reads_as_writes] == [("write", 16)] * 2


def test_read_log(tmp_path):
    log = tmp_path / "memcheck.log"
    log.write_text(sample("memcheck_past_head_store"))
    assert len(sanitizer_reports.read_log(str(log))) == 3
    assert sanitizer_reports.read_log(str(tmp_path / "absent.log")) == []


# ---------------------------------------------------------------- the planted kernels

requires_triton = pytest.mark.skipif(triton_missing() is not None, reason=str(triton_missing()))


@pytest.fixture(scope="module")
def planted():
    from tests import gpu_kernels

    return gpu_kernels


def _reference(x, positions):
    from ropecheck.target import Convention

    return Convention("half", 10000.0, None).apply(x.double().cpu().numpy(), positions.cpu().numpy())


@requires_triton
@pytest.mark.parametrize("name", ["past_row_read", "past_head_store"])
@pytest.mark.parametrize("shape", [(2, 5, 3, 80), (1, 3, 2, 8), (2, 4, 1, 12)])
def test_planted_kernels_are_numerically_right(planted, name, shape):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=generator).transpose(1, 2).contiguous().transpose(1, 2)
    positions = torch.randint(0, 200, shape[:2], generator=generator)
    y = getattr(planted, name)(x, positions)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert np.abs(y.double().numpy() - _reference(x, positions)).max() < 1e-4
    g = torch.randn(*shape, generator=generator)
    x.requires_grad_(True)
    (getattr(planted, name)(x, positions) * g).sum().backward()
    # the VJP of a rotation by m is the rotation by -m
    assert np.abs(x.grad.double().numpy() - _reference(g, -positions)).max() < 1e-4


@requires_triton
@pytest.mark.parametrize("head_dim, stray", [(80, 24), (12, 2), (8, 0), (128, 0)])
def test_past_head_store_writes_past_its_output(planted, head_dim, stray):
    """The planted store: at a head size whose pair count is not a power of two it writes
    (BLOCK_P - n_pairs) elements past the output's last head; never otherwise."""
    x = torch.randn(2, 3, 2, head_dim)
    positions = torch.arange(6).reshape(2, 3)
    buffer = torch.full((x.numel() + 64,), float("nan"))
    out = planted._launch("past_head_store", x, positions, 1.0, buffer=buffer)
    assert torch.isfinite(out).all()
    past = buffer[x.numel():]
    assert (past[:stray] == 0).all() and torch.isnan(past[stray:]).all()


# ---------------------------------------------------------------- the worker under the sanitizer

PLANTED = '''
import os


def rope(x, positions):  # numerically right; "reads past its row", as a memcheck report says
    with open(os.environ["FAKE_SANITIZER_LOG"], "a") as log:
        log.write(REPORT)
    return x.clone()


def clean(x, positions):
    return x.clone()


def dies(x, positions):  # the kernel faults: CUDA's context is lost and the process ends
    with open(os.environ["FAKE_SANITIZER_LOG"], "a") as log:
        log.write(REPORT)
    os._exit(86)  # compute-sanitizer's --error-exitcode replaces the status of a program it saw err
'''
STAND_IN = """#!/usr/bin/env bash
while [ "$1" != -- ]; do [ "$1" = --log-file ] && export FAKE_SANITIZER_LOG=$2; shift; done; shift
exec "$@"
"""


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """The planted targets' file, with compute-sanitizer's stand-in on $COMPUTE_SANITIZER."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(STAND_IN)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COMPUTE_SANITIZER", str(fake))
    kernel = tmp_path / "planted.py"
    kernel.write_text(PLANTED + f"\nREPORT = {sample('memcheck_past_row_read')!r}\n")
    return kernel


def test_a_report_during_a_call_is_that_call_s_finding(kernel):
    """The worker runs under the sanitizer (a stand-in that exports its --log-file's path
    and runs the worker); a report written during a call makes that call a contract
    breach of kind "sanitizer", naming the kernel and the access; a call without one is
    clean."""
    from ropecheck.properties.core.contract import CallError
    from ropecheck.session.loading import load

    x, p = torch.randn(1, 2, 1, 8), torch.zeros(1, 2, dtype=torch.int64)
    clean = load(f"{kernel}:clean", worker=True, sanitize="memcheck")
    try:
        assert torch.equal(clean.caller()(x, p), x)
    finally:
        clean.close()
    planted = load(f"{kernel}:rope", worker=True, sanitize="memcheck")
    try:
        with pytest.raises(CallError) as raised:
            planted.caller()(x, p)
    finally:
        planted.close()
    assert raised.value.kind == "sanitizer"
    message = str(raised.value)
    assert "compute-sanitizer memcheck" in message and "_past_row_read_kernel" in message
    assert "read of size 2" in message and "and 1 more like it" in message


def test_a_report_before_the_process_ends_is_the_cause_of_the_crash(kernel):
    """On an H100 a planted kernel's bad read left CUDA's context unusable and the worker
    ended; compute-sanitizer exited with its error status. The report it wrote is that
    call's finding, named before the crash (it was lost with the log and the check said
    only 'exit status 86')."""
    from ropecheck.properties.core.contract import CallError
    from ropecheck.session.loading import load

    planted = load(f"{kernel}:dies", worker=True, sanitize="memcheck")
    try:
        with pytest.raises(CallError) as raised:
            planted.caller()(torch.randn(1, 2, 1, 8), torch.zeros(1, 2, dtype=torch.int64))
    finally:
        planted.close()
    message = str(raised.value)
    assert raised.value.kind == "crashed"
    assert message.startswith("compute-sanitizer memcheck:") and "_past_row_read_kernel" in message
    assert "which found errors (its error exit status 86)" in message


def test_sanitize_without_cuda_or_a_device_is_exit_2_with_the_reason():
    from click.testing import CliRunner

    from ropecheck.cli import main

    result = CliRunner().invoke(main, ["check", "--sanitize", "--dtype", "float32"])
    assert result.exit_code == 2 and "give --device cuda" in result.output
    if not torch.cuda.is_available():
        result = CliRunner().invoke(main, ["check", "--sanitize", "--device", "cuda", "--dtype", "float32"])
        assert result.exit_code == 2 and "no CUDA device here" in result.output
    result = CliRunner().invoke(main, ["check", "--sanitize", "--in-process", "--dtype", "float32"])
    assert result.exit_code == 2 and "cannot run a target called in this process" in result.output
