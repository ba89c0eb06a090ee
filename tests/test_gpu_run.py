"""ci/gpu-run.sh rehearsed on CPU: every step of the GPU run, at the smallest size
(``--rehearse --quick``: one target, its reference property, two examples, float32,
eager, the Triton interpreter, the sanitizer step on recorded sample reports), must
produce every file the GPU run produces, and the summary must say which steps passed.

The rehearsal took 25 s on this repository's 2-core machine with little else running and
40 s beside other work (load average 6); the whole file 36 to 56 s. The GPU run itself
cannot be tested here: docs/gpu.md says how it is made."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from ropecheck.kernels.triton_env import triton_missing

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "ci" / "gpu-run.sh"
STEPS = ["install", "envelope", "kernel-tests", "presets", "aot", "sanitize-past_row_read", "sanitize-triton",
         "bench", "bench-compiled", "check-triton-eager", "checks-eager", "report"]
BUDGET = 540  # the GPU run's default budget: one device call of at most 9 minutes
FILES = ["summary.md", "steps.tsv", "commands.tsv", "envelope.json", "REHEARSAL", "aot.json",
         "kernel-tests.xml", "checks/triton-eager.json", "checks/triton-eager.xml", "checks/preset-vllm.json",
         "sanitizer/past_row_read.json", "sanitizer/past_row_read.memcheck.log",
         "sanitizer/triton.json", "bench/benchmark-main.json", "bench/benchmark-compiled.json",
         "bench/benchmarks.md",
         "docs/report-gpu/report.md", "docs/report-gpu/report.json", "docs/report-gpu/benchmarks.md",
         "docs/report-gpu/aot.md", "docs/report-gpu/commands.md", "gpu-run.tar.gz"]


def run(out: Path, *args: str, env: dict = None) -> subprocess.CompletedProcess:
    environment = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", str(SCRIPT), *args, str(out)], cwd=ROOT, capture_output=True,
                          text=True, env=environment, timeout=600)


def summary_statuses(out: Path) -> dict:
    """step -> status, read from summary.md's table."""
    rows = re.findall(r"^\| (\S+) \| (\w+) \| (\d+) \|", (out / "summary.md").read_text(), re.M)
    return {step: status for step, status, _ in rows}


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The rehearsal, made once per test run: under pytest-xdist the workers share the base
    temporary folder, and the first to take the lock makes it for all."""
    if triton_missing():
        pytest.skip(triton_missing())
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / "gpu-run-rehearsal"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared / "lock")):
        record = shared / "done.json"
        if not record.exists():
            no_wheels = shared / "no-wheels"  # no wheel folder: the install step builds ropecheck's own
            no_wheels.mkdir()
            start = time.perf_counter()
            done = run(shared / "out", "--rehearse", "--quick",
                       env={"WHEELS": str(no_wheels), "GPU_RUN_BUDGET": str(BUDGET)})
            record.write_text(json.dumps({"returncode": done.returncode, "stdout": done.stdout,
                                          "stderr": done.stderr, "seconds": time.perf_counter() - start}))
    made = json.loads(record.read_text())
    done = subprocess.CompletedProcess([], made["returncode"], made["stdout"], made["stderr"])
    print(f"\nrehearsal: {made['seconds']:.0f} s\n{done.stdout[-3000:]}")
    return shared / "out", done, made["seconds"]


def test_rehearsal_runs_every_step_and_passes(rehearsal):
    out, done, _ = rehearsal
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert summary_statuses(out) == {step: "passed" for step in STEPS}
    for step in STEPS:
        assert f"gpu-run: {step} " in done.stdout, "the summary also goes to stdout"


def test_rehearsal_keeps_within_the_budget_of_one_device_call(rehearsal):
    """Every step ran (none skipped for want of time) and the whole run, report and
    tarball included, took less than GPU_RUN_BUDGET."""
    out, done, seconds = rehearsal
    assert seconds < BUDGET, f"{seconds:.0f} s"
    assert "skipped" not in summary_statuses(out).values()
    said = re.search(r"(\d+) s in steps", (out / "summary.md").read_text())
    assert said and int(said.group(1)) < BUDGET


def test_rehearsal_writes_every_file(rehearsal):
    out = rehearsal[0]
    missing = [name for name in FILES if not (out / name).is_file()]
    assert not missing, missing
    logs = {p.stem for p in (out / "logs").glob("*.log")}
    assert set(STEPS) <= logs, set(STEPS) - logs
    with tarfile.open(out / "gpu-run.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"out/{name}" for name in FILES if name != "gpu-run.tar.gz"} <= names
    assert not any("/site/" in name or "/wheels/" in name for name in names), "no installed wheels"


def test_rehearsal_records_say_what_ran(rehearsal):
    out = rehearsal[0]
    report = json.loads((out / "docs/report-gpu/report.json").read_text())
    assert report["mode"] == "rehearsal"
    assert report["envelope"]["cuda_available"] is False
    assert report["envelope"]["copy"]["device"] == "cpu" and report["envelope"]["copy"]["gb_per_s"] > 0
    checks = {c["target"]: c for c in report["checks"]}
    assert set(checks) == {"triton", "tests/path_kernels.py:vllm_rows_correct"}, "the target, and a preset's kernel"
    for check in checks.values():
        assert (check["device"], check["profile"], check["verdict"]) == ("cpu", "ci", "passed")
    sanitized = {s["name"]: s for s in report["sanitizer"]}
    assert sanitized["past_row_read"]["as_expected"] and sanitized["past_row_read"]["findings"]
    assert sanitized["triton"]["as_expected"] and not sanitized["triton"]["findings"]
    main = [r for r in report["aot"]["results"] if r["arch"] == "sm_90a"]
    assert main and (main[0]["widest_load"], main[0]["widest_store"]) == (128, 128)
    md = (out / "docs/report-gpu/report.md").read_text()
    assert "Rehearsal on CPU" in md and "| triton | cpu | ci | float32 | eager | passed |" in md
    benchmarks = (out / "docs/report-gpu/benchmarks.md").read_text()
    assert "test_apply_rope_throughput[half]" in benchmarks and "test_apply_rope_throughput[interleaved]" in benchmarks
    commands = (out / "docs/report-gpu/commands.md").read_text()
    assert "--device cpu --profile ci --dtype float32" in commands and "--internal sanitize-sample" in commands


def test_a_failing_step_is_recorded_and_the_run_goes_on(tmp_path):
    """A broken wheel: the install step fails, the next step still runs, the summary says
    so, and the script exits 1; with no budget left a step is skipped, not run."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-0.1-py3-none-any.whl").write_text("not a zip file")
    done = run(tmp_path / "out", "--rehearse", "--quick", "--steps", "install,sanitize-triton",
               env={"WHEELS": str(wheels)})
    assert done.returncode == 1, done.stdout
    assert summary_statuses(tmp_path / "out") == {"install": "failed", "sanitize-triton": "passed",
                                                  "report": "passed"}
    assert (tmp_path / "out/logs/install.log").read_text().strip()
    assert (tmp_path / "out/docs/report-gpu/report.md").is_file()
    done = run(tmp_path / "late", "--rehearse", "--steps", "envelope", env={"GPU_RUN_BUDGET": "30"})
    assert summary_statuses(tmp_path / "late") == {"envelope": "skipped", "report": "passed"}
    assert done.returncode == 0
    assert "no time left" in (tmp_path / "late/steps.tsv").read_text()


def test_benchmark_table_of_a_gpu_run(tmp_path):
    """The GPU columns of the benchmark table, from a real pytest-benchmark JSON file
    whose rows carry the extra_info bench_gpu_rope.py records (ropecheck bench's; values made up here)."""
    bench = tmp_path / "bench_fake_gpu.py"
    bench.write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("implementation", ["ropecheck-triton", "liger"])
        def test_rope_gpu(benchmark, implementation):
            benchmark.group = "prefill"
            benchmark.pedantic(lambda: None, rounds=3)
            benchmark.extra_info.update(implementation=implementation, row="bfloat16 prefill T=16384 32/8x128",
                                        timer="cuda-cold", gb_per_s=1234.5, percent_of_copy=41.0,
                                        launch_bound=False, host_s_per_call=2e-5, notes=[])
    """))
    subprocess.run([sys.executable, "-m", "pytest", "-q", str(bench), "--benchmark-enable", "-p", "no:xdist",
                    "-p", "no:cacheprovider", "--benchmark-json", str(tmp_path / "b.json"), "--rootdir",
                    str(tmp_path), "-c", os.devnull], check=True, capture_output=True, cwd=tmp_path,
                   env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")})  # else no benchmark in xdist
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        import gpu_report
    finally:
        sys.path.remove(str(ROOT / "ci"))
    table = gpu_report.bench_table(tmp_path / "b.json")
    assert "| shape | implementation | timer | median us | GB/s | % of copy | host us | notes |" in table
    assert "| bfloat16 prefill T=16384 32/8x128 | liger | cuda-cold |" in table
    assert "| 1.23e+03 | 41 | 20 | - |" in table
    assert "No benchmark" in gpu_report.bench_table(tmp_path / "absent.json")


def test_report_of_a_gpu_run_s_sanitizer_records(tmp_path):
    """On a GPU the sanitizer steps keep the check's JSON record (NAME.check.json) beside
    their own (NAME.json, findings read from that check, no ERROR SUMMARY count): the
    report reads only the records (the first H100 run's report stopped on the check's)."""
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        import gpu_report
        import gpu_report_pages
    finally:
        sys.path.remove(str(ROOT / "ci"))
    (tmp_path / "sanitizer").mkdir()
    check = tmp_path / "sanitizer" / "past_row_read.check.json"
    check.write_text(json.dumps({"results": [{"property": "contract", "dtype": "bfloat16", "message":
                                              "compute-sanitizer memcheck: Invalid __global__ read"}]}))
    assert gpu_report.sanitizer_record("past_row_read", tmp_path / "absent.log",
                                       tmp_path / "sanitizer" / "past_row_read.json", "found", "memcheck",
                                       check_json=check) == 0
    gpu_report_pages.report(tmp_path)
    report = (tmp_path / "docs" / "report-gpu" / "report.md").read_text()
    assert "| past_row_read | memcheck | yes | found | - | compute-sanitizer memcheck: Invalid __global__ read |" \
        in report
