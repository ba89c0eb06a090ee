"""``ropecheck report``: the suite over every available target, written as a conformance
report (markdown + JSON + accuracy plots).

The JSON opens with an execution envelope (suite, python, torch, device, the version of
every adapter's library, profile and seed) and holds, per target x dtype: the verdict of
every property, the largest normalised error, the accuracy horizon, the error profile
against position, and the worst input (the minimal counterexample of each failure).
Everything but the ``seconds`` fields and the ``generated`` date is a function of the
code, the library versions and the seed, so a regeneration reproduces it.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Callable, Optional

import torch

from ropecheck.adapters import ADAPTERS
from ropecheck.properties.runner import json_number
from ropecheck.report.catalog import Entry, library_version
from ropecheck.report.output import environment
from ropecheck.session import known_failures
from ropecheck.session.options import parse
from ropecheck.session.prepare import prepare
from ropecheck.session.spec import UnusableTarget


@dataclass
class TargetReport:
    name: str
    library: str
    convention: str
    capabilities: str
    results: list = field(default_factory=list)
    problems: dict = field(default_factory=dict)  # dtype -> why it could not be called
    fixed: list = field(default_factory=list)  # known-failure records that now pass

    def by_dtype(self) -> dict:
        out: dict = {}
        for r in self.results:
            out.setdefault(r.dtype, []).append(r)
        return out

    def summary(self) -> dict:
        out = {}
        for dtype, results in self.by_dtype().items():
            errors = [r.max_error for r in results if r.max_error is not None]
            accuracy = next((r.accuracy for r in results if r.accuracy), None) or {}
            statuses = {r.status for r in results}
            verdict = (
                "error"
                if "error" in statuses
                else "failed"
                if "failed" in statuses
                else "known"
                if "known" in statuses
                else "passed"
            )
            out[dtype] = {
                "verdict": verdict,
                "properties": {
                    r.property: {"status": r.status, "max_error": json_number(r.max_error)} for r in results
                },
                "max_normalised_error": json_number(max(errors)) if errors else None,
                "accuracy_horizon": accuracy.get("horizon"),
                "error_profile": {k: accuracy.get(k) for k in ("positions", "relative_error")}
                if accuracy.get("positions")
                else None,
                "worst_inputs": [
                    {
                        "property": r.property,
                        "status": r.status,
                        "counterexample": r.counterexample,
                        "message": r.message,
                        "reproduce": r.reproduce,
                    }
                    for r in results
                    if r.status in ("failed", "known", "error")
                ],
            }
        for dtype, why in self.problems.items():
            out[dtype] = {"verdict": "not callable", "why": why}
        return out


def envelope(profile: str, seed: Optional[int]) -> dict:
    libraries = sorted({a.library for a in ADAPTERS.values()} | {"triton"})
    device = (
        torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else f"cpu ({platform.processor() or platform.machine()})"
    )
    return {
        "suite": environment()["ropecheck"],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device,
        "libraries": {name: library_version(name) for name in libraries},
        "profile": profile,
        "seed": seed,
        "generated": date.today().isoformat(),
    }


def run_target(
    entry: Entry,
    dtypes: Optional[list],
    profile: str,
    seed: Optional[int],
    timeout: float,
    on_result: Callable = lambda r: None,
) -> TargetReport:
    """Run the suite on one catalog entry (``ropecheck.targets.catalog``) through the check
    session, in the dtypes asked for that the target declares (each in its own worker)."""
    name = entry.name
    report = TargetReport(name, entry.library, entry.convention, entry.capabilities)
    options = parse("check", {"target": name, "profile": profile, "seed": seed, "timeout": timeout})
    try:
        session = prepare(options)
    except UnusableTarget as exc:
        report.problems = {"all": str(exc)}
        return report
    try:
        wanted = [
            d for d in (dtypes or session.target.dtypes) if d in session.target.dtypes or d in session.unsupported
        ]
        report.problems = {d: p for d, p in session.unsupported.items() if d in wanted}
        session.dtypes = [d for d in session.dtypes if d in wanted]
        report.results = session.run(on_result)
    finally:
        session.close()
    report.fixed = [k.reason for k in known_failures.fixed(name, report.results, session.known)]
    return report


def to_json(reports: list[TargetReport], unavailable: dict, env: dict) -> dict:
    return {
        "envelope": env,
        "targets": {
            r.name: {
                "library": r.library,
                "convention": r.convention,
                "capabilities": r.capabilities,
                "dtypes": r.summary(),
                "known_failures_now_passing": r.fixed,
            }
            for r in reports
        },
        "unavailable": unavailable,
    }


def _cell(summary: dict) -> str:
    if summary["verdict"] == "not callable":
        return "not callable"
    counts: dict[str, int] = {}
    for p in summary["properties"].values():
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    verdict = {"passed": "pass", "failed": "**FAIL**", "known": "known", "error": "ERROR"}[summary["verdict"]]
    detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s != "passed")
    return verdict + (f" ({detail})" if detail else "")


def to_markdown(data: dict, command: str, figures: list[str]) -> str:
    env = data["envelope"]
    lines = [
        "# ropecheck conformance report",
        "",
        f"Regenerate with `{command}` (everything but timings and the date reproduces).",
        "",
        "## Execution envelope",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for key in ("suite", "python", "torch", "device", "profile", "seed", "generated"):
        lines.append(f"| {key} | {env[key]} |")
    lines.append("| libraries | " + ", ".join(f"{k} {v}" for k, v in env["libraries"].items()) + " |")
    dtypes = sorted({d for t in data["targets"].values() for d in t["dtypes"]})
    lines += [
        "",
        "## Verdicts",
        "",
        "Each cell: the verdict over all properties, then the largest error in tolerance "
        "units (<= 1 passes) and the accuracy horizon (largest position meeting the strict "
        "bound, float32 angles excluded).",
        "",
        "| target | library | " + " | ".join(dtypes) + " |",
        "|---|---|" + "---|" * len(dtypes),
    ]
    for name, t in data["targets"].items():
        cells = []
        for d in dtypes:
            s = t["dtypes"].get(d)
            if s is None:
                cells.append("-")
            elif s["verdict"] == "not callable":
                cells.append("not callable")
            else:
                err = s["max_normalised_error"]
                cells.append(
                    f"{_cell(s)}<br>{float(err):.2g} / {s['accuracy_horizon']}" if err is not None else _cell(s)
                )
        lines.append(f"| `{name}` | {t['library']} | " + " | ".join(cells) + " |")
    lines += ["", "## Findings", ""]
    found = False
    for name, t in data["targets"].items():
        for d, s in t["dtypes"].items():
            for w in s.get("worst_inputs", []):
                found = True
                lines += [
                    f"### `{name}` - {w['property']} ({d}): {w['status']}",
                    "",
                    "```",
                    w["message"].strip(),
                    f"smallest input: {w['counterexample']}",
                    f"reproduce: {w['reproduce']}",
                    "```",
                    "",
                ]
            if s.get("verdict") == "not callable":
                found = True
                lines += [f"### `{name}` ({d}): not callable", "", f"{s['why']}", ""]
    if not found:
        lines.append("No target failed a check.")
    if data["unavailable"]:
        lines += ["", "## Not available on this machine", ""]
        lines += [f"- `{k}`: {v}" for k, v in data["unavailable"].items()]
    if figures:
        lines += ["", "## Error against position", ""]
        lines += [f"![{f}]({f})" for f in figures]
    return "\n".join(lines) + "\n"


def write(out_dir: Path, reports: list[TargetReport], unavailable: dict, env: dict, command: str) -> dict:
    from ropecheck.report.plots import plot_error_profiles

    out_dir.mkdir(parents=True, exist_ok=True)
    data = to_json(reports, unavailable, env)
    figures = plot_error_profiles(data, out_dir)
    (out_dir / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    (out_dir / "report.md").write_text(to_markdown(data, command, figures))
    return data
