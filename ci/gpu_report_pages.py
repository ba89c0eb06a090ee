"""The pages of a GPU run (ci/gpu_report.py's report, summary and bench-table): read from
the run's folder (steps.tsv, commands.tsv, envelope.json, checks/*.json, sanitizer/*.json,
bench/benchmark-*.json, aot.json) and written to OUT_DIR/docs/report-gpu/ and summary.md."""

from __future__ import annotations

import json
from pathlib import Path


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
        lines += ["| shape | implementation | timer | median us | GB/s | % of copy | host us | notes |",
                  "|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| benchmark | median ms | mean ms | rounds | extra |", "|---|---|---|---|---|"]
    for row in rows:
        stats, info = row.get("stats", {}), row.get("extra_info", {})
        if gpu:  # ropecheck bench's extra_info (ropecheck.bench.output.extra_info)
            impl = info.get("implementation") or row.get("params", {}).get("implementation", row.get("name"))
            copy = "launch-bound" if info.get("launch_bound") else _fmt(info.get("percent_of_copy"))
            host = info.get("host_s_per_call")
            lines.append(f"| {info.get('row', row.get('group') or '-')} | {impl} | {info.get('timer', '-')} "
                         f"| {_fmt(stats.get('median', 0) * 1e6)} | {_fmt(info.get('gb_per_s'))} | {copy} "
                         f"| {_fmt(host * 1e6) if host else '-'} | {'; '.join(info.get('notes', [])) or '-'} |")
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
    # a step of several checks (checks-MODE) has a row for each of them besides its own: its
    # own row holds their time
    groups = {s["step"].removeprefix("checks-") for s in steps if s["step"].startswith("checks-")}
    total = sum(s["seconds"] for s in steps if not any(s["step"].endswith(f"-{g}") and
                                                       s["step"].startswith("check-") for g in groups))
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
    launched = record.get("triton_launches") or {}
    return {"file": path.name, "target": record.get("target"), "device": record.get("device"),
            "seconds": round(sum(r.get("seconds") or 0 for r in results), 1),
            "specializations": launched.get("by_dtype"), "compiled": launched.get("compiled"),
            "compile_seconds": launched.get("compile_seconds"),
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
    sanitized = [json.loads(p.read_text()) for p in sorted((out / "sanitizer").glob("*.json"))
                 if not p.name.endswith(".check.json")]  # beside each record: the check's own JSON
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
        md += ["| target | device | profile | dtypes | modes | verdict | results | not passed | check s "
               "| Triton specializations | compiled (s) |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in checks:
            if "error" in c:
                md.append(f"| {c['file']} | | | | | {c['error']} | | | | | |")
                continue
            results = ", ".join(f"{n} {k}" for k, n in sorted(c["by_status"].items(), key=str))
            md.append(f"| {c['target']} | {c['device']} | {c['profile']} | {'/'.join(c['dtypes'] or [])} "
                      f"| {'/'.join(c['modes'] or [])} | {c['verdict']} | {results} "
                      f"| {'; '.join(c['not_passed'][:6]) or '-'} | {c['seconds']} "
                      f"| {', '.join(f'{d} {n}' for d, n in (c['specializations'] or {}).items()) or '-'} "
                      f"| {c['compiled'] or 0} ({c['compile_seconds'] or 0:.1f}) |")
    else:
        md.append("No check record was written.")
    md += ["", "## Sanitizer", ""]
    if sanitized:
        md += ["| target | tool | as expected | expected | errors | findings |", "|---|---|---|---|---|---|"]
        for s in sanitized:
            first = "; ".join(f["message"] for f in s["findings"][:2]) or "-"
            md.append(f"| {s['name']} | {s['tool']} | {'yes' if s['as_expected'] else 'NO'} | {s['expect']} "
                      f"| {s.get('error_summary', '-')} | {first} |")
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
