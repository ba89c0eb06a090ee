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


def _fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def bench_table(*files: Path) -> str:
    """Markdown of pytest-benchmark JSON files: one row per benchmark, the GPU protocol's
    extra_info (GB/s, % of copy, errors) when there. A file that was not written is named."""
    parts = []
    for bench_json in files:
        parts.append(_bench_table(Path(bench_json)))
    return "\n".join(parts) if parts else "No benchmark results.\n"


def _bench_table(bench_json: Path) -> str:
    if not bench_json.exists():
        return f"No benchmark results: {bench_json.name} was not written (see logs/bench*.log).\n"
    data = json.loads(bench_json.read_text())
    rows = data.get("benchmarks", [])
    if not rows:
        return f"{bench_json.name}: no benchmark ran (see logs/bench*.log).\n"
    machine = data.get("machine_info", {})
    lines = [f"{bench_json.name}: pytest-benchmark {data.get('version', '?')}, {data.get('datetime', '?')}, "
             f"{machine.get('cpu', {}).get('brand_raw', machine.get('processor', '?'))}", ""]
    gpu = any("gb_per_s" in row.get("extra_info", {}) for row in rows)
    if gpu:
        lines += ["| config | implementation | median us | GB/s | % of copy | copy GB/s | err@1e3 | err@1e5 | err@1e6 |",
                  "|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| benchmark | median ms | mean ms | rounds | extra |", "|---|---|---|---|---|"]
    for row in rows:
        stats, info = row.get("stats", {}), row.get("extra_info", {})
        if gpu:
            impl = row.get("params", {}).get("implementation", row.get("name"))
            lines.append(f"| {row.get('group') or '-'} | {impl} | {_fmt(stats.get('median', 0) * 1e6)} "
                         f"| {_fmt(info.get('gb_per_s'))} | {_fmt(info.get('percent_of_copy'))} "
                         f"| {_fmt(info.get('copy_gb_per_s'))} | {_fmt(info.get('max_error_at_1000'))} "
                         f"| {_fmt(info.get('max_error_at_100000'))} | {_fmt(info.get('max_error_at_1000000'))} |")
        else:
            extra = ", ".join(f"{k}={_fmt(v)}" for k, v in info.items())
            lines.append(f"| {row.get('name')} | {_fmt(stats.get('median', 0) * 1e3)} "
                         f"| {_fmt(stats.get('mean', 0) * 1e3)} | {stats.get('rounds')} | {extra or '-'} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ steps


def read_steps(out: Path) -> list:
    """steps.tsv: name, status, seconds, exit code, note."""
    path = out / "steps.tsv"
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                name, status, seconds, code, note = (line.split("\t") + [""] * 5)[:5]
                steps.append({"step": name, "status": status, "seconds": int(seconds or 0),
                              "exit": code, "note": note})
    return steps


def read_commands(out: Path) -> list:
    path = out / "commands.tsv"
    if not path.exists():
        return []
    return [dict(zip(("step", "command"), line.split("\t", 1)))
            for line in path.read_text().splitlines() if "\t" in line]


def summary_table(steps: list) -> str:
    lines = ["| step | status | seconds | note |", "|---|---|---|---|"]
    for s in steps:
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']} | {s['note'] or ''} |")
    return "\n".join(lines)


def summary(out: Path) -> str:
    steps = read_steps(out)
    counts = {}
    for s in steps:
        key = s["status"].split()[0] if s["status"] else "?"
        counts[key] = counts.get(key, 0) + 1
    total = sum(s["seconds"] for s in steps)
    mode = "rehearsal on CPU" if (out / "REHEARSAL").exists() else "GPU run"
    text = (f"# ci/gpu-run.sh summary ({mode})\n\n{summary_table(steps)}\n\n"
            f"{len(steps)} steps, {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}; "
            f"{total} s in steps.\n")
    (out / "summary.md").write_text(text)
    return text


# ------------------------------------------------------------------------------ report


def _check_summary(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return {"file": path.name, "error": f"unreadable: {exc}"}
    results = record.get("results", [])
    by_status: dict = {}
    failed = []
    for r in results:
        by_status[r.get("status")] = by_status.get(r.get("status"), 0) + 1
        if r.get("status") not in ("passed", "skipped", "known"):
            failed.append(f"{r.get('property')} [{r.get('dtype')} {r.get('mode')}]: {r.get('status')}")
    return {"file": path.name, "target": record.get("target"), "device": record.get("device"),
            "profile": record.get("profile"), "sizes": record.get("sizes"),
            "dtypes": record.get("dtypes"), "modes": record.get("modes"),
            "verdict": record.get("verdict"), "exit_status": record.get("exit_status"),
            "stopped": record.get("stopped"), "by_status": by_status, "not_passed": failed,
            "causes": record.get("causes"), "support_notes": record.get("support_notes"),
            "unsupported_dtypes": record.get("unsupported_dtypes")}


def report(out: Path) -> None:
    """OUT_DIR/docs/report-gpu/: report.md, report.json, benchmarks.md, aot.md, commands.md."""
    docs = out / "docs" / "report-gpu"
    docs.mkdir(parents=True, exist_ok=True)
    rehearse = (out / "REHEARSAL").exists()
    env = json.loads((out / "envelope.json").read_text()) if (out / "envelope.json").exists() else {}
    steps = read_steps(out)
    commands = read_commands(out)
    checks = [_check_summary(p) for p in sorted((out / "checks").glob("*.json"))]
    sanitized = [json.loads(p.read_text()) for p in sorted((out / "sanitizer").glob("*.json"))]
    aot = json.loads((out / "aot.json").read_text()) if (out / "aot.json").exists() else None
    bench_files = sorted((out / "bench").glob("benchmark-*.json"))
    bench_md = bench_table(*bench_files) if bench_files else "No benchmark results were written.\n"
    (docs / "benchmarks.md").write_text(bench_md)
    (docs / "commands.md").write_text("# Commands of the run\n\n" + "".join(
        f"- `{c['step']}`: `{c['command']}`\n" for c in commands))
    aot_md = ""
    if aot:
        from ropecheck.kernels.aot import Result, table

        results = [Result(**{k: v for k, v in r.items() if k in Result.__dataclass_fields__})
                   for r in aot["results"]]
        for r in results:
            r.loads = {int(k): v for k, v in r.loads.items()}
            r.stores = {int(k): v for k, v in r.stores.items()}
        aot_md = table(results) + "\n\n" + ", ".join(f"{k} {v}" for k, v in aot.get("versions", {}).items()) + "\n"
        (docs / "aot.md").write_text(aot_md)

    gpu = env.get("gpu", {})
    title = (f"GPU run on {gpu.get('name')}" if gpu else
             "Rehearsal on CPU (no GPU: every figure below is a CPU figure)" if rehearse
             else "GPU run (no CUDA device was seen)")
    md = [f"# ropecheck: {title}", "",
          f"Made by `ci/gpu-run.sh{' --rehearse' if rehearse else ''}` on {env.get('date_utc', '?')} UTC. "
          "Every step's output is in logs/STEP.log of the run's folder; this page reports what "
          "the step files say.", "", "## Envelope", "", "| | |", "|---|---|"]
    for key in ("mode", "python", "platform", "cpu_count", "torch_cuda", "cuda_available",
                "nvidia_smi", "nvcc", "compute_sanitizer", "sanitizer_available"):
        if key in env:
            md.append(f"| {key} | {env[key]} |")
    for key, value in gpu.items():
        md.append(f"| gpu {key} | {value} |")
    for name, version in env.get("libraries", {}).items():
        md.append(f"| {name} | {version} |")
    copy = env.get("copy", {})
    if "gb_per_s" in copy:
        md.append(f"| copy bandwidth ({copy['device']}) | {copy['gb_per_s']:.1f} GB/s "
                  f"({copy['bytes'] / 2**20:.0f} MiB, median of {copy['rounds']}; {copy['how']}) |")
    elif copy:
        md.append(f"| copy bandwidth | {copy.get('error')} |")
    md += ["", "## Steps", "", summary_table(steps), "", "## Checks", ""]
    if checks:
        md += ["| target | device | profile | dtypes | modes | verdict | results | not passed |",
               "|---|---|---|---|---|---|---|---|"]
        for c in checks:
            if "error" in c:
                md.append(f"| {c['file']} | | | | | {c['error']} | | |")
                continue
            results = ", ".join(f"{n} {k}" for k, n in sorted(c["by_status"].items(), key=str))
            md.append(f"| {c['target']} | {c['device']} | {c['profile']} | {'/'.join(c['dtypes'] or [])} "
                      f"| {'/'.join(c['modes'] or [])} | {c['verdict']} | {results} "
                      f"| {'; '.join(c['not_passed'][:6]) or '-'} |")
    else:
        md.append("No check record was written.")
    md += ["", "## Sanitizer", ""]
    if sanitized:
        md += ["| target | tool | as expected | expected | errors | findings |", "|---|---|---|---|---|---|"]
        for s in sanitized:
            first = "; ".join(f["message"] for f in s["findings"][:2]) or "-"
            md.append(f"| {s['name']} | {s['tool']} | {'yes' if s['as_expected'] else 'NO'} | {s['expect']} "
                      f"| {s['error_summary']} | {first} |")
        if rehearse:
            md += ["", "Rehearsal: the sanitizer did not run; its step parsed the recorded sample "
                       "reports of tests/data/sanitizer/ (written in the documented format, not captured "
                       "on a GPU)."]
    else:
        md.append("No sanitizer record was written.")
    md += ["", "## Benchmarks", "", bench_md, "## Kernel compiled ahead of time (AOT)", "",
           aot_md or "No AOT record was written.", "", "## Commands", ""]
    md += [f"- `{c['step']}`: `{c['command']}`" for c in commands]
    (docs / "report.md").write_text("\n".join(md) + "\n")
    (docs / "report.json").write_text(json.dumps(
        {"mode": "rehearsal" if rehearse else "gpu", "envelope": env, "steps": steps, "checks": checks,
         "sanitizer": sanitized, "benchmark_files": [f"bench/{p.name}" for p in bench_files],
         "aot": aot, "commands": commands}, indent=1, default=str))
    print(f"wrote {docs}/report.md, report.json, benchmarks.md, commands.md" + (", aot.md" if aot else ""))


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
