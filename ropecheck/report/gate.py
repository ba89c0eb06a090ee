"""A baseline comparison at the front doors: ``--baseline`` loaded before the run (a bad
file is a usage error), the session judged against it after (``judge``: the comparison
kept on the session, so its verdict, exit status and JSON record include it;
``--update-baseline`` writes the new record), and the delta table the terminal shows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from ropecheck.report.baseline import (
    Comparison,
    Run,
    check_factor,
    compare,
    describe,
    drawn_differently,
    figures_of,
    load,
    run_of_record,
    runs_of_report,
)
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


def baseline_for(loaded, session):
    """The baseline run of a prepared session's target (``run_for``), checked before the run:
    a report.json without the target is a usage error, and the session is closed then."""
    if loaded is None:
        return None
    try:
        return run_for(loaded, session.target.name, session.target.call)
    except UsageError:
        session.close()
        raise


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
        try:
            Path(options.baseline).parent.mkdir(parents=True, exist_ok=True)
            Path(options.baseline).write_text(json.dumps(record, indent=2) + "\n")
        except OSError as exc:
            raise UsageError(f"--update-baseline: cannot write {options.baseline}: {exc.strerror or exc}") from None
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
    for column in ("check", "figure", "before -> after", "factor", ""):
        table.add_column(column, justify="right" if column == "factor" else "left")
    rows = _rows(comparison)
    for row in rows[:limit]:
        table.add_row(*row)
    if len(rows) > limit:
        table.add_row(f"... {len(rows) - limit} more in the JSON record", "", "", "", "")
    return table


FIGURE_NAMES = {
    "verdict": "verdict",
    "refused": "run",
    "max_error": "largest error",
    "horizon": "horizon",
    "profile": "error at",
}
TABLE_WIDTH = 100  # the delta table's columns unwrapped (a CI log is a pipe: 80 columns)


def _rows(comparison: Comparison) -> list:
    """The delta table's rows: check, figure, before -> after, factor, finding; regressions first."""
    order = {"regression": 0, "improvement": 1, "": 2}
    rows = []
    for d in sorted(comparison.shown, key=lambda d: order[d.finding]):
        prop, dtype, mode, call = d.key
        factor = "" if d.factor is None else "inf" if not math.isfinite(d.factor) else f"{d.factor:.3g}x"
        rows.append(
            (
                f"{prop} {describe((dtype, mode, ''))}",
                FIGURE_NAMES[d.kind] + (f" {d.where.replace('position ', 'm=')}" if d.where else ""),
                f"{_shown(d.before, d.kind)} -> {_shown(d.after, d.kind)}",
                factor,
                {"regression": "[bold red]REGRESSION[/]", "improvement": "[green]improved[/]"}.get(d.finding, ""),
            )
        )
    return rows


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


def _wide(console, table, width: int) -> None:
    """Print ``table`` unwrapped where the output is not a terminal (a CI log)."""
    was = console.width
    if not console.is_terminal and was < width:
        console.width = width
    try:
        console.print(table)
    finally:
        console.width = was


def print_comparison(console, comparison: Optional[Comparison]) -> None:
    if comparison is None:
        return
    if comparison.shown:
        _wide(console, delta_table(comparison), TABLE_WIDTH)
    for label, lines in (("not compared", comparison.not_compared), ("note", comparison.notes)):
        for line in lines:
            console.print(f"  {label}: {line}", markup=False, highlight=False, soft_wrap=True)
    colour = "bold red" if comparison.failed else "green"
    console.print(f"[{colour}]{summary_line(comparison)}[/]", soft_wrap=True)


def regression_text(deltas: list) -> str:
    """Regressions as a failure's text (the pytest plugin's)."""
    lines = []
    for d in deltas:
        factor = "" if d.factor is None else f" ({d.factor:.3g}x)"
        figure = FIGURE_NAMES[d.kind] + (f" {d.where.replace('position ', 'm=')}" if d.where else "")
        lines.append(f"regression: {figure} {_shown(d.before, d.kind)} -> {_shown(d.after, d.kind)}{factor}")
    return "\n".join(lines)


def judge_one(session, loaded, name: str, dtype: str, mode: str, result=None) -> list:
    """The regressions of one check against the baseline (the pytest plugin's test of that
    property): ``result`` as it ran, or None for a dtype the target refuses now."""
    target = session.target
    key = (name, dtype, mode, target.call)
    figures = {} if result is None else {key: figures_of(result.status, result.max_error, result.accuracy)}
    run = session.run_options
    drawn = {
        "profile": run.profile,
        "seed": run.seed,
        "sizes": run.drawn_sizes.spec(),
        "max_examples": session.options.echo().get("max_examples") if session.options is not None else None,
    }
    after = Run("this run", target.name, figures, drawn, dict(session.unsupported))
    before = run_for(loaded, target.name, target.call)
    factor = check_factor(session.options.get("regression_factor") if session.options is not None else None)
    return compare(before, after, factor, only=[key]).regressions


def compare_reports(loaded, report: dict, factor) -> tuple[dict, list]:
    """``ropecheck report --baseline``: {target: Comparison} for the targets both reports
    have, and what could not be compared (targets one of them lacks)."""
    if isinstance(loaded, Run):
        raise UsageError("--baseline: `ropecheck report` compares with an earlier report.json, not a check record")
    now = runs_of_report(report, "this report")
    comparisons = {
        name: compare(loaded[name], run, check_factor(factor)) for name, run in now.items() if name in loaded
    }
    gone, new = [n for n in loaded if n not in now], [n for n in now if n not in loaded]
    missing = [f"{len(gone)} targets in the baseline, not in this report: {', '.join(gone)}"] if gone else []
    missing += [f"{len(new)} targets not in the baseline: {', '.join(new)}"] if new else []
    return comparisons, missing


def print_report_comparison(console, comparisons: dict, missing: list, source: str) -> bool:
    """What changed per target, one table; True when something regressed."""
    from rich.table import Table

    table = Table(title=f"against the baseline {source}", title_justify="left")
    for column in ("target", "check", "figure", "before -> after", "factor", ""):
        table.add_column(column, justify="right" if column == "factor" else "left")
    for name, comparison in comparisons.items():
        for row in _rows(comparison):
            table.add_row(name, *row)
    if table.row_count:
        _wide(console, table, TABLE_WIDTH + 20)
    for name, comparison in comparisons.items():
        for line in comparison.not_compared:
            console.print(f"  not compared: {name}: {line}", markup=False, highlight=False, soft_wrap=True)
    for line in missing:
        console.print(f"  not compared: {line}", markup=False, highlight=False, soft_wrap=True)
    regressed = [name for name, c in comparisons.items() if c.failed]
    r = sum(len(c.regressions) for c in comparisons.values())
    i = sum(len(c.improvements) for c in comparisons.values())
    colour = "bold red" if regressed else "green"
    console.print(
        f"[{colour}]baseline {source}: {len(comparisons)} targets compared; {r} regressions"
        + (f" ({', '.join(regressed)})" if regressed else "")
        + f", {i} improvements[/]",
        soft_wrap=True,
    )
    return bool(regressed)


def pytest_lines(loaded, options, seed) -> list:
    """The pytest run's summary of its baseline: which, at what factor, and whether its
    largest errors could be compared (the tests failed by a regression say the rest)."""
    from ropecheck.properties.runner import RunOptions

    source = loaded.source if isinstance(loaded, Run) else next(iter(loaded.values())).source
    lines = [
        f"ropecheck baseline {source}: each check compared at --rope-regression-factor {options.regression_factor:g}"
    ]
    run = RunOptions(profile=options.profile, seed=seed, sizes=options.sizes)
    drawn = {
        "profile": run.profile,
        "seed": seed,
        "sizes": run.drawn_sizes.spec(),
        "max_examples": options.max_examples,
    }
    befores = [loaded] if isinstance(loaded, Run) else list(loaded.values())[:1]
    for before in befores:
        differ = drawn_differently(before.drawn, drawn)
        if differ:
            said = ", ".join(f"{k} {before.drawn.get(k)} -> {drawn.get(k)}" for k in differ)
            lines.append(f"  not compared: largest errors: the two runs drew different inputs ({said})")
    return lines
