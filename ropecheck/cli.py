"""``ropecheck`` command line: ``check``, ``bench``, ``identify``, ``report`` and ``list``, their
options made from the option table (``ropecheck.session.options``).

Exit status: 0 every check passed; 1 a check failed; 2 usage error, or the target could
not be loaded or called (the message says why; a traceback only with --debug). ``bench``:
0 every shape timed and right (and not slower than its baseline); 1 a shape wrong, failed,
or slower.
"""

from __future__ import annotations

import os
import sys
import traceback

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ropecheck.calling.in_process import on_abort
from ropecheck.commands import EXIT_FAILED, EXIT_PASSED, Records, fail, table_command
from ropecheck.report import gate
from ropecheck.report.output import (
    EXIT_STATUS,
    print_failures,
    print_notes,
    results_table,
    verdict_line,
    write_json,
    write_junit,
)
from ropecheck.session import helper
from ropecheck.session.options import UsageError
from ropecheck.session.prepare import prepare
from ropecheck.session.spec import UnusableTarget, name_of


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ropecheck")
def main():
    """Numerical verification and property testing for rotary position embeddings."""


def entry():
    """The ``ropecheck`` command: the CLI, then an exit that neither the target's lingering
    threads (with --in-process) nor its workers can hold up."""
    try:
        main(prog_name="ropecheck")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finish(code)


def finish(code: int):
    import threading

    from ropecheck.calling.worker import close_all

    close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    lingering = [
        t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon and t.is_alive()
    ]
    if lingering:  # a target's thread must not keep ropecheck (and a CI job) waiting
        os._exit(code)
    sys.exit(code)


def progress_bar(console: Console) -> Progress:
    """The bar a run shows while it works (gone when it ends)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@table_command(
    main,
    "check",
    "Check TARGET (path/to/file.py:func, package.module:attr or a built-in name; "
    "default: the built-in rotate-half) against the RoPE properties.",
)
def check(options):
    console = Console(stderr=False, highlight=False)
    records = Records(options.json, options.junit, name_of(options))
    on_abort(records.unusable)  # the in-process watchdog's last act (a hang in the warm-up too)
    try:
        loaded = gate.baseline_of(options)
        session = prepare(options, lambda line: console.print(line, soft_wrap=True))  # a header line is one line
        loaded = gate.baseline_for(loaded, session)
    except UnusableTarget as exc:
        fail(console, str(exc), records=records)
    except UsageError as exc:
        records.unusable(f"usage error: {exc}")
        raise click.UsageError(str(exc)) from None
    except KeyboardInterrupt:
        fail(console, "interrupted", EXIT_FAILED, records)
    except Exception as exc:  # our own bug, while the target is loaded and warmed up: say so plainly
        if options.debug:
            traceback.print_exc()
        fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)", records=records)
    from ropecheck.properties.core.sizes import pool_line, sizes_lines

    target, run = session.target, session.run_options
    console.print(
        f"Profile {run.profile}"
        + (f", seed {run.seed}" if run.seed is not None else ", derandomized")
        + ("" if target.max_position is None else f", positions 0 .. {target.max_position}")
        + ("" if target.device == "cpu" else f", inputs on {target.device}")
    )
    for line in sizes_lines(run.sizes, target, session.dtypes) + [pool_line(session.eager_sizes)]:
        if line:
            console.print(line)
    try:
        with progress_bar(console) as progress:
            checks = len(session.rows) + (len(session.modes) - 1) * len(session.properties)  # the range probe once
            task = progress.add_task("checking", total=len(session.dtypes) * checks)

            def advance(result):
                progress.update(task, advance=1, description=f"{result.property} ({result.dtype})")

            session.run(advance, helper.start(session))
    except KeyboardInterrupt:
        fail(console, "interrupted", EXIT_FAILED, records)
    except Exception as exc:  # our own bug: say so plainly
        if options.debug:
            traceback.print_exc()
        fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)", records=records)
    finally:
        session.close()

    console.print(results_table(session))
    print_failures(console, session)
    print_notes(console, session, debug=options.debug)
    try:
        gate.print_comparison(console, gate.judge(session, loaded))
    except UsageError as exc:
        fail(console, str(exc), records=records)
    if session.stopped:
        console.print(f"[bold red]stopped early:[/] {session.stopped}")
    if options.json:
        write_json(options.json, session)
    if options.junit:
        write_junit(options.junit, session)
    if options.debug:
        for r in session.results:
            if r.status == "error":
                console.print(r.message, markup=False)
    console.print(verdict_line(session), soft_wrap=True)
    sys.exit(EXIT_STATUS[session.verdict])


@table_command(
    main,
    "report",
    "Run the suite over every available target and write a conformance report "
    "(markdown, JSON with an execution envelope, error-against-position plots).",
)
def report(options):
    import shlex
    from pathlib import Path

    from ropecheck.properties.nd.families import ND_FAMILY_NAMES
    from ropecheck.report import conformance
    from ropecheck.report.catalog import entries

    console = Console(highlight=False)
    try:
        loaded = gate.baseline_of(options)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    if loaded is not None and not isinstance(loaded, dict):
        raise click.UsageError(
            f"--baseline: {options.baseline} is a check record; `ropecheck report` takes a report.json"
        )
    # RoPE, 1-D and N-D; the xPos and builder families are judged by `ropecheck check --family`
    # (docs/families.md)
    rotations = {"rope", *ND_FAMILY_NAMES}
    catalog = {e.name: e for e in entries() if e.family in rotations}
    names = options.report_targets or []
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise click.UsageError(f"unknown target(s): {', '.join(unknown)} (see `ropecheck list`)")
    chosen = [n for n in catalog if (not names or n in names)]
    unavailable = {n: catalog[n].why_unavailable for n in chosen if not catalog[n].available}
    reports = []
    for name in (n for n in chosen if n not in unavailable):
        console.print(f"checking {name} ...")
        reports.append(
            conformance.run_target(catalog[name], options.dtypes, options.profile, options.seed, options.timeout)
        )
    words = (
        ["ropecheck", "report", "--out", options.out]
        + [w for n in names for w in ("--target", n)]
        + [w for d in options.dtypes or () for w in ("--dtype", d)]
        + (["--profile", options.profile] if options.profile != "ci" else [])
        + (["--seed", str(options.seed)] if options.seed is not None else [])
    )
    data = conformance.write(
        Path(options.out), reports, unavailable, conformance.envelope(options.profile, options.seed), shlex.join(words)
    )
    failed = [
        n
        for n, t in data["targets"].items()
        if any(s.get("verdict") in ("failed", "error") for s in t["dtypes"].values())
    ]
    console.print(
        f"wrote {options.out}/report.md, report.json and plots: {len(reports)} targets, "
        f"{len(failed)} with unexplained failures" + (f" ({', '.join(failed)})" if failed else "")
    )
    if loaded is not None:
        try:
            comparisons, missing = gate.compare_reports(loaded, data, options.regression_factor)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
        if gate.print_report_comparison(console, comparisons, missing, options.baseline):
            sys.exit(EXIT_FAILED)


@table_command(
    main,
    "list",
    "List every target: built-ins and third-party adapters, available or not (and why), "
    "with the convention each declares and its capabilities.",
)
def list_targets(options):
    from rich.table import Table

    from ropecheck.report.catalog import entries

    # a pipe or CI log gets a readable width instead of rich's 80 columns
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    rows = [e for e in entries() if e.available or not options.available]
    table_ = Table(
        title=f"targets ({sum(e.available for e in rows)} of {len(rows)} available here)",
        title_justify="left",
        show_lines=False,
    )
    table_.add_column("name", no_wrap=True)
    for column in ("library", "convention", "capabilities"):
        table_.add_column(column, overflow="fold")
    table_.add_column("here", no_wrap=True)
    for e in rows:
        table_.add_row(
            e.name + (" (default)" if e.default else ""),
            e.library,
            escape(e.convention),
            e.capabilities,
            "[green]yes[/]" if e.available else "[red]no[/]",
        )
    console.print(table_)
    for e in rows:
        if not e.available:
            console.print(f"  {e.name}: unavailable: {e.why_unavailable}", markup=False)
    for e in rows:
        if e.notes:
            console.print(f"  {e.name}: {e.notes}", markup=False)
    _list_presets(console)


def _list_presets(console) -> None:
    """The library interfaces (``--api``): each preset's signature, its library, and the
    targets called through it."""
    from ropecheck.calling.presets import PRESETS
    from ropecheck.report.catalog import entries

    through: dict = {}
    for e in entries():
        if e.api:
            through.setdefault(e.api, []).append(e.name)
    console.print("\nlibrary interfaces (--api NAME: a kernel in that signature, checked with no wrapper):")
    for name, preset in PRESETS.items():
        targets = ", ".join(through.get(name, [])) or "none"
        console.print(
            f"  --api {name}: {preset.signature()}; {preset.library}; built-in targets: {targets}",
            markup=False,
            soft_wrap=True,
        )
        classes = "; ".join(
            f"{f.name}: {', '.join(c.name for c in f.classes if c.name != 'n/a')}" for f in preset.space.factors
        )
        console.print(f"    argument classes drawn (every pair in every run): {classes}", markup=False, soft_wrap=True)
        if preset.mrope:
            alone = " only" if preset.mrope == "only" else ""
            console.print(
                f"    M-RoPE{alone}: --family mrope --sections T,H,W, positions (3, T), text, image and video tokens",
                markup=False,
                soft_wrap=True,
            )


@table_command(
    main,
    "identify",
    "Infer TARGET's pairing, direction, frequencies (base, scaling) and rotary dim by "
    "probing it, and print them as ropecheck flags. --family nd (or axial, mrope, pairs) "
    "--axes N: an N-D rotation rope(x, positions (batch, seq, N)), named as --family axial, "
    "mrope or a --pair-table. Exit 0: a rotary embedding, identified; 1: not a rotary "
    "embedding (the reasons are printed); 2: the target is unusable.",
)
def identify(options):
    from ropecheck.identification.engine import UnusableTarget as Unusable
    from ropecheck.identification.engine import identify_spec
    from ropecheck.identification.nd import identify_nd_spec
    from ropecheck.identification.output import print_identification, print_nd_identification
    from ropecheck.identification.output import write_json as write_identification
    from ropecheck.properties.nd.families import ND_FAMILY_NAMES

    console = Console(highlight=False)
    family = options.family or "rope"
    if family not in ("rope", *ND_FAMILY_NAMES):
        raise click.UsageError(f"identify takes --family rope or an N-D rotation ({', '.join(ND_FAMILY_NAMES)})")
    nd = family != "rope"
    if not nd and {"axes", "write_table", "positions"} & options.given:
        raise click.UsageError("--axes, --positions and --write-table apply to identify --family nd (an N-D rotation)")
    try:
        if nd:
            ident = identify_nd_spec(
                options.target,
                options.axes,
                options.timeout,
                options.probe_max_position,
                options.in_process,
                options.write_table,
                options.positions == "float",
            )
        else:
            ident = identify_spec(options.target, options.timeout, options.probe_max_position, options.in_process)
    except Unusable as exc:
        fail(console, f"cannot identify target {options.target!r}: {exc}")
    except Exception as exc:  # our own bug: say so plainly (KeyboardInterrupt: click aborts)
        traceback.print_exc() if options.debug else None
        fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
    print_nd_identification(console, ident) if nd else print_identification(console, ident)
    if options.json:
        write_identification(options.json, ident)
    sys.exit(EXIT_PASSED if ident.rotary else EXIT_FAILED)


@table_command(
    main,
    "bench",
    "Time TARGET (the same target, convention and interface flags as check) at a model's decode and prefill "
    "shapes: each output first checked against the float64 reference (a wrong kernel is reported, not timed), "
    "then timed interleaved with a copy of the bytes it must move on the same device; --baseline gates a "
    "slowdown. Exit 0: every shape timed, right and not slower; 1: a shape wrong, failed or slower; 2: unusable. "
    "See docs/benchmarks.md.",
)
def bench(options):
    from ropecheck.bench import output
    from ropecheck.bench.run import device_name, prepare

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)  # the table's 9 columns
    try:
        run = prepare(options)
    except UnusableTarget as exc:
        fail(console, str(exc))
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # our own bug: say so plainly
        traceback.print_exc() if options.debug else None
        fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
    name = run.subject.name
    device = device_name(run.device)
    console.print(
        f"Bench {escape(name)} on {escape(device)}: {len(run.rows_to_time)} shapes, "
        f"up to {run.plan.budget:g} s of sampling each"
    )
    for shape, why in run.left_out:
        console.print(f"[yellow]left out {escape(shape)}: {escape(why)}[/]")
    try:
        with progress_bar(console) as progress:
            task = progress.add_task("timing", total=len(run.rows_to_time))
            run.run(lambda row: progress.update(task, advance=1, description=row.name))
    except KeyboardInterrupt:
        run.close()
        fail(console, "interrupted", EXIT_FAILED)
    except Exception as exc:  # our own bug: say so plainly
        run.close()
        traceback.print_exc() if options.debug else None
        fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
    run.close()
    compared = run.other.name if run.other else (options.bench_baseline or "")
    console.print(output.table(run.rows, f"{name} on {device}", compared))
    for row in run.rows:
        if row.status != "timed":
            console.print(f"[red]{escape(row.name)}: {row.status}:[/] {escape(row.message)}", soft_wrap=True)
        for note in row.notes:
            console.print(f"[yellow]{escape(row.name)}:[/] {escape(note)}", soft_wrap=True)
        if row.gate is not None and row.gate.verdict != "unchanged":
            console.print(f"{escape(row.name)}: {escape(row.gate.message)}", soft_wrap=True)
    if options.json:
        output.write(options.json, run.rows, name, run.device, device, run.left_out)
        console.print(f"wrote {escape(options.json)} (pytest-benchmark's format)")
    status = run.exit_status
    slower = [r.name for r in run.rows if r.gate is not None and r.gate.failed]
    wrong = [r.name for r in run.rows if r.status != "timed"]
    if status == 0:
        console.print(
            f"[bold green]BENCH PASSED[/]: {len(run.rows)} shapes timed"
            + (", none slower" if any(r.gate for r in run.rows) else "")
        )
    else:
        said = ([f"{len(wrong)} not timed (wrong or failed)"] if wrong else []) + (
            [f"{len(slower)} slower than allowed ({100 * run.threshold:g} %)"] if slower else []
        )
        console.print(f"[bold red]BENCH FAILED[/]: {'; '.join(said)}")
    finish(status)


if __name__ == "__main__":
    entry()
