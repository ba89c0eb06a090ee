"""How results are shown and saved: the rich table, failure details, JSON and JUnit XML."""

from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

STATUS_STYLE = {"passed": "[green]pass[/]", "failed": "[bold red]FAIL[/]",
                "skipped": "[dim]skip[/]", "error": "[bold magenta]ERROR[/]",
                "known": "[yellow]known[/]"}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    return {"ropecheck": _version("ropecheck"), "python": platform.python_version(),
            "torch": _version("torch"), "numpy": _version("numpy"),
            "hypothesis": _version("hypothesis"), "platform": platform.platform()}


def _cell(result) -> str:
    text = STATUS_STYLE[result.status]
    if result.max_error is not None and result.status in ("passed", "failed", "known"):
        shown = f"{result.max_error:.2g}"
        if result.status != "passed" and float(shown) <= 1.0:
            shown = ">1"  # a failure just past the bound must not read as 1
        text += f" {shown}"
    return text


def results_table(session) -> Table:
    """Rows: properties; columns: dtypes; each cell the verdict and max error in tolerance
    units (<= 1 passes)."""
    table = Table(title=f"ropecheck: {session.target.name}", title_justify="left")
    table.add_column("property")
    for dtype in session.dtypes:
        table.add_column(dtype, justify="right")
    cells = {(r.property, r.dtype): r for r in session.results}
    for prop in session.properties:
        row = [prop.name]
        for dtype in session.dtypes:
            r = cells.get((prop.name, dtype))
            row.append(_cell(r) if r else "[dim]-[/]")
        table.add_row(*row)
    horizons = []
    for dtype in session.dtypes:
        r = cells.get(("reference", dtype))
        acc = (r.accuracy or {}) if r else {}
        h = acc.get("horizon", "-") if "positions" in acc else "-"
        horizons.append("none" if h is None else str(h))
    if any(h != "-" for h in horizons):
        table.add_section()
        table.add_row("accuracy horizon", *horizons)
    return table


def print_failures(console: Console, session) -> None:
    for r in session.results:
        if r.status not in ("failed", "error", "known"):
            continue
        colour = "yellow" if r.status == "known" else "bold red"
        console.print(f"\n[{colour}]{r.status.upper()}[/] [bold]{r.property}[/] ({r.dtype}): "
                      f"{escape(r.formula)}", soft_wrap=True)
        console.print(f"  {r.message}", markup=False, highlight=False, soft_wrap=True)
        if r.counterexample:
            console.print(f"  minimal counterexample: {r.counterexample}", markup=False, highlight=False, soft_wrap=True)
        if r.reproduce:
            console.print(f"  reproduce: {r.reproduce}", markup=False, highlight=False, soft_wrap=True)


def session_dict(session) -> dict:
    c = session.target.convention
    return {
        "target": session.target.name,
        "convention": None if c is None else {"layout": c.layout, "base": c.base,
                                              "rotary_dim": c.rotary_dim},
        "capabilities": {"backward": session.target.backward, "inplace": session.target.inplace},
        "profile": session.options.profile,
        "seed": session.options.seed,
        "dtypes": session.dtypes,
        "verdict": session.verdict,
        "stopped": session.stopped,
        "environment": environment(),
        "results": [r.to_dict() for r in session.results],
    }


def write_json(path: str, session) -> None:
    Path(path).write_text(json.dumps(session_dict(session), indent=2) + "\n")


def write_junit(path: str, session) -> None:
    results = session.results
    suite = ET.Element("testsuite", name="ropecheck", tests=str(len(results)),
                       failures=str(sum(r.status == "failed" for r in results)),
                       errors=str(sum(r.status == "error" for r in results)),
                       skipped=str(sum(r.status == "skipped" for r in results)),
                       time=f"{sum(r.seconds for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"ropecheck.{session.target.name}",
                             name=f"{r.property}[{r.dtype}]", time=f"{r.seconds:.3f}")
        if r.status in ("failed", "error"):
            node = ET.SubElement(case, "failure" if r.status == "failed" else "error",
                                 message=r.message[:500])
            node.text = "\n".join(filter(None, [r.formula, r.message, r.counterexample, r.reproduce]))
        elif r.status in ("skipped", "known"):
            ET.SubElement(case, "skipped", message=r.message)
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
