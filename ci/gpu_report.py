"""The Python half of ci/gpu-run.sh: the execution envelope, the sanitizer step's records,
the benchmark table, the report and the summary of a GPU run (or of its CPU rehearsal).

    python ci/gpu_report.py envelope OUT_DIR [--rehearse]
    python ci/gpu_report.py sanitizer NAME LOG OUT_JSON --expect found|clean [--tool memcheck]
    python ci/gpu_report.py bench-table BENCH_JSON... OUT_MD
    python ci/gpu_report.py report OUT_DIR
    python ci/gpu_report.py summary OUT_DIR

Everything it reads is a file of the run's folder (OUT_DIR): steps.tsv and commands.tsv
(written by the script), envelope.json, checks/*.json (``ropecheck check --json``),
sanitizer/*.json, bench/benchmark-*.json (pytest-benchmark), aot.json
(``python -m ropecheck.kernels.aot --json``), logs/*.log. It writes
OUT_DIR/docs/report-gpu/ (report.md, report.json, benchmarks.md, aot.md, commands.md) and
OUT_DIR/summary.md. It reports what the files say and nothing else: a step that did not
run leaves a hole that the report names.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

from gpu_report_pages import bench_table, report, summary  # noqa: E402  (ci/ is on sys.path)

LIBRARIES = ("ropecheck", "torch", "triton", "transformers", "liger-kernel", "flash-attn",
             "flashinfer-python", "hypothesis", "numpy", "scipy", "pytest", "pytest-benchmark")


# ------------------------------------------------------------------------------ envelope


def _run(command: list) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({type(exc).__name__}: {exc})"
    text = (done.stdout or done.stderr).strip()
    return text if done.returncode == 0 else f"exit {done.returncode}: {text[-300:]}"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def copy_bandwidth(device: str, nbytes: int, rounds: int) -> dict:
    """A device-to-device (or host) copy of ``nbytes`` with torch: the median of ``rounds``
    copies after two warm-ups, counted as bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for i in range(rounds + 2):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            began = time.perf_counter()
            dst.copy_(src)
            seconds = time.perf_counter() - began
        if i >= 2:
            times.append(seconds)
    median = statistics.median(times)
    return {"device": device, "bytes": nbytes, "rounds": rounds, "median_s": median,
            "gb_per_s": 2 * nbytes / median / 1e9,
            "how": "torch copy_ between two buffers, bytes read + written over the median time"
                   + (", CUDA events" if device == "cuda" else ", time.perf_counter")}


def envelope(out: Path, rehearse: bool) -> dict:
    """What the run ran on, into OUT_DIR/envelope.json."""
    import torch

    cuda = torch.cuda.is_available()
    env = {"mode": "rehearsal on CPU" if rehearse else "GPU run",
           "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
           "python": sys.version.split()[0], "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "libraries": {name: _version(name) for name in LIBRARIES},
           "torch_cuda": torch.version.cuda, "cuda_available": cuda}
    try:
        import triton

        env["libraries"]["triton"] = triton.__version__
    except ImportError:
        pass
    if cuda:
        props = torch.cuda.get_device_properties(0)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gib": round(props.total_memory / 2**30, 1),
                      "multiprocessors": props.multi_processor_count,
                      "l2_mib": round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                      "count": torch.cuda.device_count()}
    env["nvidia_smi"] = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                                            "clocks.mem", "--format=csv,noheader"]) \
        if shutil.which("nvidia-smi") else "nvidia-smi not on the PATH"
    env["nvcc"] = _run(["nvcc", "--version"]).splitlines()[-1] if shutil.which("nvcc") else "not on the PATH"
    try:
        from ropecheck.calling import sanitizer

        found = sanitizer.find_executable()
        env["compute_sanitizer"] = _run([found, "--version"]).splitlines()[-1] if found else "not found"
        env["sanitizer_available"] = sanitizer.available() or "yes"
    except ImportError as exc:
        env["compute_sanitizer"] = f"ropecheck.calling.sanitizer not importable: {exc}"
    try:
        if cuda:
            env["copy"] = copy_bandwidth("cuda", 2**30, 20)
        else:
            env["copy"] = copy_bandwidth("cpu", 2**26, 5)
    except Exception as exc:  # a copy that fails is recorded, not fatal
        env["copy"] = {"error": f"{type(exc).__name__}: {exc}"}
    (out / "envelope.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env, indent=1))
    return env


# ------------------------------------------------------------------------------ sanitizer


def sanitizer_record(name: str, log: Path, out_json: Path, expect: str, tool: str,
                     check_json: Optional[Path] = None) -> int:
    """A compute-sanitizer run into OUT_JSON: the findings of ``ropecheck check --sanitize``
    (its JSON record, ``check_json``: every result whose message is a sanitizer report),
    else a compute-sanitizer log parsed (the rehearsal's recorded samples). Exit 0 when it
    says what was expected: ``found`` (a planted kernel: at least one out-of-bounds access)
    or ``clean`` (no error)."""
    from ropecheck.calling import sanitizer_reports

    if check_json is not None and check_json.exists():
        results = json.loads(check_json.read_text()).get("results", [])
        said = [r for r in results if "compute-sanitizer" in (r.get("message") or "")]
        ok = bool(said) if expect == "found" else not said
        record = {"name": name, "tool": tool, "check_json": str(check_json), "expect": expect, "as_expected": ok,
                  "reports": len(said), "findings": [{"property": r["property"], "dtype": r["dtype"],
                                                      "message": r["message"],
                                                      "counterexample": r.get("counterexample")} for r in said]}
        out_json.write_text(json.dumps(record, indent=1))
        print(f"{name}: {len(said)} checks with sanitizer findings; expected {expect}: {'yes' if ok else 'NO'}")
        return 0 if ok else 1
    text = log.read_text(errors="replace") if log.exists() else ""
    reports = sanitizer_reports.parse(text, tool)
    findings = sanitizer_reports.findings(reports)
    summary = sanitizer_reports.error_summary(text)
    out_of_bounds = [r for r in reports if r.kind in ("out-of-bounds", "misaligned")]
    ok = bool(out_of_bounds) if expect == "found" else (not reports and summary == 0)
    record = {"name": name, "tool": tool, "log": str(log), "expect": expect, "as_expected": ok,
              "error_summary": summary, "reports": len(reports),
              "findings": [{"count": f.count, "message": f.message, "kind": f.first.kind,
                            "kernel": f.first.kernel, "access": f.first.access,
                            "size": f.first.size, "location": f.first.location} for f in findings]}
    out_json.write_text(json.dumps(record, indent=1))
    print(f"{name}: {len(reports)} reports, {len(findings)} findings, ERROR SUMMARY {summary}; "
          f"expected {expect}: {'yes' if ok else 'NO'}")
    for finding in findings:
        print(f"  {finding.message}")
    return 0 if ok else 1


# ------------------------------------------------------------------------------ benchmarks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("envelope")
    p.add_argument("out", type=Path)
    p.add_argument("--rehearse", action="store_true")
    p = sub.add_parser("sanitizer")
    p.add_argument("name")
    p.add_argument("log", type=Path)
    p.add_argument("out_json", type=Path)
    p.add_argument("--expect", choices=("found", "clean"), required=True)
    p.add_argument("--tool", default="memcheck")
    p.add_argument("--check-json", type=Path, help="ropecheck check --sanitize's JSON record (its findings)")
    p = sub.add_parser("bench-table")
    p.add_argument("files", type=Path, nargs="+", help="pytest-benchmark JSON files, then the markdown to write")
    for name in ("report", "summary"):
        sub.add_parser(name).add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "envelope":
        envelope(args.out, args.rehearse)
    elif args.command == "sanitizer":
        return sanitizer_record(args.name, args.log, args.out_json, args.expect, args.tool, args.check_json)
    elif args.command == "bench-table":
        *jsons, out_md = args.files
        text = bench_table(*jsons)
        out_md.write_text(text)
        print(text)
    elif args.command == "report":
        report(args.out)
    elif args.command == "summary":
        print(summary(args.out))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
