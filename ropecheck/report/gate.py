"""A baseline comparison at the front doors: ``--baseline`` loaded before the run (a bad
file is a usage error), the session judged against it after (``judge``: the comparison
kept on the session, so its verdict, exit status and JSON record include it;
``--update-baseline`` writes the new record), and the delta table the terminal shows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from ropecheck.report.baseline import Comparison, Run, check_factor, compare, describe, load, run_of_record
from ropecheck.session.options import UsageError


def run_for(loaded, target: str, call: str) -> Run:
    """The baseline run of ``target`` from what ``load`` read: the record itself, or the
    target's run in a report.json (whose results carry no call form: this run's is taken)."""
    if isinstance(loaded, Run):
        return loaded
    if target not in loaded:
        raise UsageError(f"--baseline: the report has no target {target!r} (it has {', '.join(loaded) or 'none'})")
    run = loaded[target]
    return Run(
        run.source,
        run.target,
        {(p, d, m, call): f for (p, d, m, _), f in run.figures.items()},
        run.drawn,
        run.unsupported,
        run.convention,
    )


def baseline_of(options) -> Optional[object]:
    """What ``--baseline`` names, loaded before the run (a bad file is a usage error, exit 2);
    None without it, or with --update-baseline and no file yet (the first baseline)."""
    if options.get("update_baseline") and not options.get("baseline"):
        raise UsageError("--update-baseline needs --baseline PATH (the file to write)")
    if not options.get("baseline"):
        return None
    if options.get("update_baseline") and not Path(options.baseline).exists():
        return None
    return load(options.baseline)


def judge(session, loaded) -> Optional[Comparison]:
    """Compare a session that has run with the baseline ``loaded``; the comparison is kept on
    the session (its verdict, exit status and record include it). --update-baseline: shown,
    not failed, and this run's record becomes the baseline."""
    from ropecheck.report.output import session_dict

    options = session.options
    if loaded is None and not options.get("update_baseline"):
        return None
    record = session_dict(session)
    if loaded is not None:
        before = run_for(loaded, session.target.name, session.target.call)
        comparison = compare(before, run_of_record(record, "this run"), check_factor(options.get("regression_factor")))
        comparison.updating = bool(options.get("update_baseline"))
        session.comparison = comparison
        record = session_dict(session)
    if options.get("update_baseline"):
        record.pop("baseline", None)
        Path(options.baseline).write_text(json.dumps(record, indent=2) + "\n")
    return session.comparison


def _shown(value, kind: str) -> str:
    if value is None:
        return "none" if kind == "horizon" else "-"
    if isinstance(value, float):
        return f"{value:.2g}"
    return str(value)


def delta_table(comparison: Comparison, limit: int = 40):
    """The rich table of what changed beyond one rounding: before -> after, factor, and the
    finding; regressions first."""
    from rich.table import Table

    table = Table(title=f"against the baseline {comparison.baseline}", title_justify="left")
    for column in ("check", "figure", "before -> after", "factor", "finding"):
        table.add_column(column, justify="right" if column == "factor" else "left")
    order = {"regression": 0, "improvement": 1, "": 2}
    rows = sorted(comparison.shown, key=lambda d: order[d.finding])
    for d in rows[:limit]:
        prop, dtype, mode, call = d.key
        factor = "" if d.factor is None else "inf" if not math.isfinite(d.factor) else f"{d.factor:.3g}x"
        style = {"regression": "[bold red]REGRESSION[/]", "improvement": "[green]improved[/]"}.get(d.finding, "")
        table.add_row(
            f"{prop} {describe((dtype, mode, ''))}",
            d.kind + (f" at {d.where}" if d.where else ""),
            f"{_shown(d.before, d.kind)} -> {_shown(d.after, d.kind)}",
            factor,
            style,
        )
    if len(rows) > limit:
        table.add_row(f"... {len(rows) - limit} more in the JSON record", "", "", "", "")
    return table


def summary_line(comparison: Comparison) -> str:
    r, i = len(comparison.regressions), len(comparison.improvements)
    moved = len(comparison.shown) - r - i
    small = len(comparison.deltas) - r - i - moved
    line = (
        f"baseline {comparison.baseline}: {comparison.compared} checks compared at factor "
        f"{comparison.factor:g}; {r} regression{'s' * (r != 1)}, {i} improvement{'s' * (i != 1)}, "
        f"{moved} other figure{'s' * (moved != 1)} moved within the factor, {small} within one rounding"
    )
    if comparison.updating:
        line += "; --update-baseline: not failed, this run's record is the new baseline"
    return line


def print_comparison(console, comparison: Optional[Comparison]) -> None:
    if comparison is None:
        return
    if comparison.shown:
        console.print(delta_table(comparison))
    for label, lines in (("not compared", comparison.not_compared), ("note", comparison.notes)):
        for line in lines:
            console.print(f"  {label}: {line}", markup=False, highlight=False, soft_wrap=True)
    colour = "bold red" if comparison.failed else "green"
    console.print(f"[{colour}]{summary_line(comparison)}[/]", soft_wrap=True)


def regression_text(deltas: list) -> str:
    """A regression as a failure's text (the pytest plugin's)."""
    lines = []
    for d in deltas:
        factor = "" if d.factor is None else f" ({d.factor:.3g}x)"
        where = f" at {d.where}" if d.where else ""
        change = f"{_shown(d.before, d.kind)} -> {_shown(d.after, d.kind)}"
        lines.append(f"regression against the baseline: {d.kind}{where} {change}{factor}")
    return "\n".join(lines)
