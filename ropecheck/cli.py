"""``ropecheck`` command line.

Exit status: 0 every check passed; 1 a check failed; 2 usage error, or the target could
not be loaded or called (the message says why; a traceback only with --debug).
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ropecheck.properties.runner import DEFAULT_PROFILE, PROFILES, RunOptions
from ropecheck.properties.sizes import sizes_lines
from ropecheck.reference import LAYOUTS
from ropecheck import known_failures
from ropecheck.builtins import BUILTINS, DEFAULT_TARGET
from ropecheck.calling import DEFAULT_TIMEOUT, on_abort
from ropecheck.families import FAMILIES as ND_FAMILIES, FamilyError
from ropecheck.output import (EXIT_STATUS, print_failures, print_notes, results_table, verdict_line,
                              write_json, write_junit, write_unusable)
from ropecheck.session import Session, UnusableTarget, prepare, resolve_dtypes, run_seed, spec_for
from ropecheck.call_forms import CALL_FORMS

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2


class Records:
    """Where this run's JSON and JUnit go; written on every exit, 2 included."""

    def __init__(self, json_path=None, junit_path=None, target: str = DEFAULT_TARGET):
        self.json_path, self.junit_path, self.target = json_path, junit_path, target

    @classmethod
    def from_args(cls, args) -> "Records":
        """Found in the raw arguments, for errors before click has parsed them."""
        found = {"--json": None, "--junit": None}
        for i, word in enumerate(args):
            for flag in found:
                if word == flag and i + 1 < len(args):
                    found[flag] = args[i + 1]
                elif word.startswith(flag + "="):
                    found[flag] = word.split("=", 1)[1]
        target = next((w for w in args if not w.startswith("-")), DEFAULT_TARGET)
        return cls(found["--json"], found["--junit"], target)

    def unusable(self, reason: str, exit_status: int = EXIT_UNUSABLE) -> None:
        write_unusable(self.json_path, self.junit_path, self.target, reason, exit_status)


def _fail(console: Console, message: str, code: int = EXIT_UNUSABLE, records: Records | None = None):
    console.print(f"[bold red]ropecheck:[/] {message}", highlight=False, soft_wrap=True)
    if records is not None:
        records.unusable(message, code)
    sys.exit(code)


class RecordedCommand(click.Command):
    """A command whose usage errors (found while parsing) still leave the JSON / JUnit
    record the user asked for."""

    def parse_args(self, ctx, args):
        raw = list(args)  # click's parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            Records.from_args(raw).unusable(f"usage error: {exc.format_message()}")
            raise


class GroupedOption(click.Option):
    """An option that --help lists under the heading of what it configures."""

    def __init__(self, *args, group: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group


class GroupedArgument(click.Argument):
    """An argument with a row in its --help group (click before 8.5 has no help for
    arguments, and 8.5 would list it in a section of its own)."""

    def __init__(self, *args, group: str, description: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.group, self.description = group, description


OTHER_OPTIONS = "Other options"


class GroupedCommand(RecordedCommand):
    """A command whose --help lists its parameters under group headings, in the order the
    groups first appear; what is in no group (--help) comes last."""

    def format_options(self, ctx, formatter):
        groups: dict = {}
        for param in self.get_params(ctx):
            if isinstance(param, GroupedArgument):
                row = (param.human_readable_name, param.description)
            elif isinstance(param, click.Argument):
                continue
            else:
                row = param.get_help_record(ctx)
            if row is not None:
                groups.setdefault(getattr(param, "group", OTHER_OPTIONS), []).append(row)
        for title, rows in sorted(groups.items(), key=lambda item: item[0] == OTHER_OPTIONS):
            with formatter.section(title):
                formatter.write_dl(rows)


def grouped(group: str):
    """``click.option`` for the options of one --help group."""
    return lambda *decls, **attrs: click.option(*decls, cls=GroupedOption, group=group, **attrs)


def _reproduce_command(argv_target, spec, dtypes, profile, seed, extra=()) -> str:
    words = ["ropecheck", "check"] + ([argv_target] if argv_target else []) + spec.flags()
    for d in dtypes:
        if d != "-":  # a position builder takes no tensors
            words += ["--dtype", d]
    words += ["--profile", profile]
    if seed is not None:
        words += ["--seed", str(seed)]
    return shlex.join(words + list(extra))


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
    from ropecheck.worker import close_all
    import threading

    close_all()
    sys.stdout.flush()
    sys.stderr.flush()
    lingering = [t for t in threading.enumerate() if t is not threading.current_thread()
                 and not t.daemon and t.is_alive()]
    if lingering:  # a target's thread must not keep ropecheck (and a CI job) waiting
        os._exit(code)
    sys.exit(code)


MAX_POSITION_RANGE = click.IntRange(255, 2**24)


TARGET_GROUP = "Target"
target_option = grouped(TARGET_GROUP)
convention_option = grouped("Convention (what the target computes)")
family_option = grouped("Family (N-D, multimodal, position builders, xPos)")
run_option = grouped("Run")
output_option = grouped("Output")


@main.command(cls=GroupedCommand)
@click.argument("target", required=False, cls=GroupedArgument, group=TARGET_GROUP,
                description="path/to/file.py:func, package.module:attr or a built-in name "
                            "(default: the built-in rotate-half).")
@target_option("--call", type=click.Choice(tuple(CALL_FORMS)),
               help="The target's call form: x = rope(x, positions) -> y; qk = rope(q, k, positions) -> "
                    "(q_out, k_out) with k_heads dividing q_heads; packed = rope(x, cu_seqlens, positions) "
                    "-> y on (total, heads, head_dim). Default: what the target declares, else x.")
@target_option("--in-process", is_flag=True,
               help="Call the target in ropecheck's own process, not in a worker process (for a "
                    "target that cannot be imported twice; a crash then ends ropecheck).")
@target_option("--max-position", type=MAX_POSITION_RANGE,
               help="Declared position range: positions 0 .. N are drawn, shifted into and swept "
                    "(default 2^24 = 16777216; at least 255).")
@target_option("--device", help="Where the target's inputs are made: cpu, cuda or cuda:N, with their strides "
                                 "and storage; the float64 reference stays on the host (default: cpu, or "
                                 "the device the target declares). Exit 2 on a machine without it.")
@target_option("--no-backward", is_flag=True, help="The target has no backward: skip gradient checks.")
@target_option("--inplace", is_flag=True, help="The target writes its output into x and returns it.")
@convention_option("--layout", type=click.Choice(LAYOUTS),
                   help="Pairing layout. Without it only spec-free checks run.")
@convention_option("--base", type=float, help="Frequency base (default 10000).")
@convention_option("--rotary-dim", type=int, help="Rotated features (default: all of head_dim).")
@convention_option("--scaling", help="Position scaling: KIND[:key=value,...] (linear, ntk, dynamic, "
                   "yarn, llama3, longrope), a JSON object of HF rope_parameters, or @file.json.")
@family_option("--family", type=click.Choice(ND_FAMILIES),
               help="N-D / multimodal target: axial, mrope, nd, or a position builder "
                    "(rope-tie-builder, rope-tv-builder, mrope-builder); xpos: xpos(q, k, positions) -> "
                    "(q_out, k_out). See README 'N-D and multimodal'.")
@family_option("--axes", type=int, help="With --family: number of position axes.")
@family_option("--sections", help="With --family mrope: rotated pairs per axis, e.g. 16,24,24.")
@family_option("--mrope-interleaved", is_flag=True,
               help="With --family mrope: sections interleaved over the pairs (Qwen3-VL), not in chunks.")
@family_option("--split", help="With --family axial: features per axis, e.g. 32,32 (default equal).")
@family_option("--nd-base", help="With --family axial: one frequency base per axis, e.g. 10000,100.")
@family_option("--scale-base", type=float,
               help="With --family xpos: the scale base s of zeta^(m/s) (default 512).")
@family_option("--gamma", type=float,
               help="With --family xpos: zeta_i = (2i/d + gamma)/(1 + gamma) (default 0.4).")
@run_option("--profile", type=click.Choice(list(PROFILES)), default=DEFAULT_PROFILE, show_default=True,
            help="Example budget: ci (derandomized), dev, thorough; production (derandomized, at "
                 "production sizes).")
@run_option("--sizes", "sizes",
            help="Input sizes: toy (every profile but production) or production (head sizes 64..512, seq "
                 "up to 8192, q/k head ratios 1/4/8/32, and on a CUDA device with the memory one input past "
                 "2^31 elements), then key=value overrides, e.g. production,head_dims=192/256,max_seq=4096.")
@run_option("--seed", type=int, help="Hypothesis seed (default: random, printed).")
@run_option("--dtype", "dtypes", multiple=True,
            help="dtype to check (float32, bfloat16, float16, float64); repeat or comma-separate.")
@run_option("--mode", "run_modes", multiple=True,
            help="How the target is run (repeatable): eager (default), compile (torch.compile, inductor), "
                 "autocast / autocast-fp16 (under torch.autocast with bf16 / fp16), cudagraph (captured "
                 "and replayed in a CUDA graph; --device cuda only). Each mode gets its own columns.")
@run_option("--property", "property_names", multiple=True, help="Run only these properties.")
@run_option("--max-examples", type=click.IntRange(1), help="Override the profile's examples per check.")
@run_option("--timeout", type=float, default=DEFAULT_TIMEOUT, show_default=True,
            help="Seconds one call of the target may take.")
@run_option("--strict-layouts", is_flag=True,
            help="A refusal of an exotic memory layout (the layouts probe) fails instead of "
                 "being a support note.")
@run_option("--known-failures", "known_paths", multiple=True, type=click.Path(dir_okay=False),
            help="TOML file of known failures (repeatable); they show as 'known', not failed.")
@run_option("--no-known-failures", is_flag=True,
            help="Ignore the known failures shipped with ropecheck for its adapters.")
@output_option("--json", "json_path", type=click.Path(dir_okay=False), help="Write results as JSON.")
@output_option("--junit", "junit_path", type=click.Path(dir_okay=False), help="Write results as JUnit XML.")
@output_option("--debug", is_flag=True, help="Show tracebacks.")
def check(target, layout, base, rotary_dim, scaling, max_position, dtypes, no_backward, inplace,
          profile, sizes, seed, property_names, max_examples, timeout, strict_layouts, in_process,
          json_path, junit_path, known_paths, no_known_failures, debug, family=None, axes=None,
          sections=None, split=None, nd_base=None, mrope_interleaved=False, scale_base=None, gamma=None,
          call=None, device=None, run_modes=()):
    """Check TARGET (path/to/file.py:func, package.module:attr or a built-in name;
    default: the built-in rotate-half) against the RoPE properties."""
    console = Console(stderr=False, highlight=False)
    records = Records(json_path, junit_path, target or DEFAULT_TARGET)
    on_abort(records.unusable)  # the in-process watchdog's last act (a hang in the warm-up too)
    defaults = () if no_known_failures else (known_failures.DEFAULT_FILE,)
    try:
        options = RunOptions(profile=profile, seed=seed, timeout=timeout, max_examples=max_examples,
                             strict_layouts=strict_layouts, sizes=sizes)
        spec = spec_for(target, family, layout=layout, base=base, nd_base=nd_base, rotary_dim=rotary_dim,
                        scaling=scaling, axes=axes, sections=sections, split=split,
                        mrope_interleaved=mrope_interleaved, scale_base=scale_base, gamma=gamma,
                        max_position=max_position, backward=not no_backward, inplace=inplace,
                        in_process=in_process, call=call, device=device)
        properties = spec.properties(property_names)
        known = known_failures.load([*defaults, *known_paths])
        prepared = prepare(spec, dtypes, timeout, console.print, run_modes)
    except UnusableTarget as exc:
        _fail(console, str(exc), records=records)
    except FamilyError as exc:
        _fail(console, str(exc), records=records)
    except ValueError as exc:
        records.unusable(f"usage error: {exc}")
        raise click.UsageError(str(exc))
    except KeyboardInterrupt:
        _fail(console, "interrupted", EXIT_FAILED, records)
    built, usable, run_modes = prepared.target, prepared.dtypes, prepared.modes

    seed = run_seed(seed, profile)
    options.seed = seed
    extra = ([f"--max-examples={max_examples}"] if max_examples else []) + \
        ([f"--timeout={timeout:g}"] if timeout != DEFAULT_TIMEOUT else []) + \
        (["--strict-layouts"] if strict_layouts else []) + options.sizes_flag
    session = Session(built, usable, properties, options, known=known, crashes=prepared.crashes,
                      unsupported=prepared.unsupported, range_probe=spec.range_probe(property_names),
                      reproduce=_reproduce_command(target, spec, usable, profile, seed, extra), modes=run_modes)
    console.print(f"Profile {profile}" + (f", seed {seed}" if seed is not None else ", derandomized")
                  + ("" if built.max_position is None else f", positions 0 .. {built.max_position}")
                  + ("" if getattr(built, "device", "cpu") == "cpu" else f", inputs on {built.device}"))
    for line in sizes_lines(options.sizes, built, usable):
        console.print(line)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            checks = len(session.rows) + (len(run_modes) - 1) * len(properties)  # the range probe once
            task = progress.add_task("checking", total=len(usable) * checks)

            def advance(result):
                progress.update(task, advance=1, description=f"{result.property} ({result.dtype})")

            session.run(advance)
    except KeyboardInterrupt:
        _fail(console, "interrupted", EXIT_FAILED, records)
    except Exception as exc:  # our own bug: say so plainly
        if debug:
            traceback.print_exc()
        _fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)", records=records)

    console.print(results_table(session))
    print_failures(console, session)
    print_notes(console, session)
    if session.stopped:
        console.print(f"[bold red]stopped early:[/] {session.stopped}")
    if json_path:
        write_json(json_path, session)
    if junit_path:
        write_junit(junit_path, session)
    if debug:
        for r in session.results:
            if r.status == "error":
                console.print(r.message, markup=False)
    console.print(verdict_line(session), soft_wrap=True)
    sys.exit(EXIT_STATUS[session.verdict])


@main.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="docs/report",
              show_default=True, help="Folder for report.md, report.json and the plots.")
@click.option("--target", "names", multiple=True, help="Only these targets (repeatable).")
@click.option("--dtype", "dtypes", multiple=True, help="Only these dtypes (repeatable).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default="ci", show_default=True)
@click.option("--seed", type=int, help="Hypothesis seed (default: derandomized ci profile).")
@click.option("--timeout", type=float, default=DEFAULT_TIMEOUT, show_default=True)
def report(out_dir, names, dtypes, profile, seed, timeout):
    """Run the suite over every available target and write a conformance report
    (markdown, JSON with an execution envelope, error-against-position plots)."""
    from pathlib import Path

    from ropecheck import report as conformance
    from ropecheck.catalog import entries

    console = Console(highlight=False)
    from ropecheck.adapters.nd_registry import ND_ADAPTERS

    # N-D targets are judged by `ropecheck check --family` (README), not by the 1-D suite
    catalog = {e.name: e for e in entries() if e.name not in ND_ADAPTERS}
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise click.UsageError(f"unknown target(s): {', '.join(unknown)} (see `ropecheck list`)")
    chosen = [n for n in catalog if (not names or n in names)]
    dtype_list, _ = resolve_dtypes(dtypes, None) if dtypes else (None, False)
    unavailable = {n: catalog[n].why_unavailable for n in chosen if not catalog[n].available}
    options = RunOptions(profile=profile, seed=seed, timeout=timeout)
    known = known_failures.load()
    reports = []
    for name in (n for n in chosen if n not in unavailable):
        console.print(f"checking {name} ...")
        reports.append(conformance.run_target(catalog[name], dtype_list, options, known))
    words = ["ropecheck", "report", "--out", out_dir] + [w for n in names for w in ("--target", n)] \
        + [w for d in dtypes for w in ("--dtype", d)] + (["--profile", profile] if profile != "ci" else []) \
        + (["--seed", str(seed)] if seed is not None else [])
    data = conformance.write(Path(out_dir), reports, unavailable,
                             conformance.envelope(profile, seed), shlex.join(words))
    failed = [n for n, t in data["targets"].items()
              if any(s.get("verdict") in ("failed", "error") for s in t["dtypes"].values())]
    console.print(f"wrote {out_dir}/report.md, report.json and plots: {len(reports)} targets, "
                  f"{len(failed)} with unexplained failures" + (f" ({', '.join(failed)})" if failed else ""))


@main.command(name="list")
@click.option("--available", is_flag=True, help="Only the targets that can run here.")
def list_targets(available):
    """List every target: built-ins and third-party adapters, available or not (and why),
    with the convention each declares and its capabilities."""
    from rich.table import Table

    from ropecheck.catalog import entries

    # a pipe or CI log gets a readable width instead of rich's 80 columns
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    rows = [e for e in entries() if e.available or not available]
    table = Table(title=f"targets ({sum(e.available for e in rows)} of {len(rows)} available here)",
                  title_justify="left", show_lines=False)
    table.add_column("name", no_wrap=True)
    for column in ("library", "convention", "capabilities"):
        table.add_column(column, overflow="fold")
    table.add_column("here", no_wrap=True)
    for e in rows:
        table.add_row(e.name + (" (default)" if e.default else ""), e.library, escape(e.convention),
                      e.capabilities, "[green]yes[/]" if e.available else "[red]no[/]")
    console.print(table)
    for e in rows:
        if not e.available:
            console.print(f"  {e.name}: unavailable: {e.why_unavailable}", markup=False)
    for e in rows:
        if e.notes:
            console.print(f"  {e.name}: {e.notes}", markup=False)


# --- identify: infer a target's convention by probing it -------------------------------

@main.command()
@click.argument("target")
@click.option("--timeout", type=float, default=DEFAULT_TIMEOUT, show_default=True,
              help="Seconds one call of the target may take.")
@click.option("--max-position", type=click.IntRange(1), default=2**24, show_default=True,
              help="Largest position a probe may use.")
@click.option("--in-process", is_flag=True,
              help="Call the target in ropecheck's own process, not in a worker process.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the result as JSON.")
@click.option("--debug", is_flag=True, help="Show tracebacks.")
def identify(target, timeout, max_position, in_process, json_path, debug):
    """Infer TARGET's pairing, direction, frequencies (base, scaling) and rotary dim by
    probing it, and print them as ropecheck flags. Exit 0: a rotary embedding, identified;
    1: not a rotary embedding (the reasons are printed); 2: the target is unusable."""
    from ropecheck.identification import UnusableTarget as Unusable, identify_spec
    from ropecheck.identify_output import print_identification, write_json as write_identification

    console = Console(highlight=False)
    try:
        ident = identify_spec(target, timeout, max_position, in_process)
    except Unusable as exc:
        _fail(console, f"cannot identify target {target!r}: {exc}")
    except Exception as exc:  # our own bug: say so plainly (KeyboardInterrupt: click aborts)
        traceback.print_exc() if debug else None
        _fail(console, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
    print_identification(console, ident)
    if json_path:
        write_identification(json_path, ident)
    sys.exit(EXIT_PASSED if ident.rotary else EXIT_FAILED)


if __name__ == "__main__":
    entry()
