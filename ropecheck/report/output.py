"""How results are shown and saved: the rich table, root causes, failure details, support
notes, the verdict line, JSON and JUnit XML (written on every exit, 2 included)."""

from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ropecheck.calling import modes as run_modes
from ropecheck.calling.launches import Recorded
from ropecheck.session import opcheck_row
from ropecheck.session.session import column_label

SCHEMA_VERSION = 2  # 2: causes, notes, diagnosis, unsupported dtypes, exit status, reason
STATUS_STYLE = {
    "passed": "[green]pass[/]",
    "failed": "[bold red]FAIL[/]",
    "skipped": "[dim]skip[/]",
    "error": "[bold magenta]ERROR[/]",
    "known": "[yellow]known[/]",
}
VERDICT_LINE = {
    "passed": "[bold green]PASSED[/]",
    "failed": "[bold red]FAILED[/]",
    "error": "[bold magenta]ERROR[/] (a check crashed inside ropecheck)",
}
EXIT_STATUS = {"passed": 0, "failed": 1, "error": 2}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    return {
        "ropecheck": _version("ropecheck"),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "hypothesis": _version("hypothesis"),
        "platform": platform.platform(),
    }


def _cell(result) -> str:
    text = STATUS_STYLE[result.status]
    if result.max_error is not None and result.status in ("passed", "failed", "known"):
        shown = f"{result.max_error:.2g}"
        if result.status != "passed" and float(shown) <= 1.0:
            shown = ">1"  # a failure just past the bound must not read as 1
        text += f" {shown}"
    if result.cause:
        text += f" ({result.cause})"
    if result.notes:
        text += " *"
    return text


def results_table(session) -> Table:
    """Rows: properties; columns: dtypes (and modes); each cell the verdict and the largest
    error in tolerance units any input showed (<= 1 passes), the root cause it shares (C1,
    ...) and * when a support note goes with it. The position-range probe runs eagerly,
    once per dtype."""
    table = Table(title=f"ropecheck: {session.target.name}", title_justify="left")
    table.add_column("property")
    columns = session.columns
    for dtype, mode in columns:
        table.add_column(column_label(dtype, mode), justify="right")
    cells = {(r.property, r.dtype, r.mode): r for r in session.results}
    for name in session.rows:
        row = [name]
        for dtype, mode in columns:
            r = cells.get((name, dtype, mode)) or (
                cells.get((name, dtype, "eager")) if name == "position-range" else None
            )
            row.append(_cell(r) if r else "[dim]-[/]")
        table.add_row(*row)
    horizons = []
    for dtype, mode in columns:
        r = cells.get(("reference", dtype, mode))
        acc = (r.accuracy or {}) if r else {}
        h = acc.get("horizon", "-") if "positions" in acc else "-"
        horizons.append("none" if h is None else str(h))
    coverage = session.interface_coverage()
    if any(h != "-" for h in horizons) or coverage:
        table.add_section()
    if any(h != "-" for h in horizons):
        table.add_row("accuracy horizon", *horizons)
    if coverage:
        shown = [coverage.get(column_label(dtype, mode)) for dtype, mode in columns]
        table.add_row(
            "interface paths", *(f"{len(c.covered)}/{len(c.space.pairs)}" if c else "[dim]-[/]" for c in shown)
        )
    return table


def coverage_line(session) -> str:
    """The pairs of the interface's argument classes the run called, in one line: the
    column that covered least (all when every column covered them all), what it missed
    first, and the classes the run could not reach ("" without an interface)."""
    coverage = session.interface_coverage()
    if not coverage:
        return ""
    label, least = min(coverage.items(), key=lambda item: len(item[1].covered))
    line = least.line()
    if len(coverage) > 1:
        complete = all(not c.missing for c in coverage.values())
        where = "in every column" if complete else f"({label}, the column that called fewest)"
        line = line.replace(" pairs of argument classes", f" pairs of argument classes {where}", 1)
    return line


def _detail(console: Console, label: str, text: str) -> None:
    if text:
        console.print(f"  {label}{text}", markup=False, highlight=False, soft_wrap=True)


def print_failures(console: Console, session) -> None:
    """Each root cause once, with the properties it took down; then every other failure."""
    for cause in session.causes:
        console.print(
            f"\n[bold red]ROOT CAUSE {cause['id']}[/] took down {len(cause['properties'])} "
            f"properties ({', '.join(cause['properties'])}) in {', '.join(cause['dtypes'])}:",
            soft_wrap=True,
        )
        _detail(console, "", cause["message"])
        _detail(console, "likely cause: ", cause.get("diagnosis", ""))
        for other in cause.get("also", []):
            _detail(console, f"{other['property']} ({other['dtype']}): ", other["message"])
        _detail(console, cause["counterexample_label"], cause["counterexample"])
        _detail(console, "reproduce: ", cause["reproduce"])
    for r in session.results:
        if r.status not in ("failed", "error", "known") or r.cause:
            continue
        colour = "yellow" if r.status == "known" else "bold red"
        where = column_label(r.dtype, r.mode)
        console.print(
            f"\n[{colour}]{r.status.upper()}[/] [bold]{r.property}[/] ({where}): {escape(r.formula)}", soft_wrap=True
        )
        _detail(console, "", r.message)
        _detail(console, "likely cause: ", r.diagnosis)
        _detail(console, r.counterexample_label(), r.counterexample)
        _detail(console, "reproduce: ", r.reproduce)


def support_notes(session) -> dict[str, list[str]]:
    """note -> the dtypes it was seen in."""
    out: dict[str, list[str]] = {}
    for r in session.results:
        for note in r.notes:
            out.setdefault(note, []).append(r.dtype)
    return out


def launches_dict(session) -> dict:
    """The Triton specializations the run's checks launched (the kernels a GPU compiles for
    it: ``ropecheck.calling.launches``), per dtype and per kernel, and on a device those
    Triton compiled and the seconds their launches took ({} without a Triton kernel)."""
    recorded = session.launches()
    if not recorded:
        return {}
    kernels = {}
    for name, keys in sorted(recorded.keys.items()):
        per = Recorded(keys={name: keys})
        kernels[name] = per.by_dtype()
    return {
        "specializations": recorded.count,
        "by_dtype": recorded.by_dtype(),
        "kernels": kernels,
        "compiled": recorded.compiled,
        "compile_seconds": round(recorded.compile_seconds, 3),
        **({"unkeyed": dict(recorded.unkeyed)} if recorded.unkeyed else {}),
    }


def launches_line(session) -> str:
    """The Triton specializations of the run in one line ("" for a target that launched no
    Triton kernel)."""
    launched = launches_dict(session)
    if not launched:
        return ""
    kernels = sorted(name.rsplit(".", 1)[-1] for name in launched["kernels"])
    per = ", ".join(f"{dtype} {n}" for dtype, n in launched["by_dtype"].items())
    line = (
        f"Triton specializations (the kernels a GPU compiles for this run): {launched['specializations']} "
        f"({per}; {', '.join(kernels[:4])}{', ...' if len(kernels) > 4 else ''})"
    )
    if launched["compiled"]:
        line += (
            f"; compiled on the device: {launched['compiled']}, "
            f"the launches that compiled took {launched['compile_seconds']:.1f} s"
        )
    return line


def print_notes(console: Console, session, debug: bool = False) -> None:
    paths = coverage_line(session)
    if paths:
        console.print(f"\n{paths}", markup=False, soft_wrap=True, highlight=False)
    launched = launches_line(session)
    if launched and (debug or session.launches().compiled):
        console.print(launched, markup=False, soft_wrap=True, highlight=False)
    untried: dict = {}
    for r in session.results:  # the size switch inputs a run left out, once each
        if r.untried:
            untried.setdefault(r.untried, []).append(column_label(r.dtype, r.mode))
    for said, columns in untried.items():
        console.print(f"{said} [{', '.join(columns)}]", markup=False, soft_wrap=True, highlight=False)
    opchecked: dict = {}  # what the opcheck rows that found nothing say, once each
    for r in session.results:
        if r.property == opcheck_row.NAME and r.status in ("passed", "skipped"):
            opchecked.setdefault(r.message, []).append(column_label(r.dtype, r.mode))
    for said, columns in opchecked.items():
        console.print(f"opcheck: {said} [{', '.join(columns)}]", markup=False, soft_wrap=True, highlight=False)
    compiled = run_modes.summary(session.compile_notes)
    if compiled:
        console.print(f"\n[yellow]compile[/]: {escape(compiled)}", soft_wrap=True)
    notes = support_notes(session)
    if notes:
        console.print(
            "\n[yellow]support notes[/] (* above: exotic inputs the target refuses; "
            "not failures, --strict-layouts makes them so):"
        )
        for note, dtypes in notes.items():
            console.print(f"  {note} [{', '.join(dtypes)}]", markup=False, highlight=False, soft_wrap=True)


def verdict_line(session) -> str:
    """PASSED / FAILED / ERROR, and the dtypes the target does not support."""
    line = VERDICT_LINE[session.verdict]
    regressions = len(session.comparison.regressions) if session.comparison is not None else 0
    if regressions and session.comparison.failed:
        line += f" ({regressions} accuracy regression{'s' * (regressions > 1)} against the baseline)"
    for dtype, why in session.unsupported.items():
        line += f"; {dtype} not supported: {escape(why.removeprefix('the target raised '))}"
    return line


def session_dict(session) -> dict:
    c = session.target.convention
    conv = None
    if c is not None and hasattr(c, "layout") and hasattr(c, "rotary_dim"):
        conv = {"layout": c.layout, "base": c.base, "rotary_dim": c.rotary_dim}
    return {
        "schema_version": SCHEMA_VERSION,
        "target": session.target.name,
        "family": session.target.family,
        "call": session.target.call,
        "convention": conv,
        "capabilities": {
            "backward": session.target.backward,
            "inplace": session.target.inplace,
            "max_position": session.target.max_position,
        },
        "device": session.target.device,
        "options": session.options.echo() if session.options is not None else {},
        "profile": session.run_options.profile,
        "sizes": session.run_options.sizes.spec(),
        "seed": session.run_options.seed,
        "dtypes": session.dtypes,
        "modes": list(session.modes),
        "unsupported_dtypes": dict(session.unsupported),
        "verdict": session.verdict,
        "exit_status": EXIT_STATUS[session.verdict],
        "stopped": session.stopped,
        "causes": list(session.causes),
        "support_notes": [{"note": n, "dtypes": d} for n, d in support_notes(session).items()],
        "compile_warnings": [{"message": m, "count": c} for m, c in session.compile_notes],
        "environment": environment(),
        "results": [r.to_dict() for r in session.results],
        "interface_paths": {label: c.to_dict() for label, c in session.interface_coverage().items()},
        "triton_launches": launches_dict(session),
        **({"baseline": session.comparison.to_dict()} if session.comparison is not None else {}),
    }


def write_json(path: str, session) -> None:
    Path(path).write_text(json.dumps(session_dict(session), indent=2) + "\n")


def write_junit(path: str, session) -> None:
    results = session.results
    unsupported = session.unsupported
    suite = ET.Element(
        "testsuite",
        name=f"ropecheck.{session.target.name}",
        tests=str(len(results) + len(unsupported)),
        failures=str(sum(r.status == "failed" for r in results)),
        errors=str(sum(r.status == "error" for r in results)),
        skipped=str(sum(r.status in ("skipped", "known") for r in results) + len(unsupported)),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    for r in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"ropecheck.{session.target.name}",
            name=f"{r.property}[{column_label(r.dtype, r.mode).replace(' ', '-')}]",
            time=f"{r.seconds:.3f}",
        )
        if r.status in ("failed", "error"):
            node = ET.SubElement(case, "failure" if r.status == "failed" else "error", message=r.message[:500])
            cause = f"root cause {r.cause}" if r.cause else ""
            node.text = "\n".join(
                filter(None, [r.formula, r.message, cause, r.diagnosis, r.counterexample, r.reproduce])
            )
        elif r.status in ("skipped", "known"):
            ET.SubElement(case, "skipped", message=r.message)
        if r.notes:
            ET.SubElement(case, "system-out").text = "\n".join(r.notes)
    for dtype, why in unsupported.items():
        case = ET.SubElement(
            suite, "testcase", classname=f"ropecheck.{session.target.name}", name=f"dtype[{dtype}]", time="0"
        )
        ET.SubElement(case, "skipped", message=f"{dtype} not supported: {why}"[:500])
    _write_tree(suite, path)


def _write_tree(suite: ET.Element, path: str) -> None:
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def unusable_dict(target: str, reason: str, exit_status: int = 2) -> dict:
    """The JSON record of a run that ended before any verdict: the reason in place of results."""
    return {
        "schema_version": SCHEMA_VERSION,
        "target": target,
        "verdict": "unusable",
        "exit_status": exit_status,
        "reason": reason,
        "results": [],
        "environment": environment(),
    }


def write_unusable(json_path, junit_path, target: str, reason: str, exit_status: int = 2) -> None:
    """The record of a run that ended before any verdict (exit 2): the reason in place of
    results. Never raises (it runs on the way out)."""
    try:
        if json_path:
            record = unusable_dict(target, reason, exit_status)
            Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
        if junit_path:
            suite = ET.Element(
                "testsuite", name=f"ropecheck.{target}", tests="1", failures="0", errors="1", skipped="0", time="0"
            )
            case = ET.SubElement(suite, "testcase", classname=f"ropecheck.{target}", name="run", time="0")
            ET.SubElement(case, "error", message=reason[:500]).text = reason
            _write_tree(suite, junit_path)
    except OSError:
        pass
