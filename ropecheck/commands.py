"""The click commands of ``ropecheck`` made from the option table
(``ropecheck.session.options``): each option a click parameter under its --help heading,
the values parsed by ``options.parse``; and where a run's JSON / JUnit records go, written
on every exit (usage errors included)."""

from __future__ import annotations

import sys
from typing import Optional

import click
from rich.console import Console
from rich.markup import escape

from ropecheck.report.output import write_unusable
from ropecheck.session import options as table
from ropecheck.session.options import Option, UsageError, parse
from ropecheck.targets.builtins import DEFAULT_TARGET

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


def fail(console: Console, message: str, code: int = EXIT_UNUSABLE, records: Optional[Records] = None):
    console.print(f"[bold red]ropecheck:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if records is not None:
        records.unusable(message, code)
    sys.exit(code)


# --- commands made from the option table ---------------------------------------------------


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


class TableCommand(click.Command):
    """A command whose parameters come from the option table: --help lists them under
    their group headings; usage errors found while parsing still leave the JSON / JUnit
    record the user asked for."""

    def parse_args(self, ctx, args):
        raw = list(args)  # click's parser consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if self.name == "check":
                Records.from_args(raw).unusable(f"usage error: {exc.format_message()}")
            raise

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


def _param(option: Option, command: str):
    """The click parameter of one option (values are converted by ``options.parse``)."""
    if option.name == "target":
        return GroupedArgument(
            ["target"],
            required=command == "identify",
            group=option.group,
            description=option.help.split("; set in the ini")[0] + ".",
        )
    default = option.default_for("cli", command)
    text = (
        ",".join(default) if isinstance(default, tuple) else f"{default:g}" if isinstance(default, float) else default
    )
    shown = "" if default in (None, False, True, ()) or option.kind == table.SWITCH else f" [default: {text}]"
    common = dict(group=option.group, help=option.help + shown)
    if option.kind == table.SWITCH:
        return GroupedOption([option.cli, option.name], is_flag=True, default=False, **common)
    kind = click.Choice(option.choices) if option.choices else None
    if option.flag_value is not None:  # --sanitize alone, or --sanitize TOOL
        return GroupedOption(
            [option.cli, option.name],
            type=kind,
            is_flag=False,
            flag_value=option.flag_value,
            metavar=option.metavar or None,
            **common,
        )
    metavar = option.metavar or (
        None if option.choices else METAVARS.get(getattr(option.convert, "__name__", ""), "TEXT")
    )
    return GroupedOption(
        [option.cli, option.name],
        type=kind,
        multiple=option.kind == table.LIST and not option.joined,
        metavar=metavar,
        **common,
    )


# how --help shows a value, by the option's converter
METAVARS = {
    "integer": "INTEGER",
    "number": "FLOAT",
    "integers": "N,N,...",
    "numbers": "X,X,...",
    "base_value": "FLOAT[,FLOAT...]",
    "dtype_names": "DTYPE",
    "mode_names": "MODE",
    "device_name": "DEVICE",
    "position_range": "N",
    "scaling_value": "SCALING",
    "sizes_value": "SIZES",
}


def table_command(group: click.Group, command: str, help_text: str):
    """A ``ropecheck COMMAND`` whose options are the table's for ``command``; the function
    decorated gets the parsed ``Options``."""

    def decorate(fn):
        def callback(**raw):
            records = Records(raw.get("json"), raw.get("junit"), raw.get("target") or DEFAULT_TARGET)
            try:
                options = parse(command, {k: v for k, v in raw.items() if v not in (None, ())}, door="cli")
            except UsageError as exc:
                if command == "check":
                    records.unusable(f"usage error: {exc}")
                raise click.UsageError(str(exc)) from None
            return fn(options)

        params = [_param(o, command) for o in table.for_command(command)]
        return group.command(
            name=command,
            cls=TableCommand,
            params=params,
            help=help_text,
            context_settings={"help_option_names": ["-h", "--help"]},
        )(callback)

    return decorate
