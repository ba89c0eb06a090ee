"""One option of the option table (``ropecheck.session.options``): the ``Option`` record, how
each front door spells it, and ``UsageError``, what a front door raises for an option it
does not take or a value it cannot use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ropecheck.session.converters import switch, words


class UsageError(ValueError):
    """A front door was given an option it does not take, or a value it cannot use."""


# --- the option record ------------------------------------------------------------------------

SWITCH, VALUE, LIST = "switch", "value", "list"


@dataclass(frozen=True)
class Option:
    name: str  # the ropecheck.check keyword, and the key in Options
    help: str
    group: str  # the --help heading
    convert: Callable = str  # text or a Python value -> the value (ValueError: not one)
    default: Any = None
    kind: str = VALUE  # VALUE, SWITCH (a flag) or LIST (repeatable, comma-separated)
    flag: str = ""  # the command line's word when not the name with dashes: "dtype", "no-backward"
    inverted: bool = False  # a switch that sets the value False (--no-backward: backward=False)
    choices: tuple = ()
    families: tuple = ()  # the families it applies to (() all)
    calls: tuple = ()  # the call forms it applies to (() all)
    commands: tuple = ("check",)  # the front doors: check, identify, report, list
    api: bool = True  # a ropecheck.check / ropecheck.identify keyword
    pytest: bool = True  # a pytest flag and ini option (check's only)
    reproduce: bool = True  # written into a failure's reproduce line when given
    joined: bool = False  # a LIST written as one comma-separated value (per-axis values)
    defaults: dict = field(default_factory=dict)  # front door -> its own default (api, report)
    metavar: str = ""
    flag_value: Optional[str] = None  # the value of the flag given alone (--sanitize: memcheck)
    pytest_word: str = ""  # the pytest flag's and ini option's word when not the command line's

    @property
    def cli(self) -> str:
        """``--rotary-dim``."""
        return "--" + (self.flag or self.name.replace("_", "-"))

    @property
    def pytest_flag(self) -> str:
        return "--rope-" + (self.pytest_word or self.flag or self.name.replace("_", "-"))

    @property
    def ini(self) -> str:
        return "rope_" + (self.pytest_word or self.flag or self.name).replace("-", "_")

    def default_for(self, door: str, command: str = "check"):
        """Its default through ``door`` (cli, api, pytest) for ``command``: a front door's
        or a command's own (``ropecheck.check`` and ``report`` default to the ci profile)."""
        return self.defaults.get(door, self.defaults.get(command, self.default))

    def value(self, raw, door: str = "cli"):
        """``raw`` (text or a Python value) as this option's value; ValueError if it is not one.
        An inverted switch (``--no-backward``) is the flag on the command line and in an ini
        file, the value itself from the API (``backward=False``)."""
        if self.kind == SWITCH:
            on = switch(raw)
            return (not on) if self.inverted and door != "api" else on
        if self.kind == LIST and not self.joined:
            items = raw if isinstance(raw, (list, tuple)) else [raw]
            value = self.convert([w for item in items for w in words(item)])
        else:
            value = self.convert(raw)
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(str, self.choices))}, got {raw!r}")
        return value

    def shown(self, value) -> list:
        """The command-line words that give ``value``."""
        if self.kind == SWITCH:
            return [self.cli] if value != self.default else []
        value = as_given(value)
        if self.kind == LIST and not self.joined:
            return [w for item in value for w in (self.cli, _text(item))]
        if isinstance(value, (list, tuple)):
            value = ",".join(_text(v) for v in value)
        text = _text(value)
        return [f"{self.cli}={text}"] if text.startswith("-") else [self.cli, text]  # not read as a flag


def text_and_parsed(value) -> bool:
    """Whether an option's value is a (text, parsed) pair (--scaling's)."""
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)


def as_given(value):
    """An option's value as the command line, a reproduce line or a record gives it: a
    (text, parsed) pair's text, a ``spec()`` (Sizes, a read model config: its text), else
    the value."""
    value = value[0] if text_and_parsed(value) else value
    return value.spec() if hasattr(value, "spec") else value


def _text(value) -> str:
    """A value as the command line writes it: a number in its shortest exact form, a
    range (lo, hi) as LO:HI."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value):
        return ":".join(_text(float(v)) for v in value)
    return str(value)


def spelled(option: Option, door: str) -> str:
    """How a front door spells an option: --rotary-dim, rotary_dim, --rope-rotary-dim, rope_rotary_dim."""
    return {"api": option.name, "pytest": option.pytest_flag, "ini": option.ini}.get(door, option.cli)


def complaint(option: Option, door: str, exc: Exception) -> str:
    """``rotary_dim must be at least 2, got 1``, or ``--device: ...`` for a message of its own."""
    said = str(exc)
    return f"{spelled(option, door)} {said}" if said.startswith("must ") else f"{spelled(option, door)}: {said}"
