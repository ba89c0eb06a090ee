"""The Python API: ``ropecheck.check`` and ``ropecheck.identify``, for a project's own tests::

    import ropecheck

    def test_rope_is_right():
        report = ropecheck.check(lambda q, k, pos: my_rope(q, k, *my_freqs(pos)),
                                 call="qk", layout="interleaved", base=500000.0,
                                 dtypes=["bfloat16"], max_position=2**20)
        assert report.passed, report.summary()

The same engine as ``ropecheck check``: the same target spec, warm-up, check session, known
failures and records; each keyword is a flag of ``ropecheck check`` (``--rotary-dim`` is
``rotary_dim=``, ``--no-backward`` is ``backward=False``). Where the target runs:

- a *name*, ``"path/to/rope.py:rope"``, ``"package.module:attr"``, a built-in or an adapter
  (``ropecheck list``), is imported and called in a worker process, as the CLI does: a
  crash or a hang of the target ends the worker, not the test run;
- a *Python object*, a function, a lambda, a closure or a ``Target``, is called in this
  process (``Report.in_process`` says so): a worker is a fresh interpreter, and a lambda or a
  closure cannot be sent to one (it has no importable name, and its captured state would
  not come along). A call that outlives ``timeout`` in Python code is interrupted and
  reported as a hang; a crash (a segfault) or a hang inside native code ends this process
  (``ropecheck.calling``'s watchdog, as with ``--in-process``). Pass the name instead to
  isolate it.

Wrong arguments raise ``ValueError``; a target that cannot be loaded or called gives a
Report whose verdict is ``unusable`` (the CLI's exit 2), with the reason in ``summary()``.
"""

from __future__ import annotations

import inspect
import io
import json
from dataclasses import dataclass, field
from typing import Optional

from rich.console import Console

from ropecheck.report import gate
from ropecheck.report.output import (
    EXIT_STATUS,
    print_failures,
    print_notes,
    results_table,
    session_dict,
    unusable_dict,
    verdict_line,
    write_junit,
    write_unusable,
)
from ropecheck.session import options as table
from ropecheck.session.options import UsageError, parse
from ropecheck.session.prepare import prepare
from ropecheck.session.session import Session
from ropecheck.session.spec import UnusableTarget, in_process, name_of

IN_PROCESS_OBJECT = (
    "it is a Python object, and a worker process cannot receive a lambda or a closure; "
    "pass 'path/to/file.py:func' to isolate it in one"
)
IN_PROCESS_ASKED = "in_process=True"


@dataclass
class Report:
    """The outcome of one ``ropecheck.check``."""

    target: str
    verdict: str  # passed, failed, error (a check crashed inside ropecheck), unusable
    session: Optional[Session] = field(default=None, repr=False)
    reason: str = ""  # unusable: why the target could not be loaded or called
    in_process: str = ""  # why the target ran in this process ("": in a worker process)

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"

    def __repr__(self) -> str:
        return f"Report(target={self.target!r}, verdict={self.verdict!r})"

    @property
    def exit_status(self) -> int:
        """What ``ropecheck check`` would exit with: 0 passed, 1 failed, 2 unusable or error."""
        return 2 if self.verdict == "unusable" else EXIT_STATUS[self.verdict]

    @property
    def results(self) -> list:
        """One ``Result`` per check and dtype: ``.property``, ``.dtype``, ``.status``,
        ``.message``, ``.counterexample``, ``.reproduce``, ``.max_error`` (tolerance units)."""
        return list(self.session.results) if self.session else []

    @property
    def comparison(self):
        """The comparison with ``baseline=`` (``ropecheck.report.baseline.Comparison``:
        ``.regressions``, ``.improvements``, ``.deltas``, ``.not_compared``), or None."""
        return self.session.comparison if self.session else None

    @property
    def failures(self) -> list:
        return [r for r in self.results if r.status in ("failed", "error")]

    def _render(self, table: bool) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=110, color_system=None, highlight=False)
        if self.session is None:
            console.print(f"ropecheck: {self.reason}", markup=False, soft_wrap=True)
        else:
            if table:
                console.print(results_table(self.session))
            print_failures(console, self.session)
            print_notes(console, self.session)
            gate.print_comparison(console, self.session.comparison)
            if self.session.stopped:
                console.print(f"stopped early: {self.session.stopped}", markup=False)
            console.print(f"ropecheck {self.target}: " + verdict_line(self.session), soft_wrap=True)
        if self.in_process:
            console.print(f"(the target ran in this process: {self.in_process})", markup=False, soft_wrap=True)
        return buffer.getvalue().strip("\n")

    def summary(self) -> str:
        """The failure text ``ropecheck check`` prints (root causes, each failure with its
        minimal counterexample and reproduce line, support notes) and the verdict line."""
        return self._render(table=False)

    def __str__(self) -> str:
        """The results table, then the summary."""
        return self._render(table=True)

    def to_dict(self) -> dict:
        """The record ``ropecheck check --json`` writes."""
        if self.session is None:
            return unusable_dict(self.target, self.reason, self.exit_status)
        return session_dict(self.session)

    def to_json(self, path=None) -> str:
        """The ``--json`` record as text; written to ``path`` too when given."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        if path is not None:
            with open(path, "w") as out:
                out.write(text)
        return text

    def write_junit(self, path) -> None:
        """The ``--junit`` record."""
        if self.session is None:
            write_unusable(None, path, self.target, self.reason, self.exit_status)
        else:
            write_junit(path, self.session)


def check(target=None, **keywords) -> Report:
    """Check ``target`` against the RoPE properties; see the module docstring.

    target: a Python callable (or ``Target``) in its call form, or a name as ``ropecheck check``
        takes it; default the built-in rotate-half.
    The keywords are ``ropecheck check``'s options (``ropecheck.session.options``; its
    ``--rotary-dim`` is ``rotary_dim=``, ``--no-backward`` is ``backward=False``,
    ``--dtype``/``--mode``/``--property`` are ``dtypes=``/``modes=``/``properties=``, lists
    or comma-separated text), e.g.:
    call: "x" rope(x, positions), "qk" rope(q, k, positions) -> (q_out, k_out), "packed"
        rope(x, cu_seqlens, positions); default what the target declares, else "x".
    layout, base, rotary_dim, scaling, rotated_fraction: the convention (scaling: a
        ``--scaling`` string or a dict of HF rope_parameters; rotated_fraction: p-RoPE's).
        Without a layout only the spec-free checks run.
    hf_config, layer_type: a Hugging Face model's config.json (or its folder) and the layer
        type to check, read as the convention options they give (``--hf-config``).
    family, axes, sections, split, nd_base, mrope_interleaved, scale_base, gamma: the N-D,
        multimodal and xPos families (``--family``); list values may be lists.
    profile: "ci" (the default here: derandomized, so a test suite is deterministic),
        "dev", "thorough" or "production"; seed: the hypothesis seed for the random ones.
    known_failures: TOML files of known failures, besides ropecheck's shipped ones
        (``shipped_known_failures=False`` leaves those out).
    in_process: call a named target in this process instead of a worker process.
    device, modes, sizes, max_position, max_examples, timeout, strict_layouts: as the flags.
    baseline, regression_factor, update_baseline: compare with an earlier run's JSON record
        (``report.to_json(path)`` writes one); a regression fails the report
        (``report.comparison`` says what changed).
    A keyword it does not take, or a value it cannot use, raises ValueError.
    """
    try:
        options = parse("check", {"target": target, **keywords}, door="api")
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    here = IN_PROCESS_ASKED if options.in_process else ("" if not in_process(options) else IN_PROCESS_OBJECT)
    try:
        loaded = gate.baseline_of(options)
        session = prepare(options)
        loaded = gate.baseline_for(loaded, session)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    except UnusableTarget as exc:
        return Report(name_of(options), "unusable", reason=str(exc), in_process=here)
    try:
        session.run()
    finally:
        session.close()
    try:
        gate.judge(session, loaded)
    except UsageError as exc:
        raise ValueError(str(exc)) from None
    return Report(session.target.name, session.verdict, session, in_process=here)


def _signature() -> inspect.Signature:
    """``check``'s signature as the option table gives it (``help(ropecheck.check)``)."""
    params = [inspect.Parameter("target", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    params += [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default_for("api"))
        for o in table.for_command("check")
        if o.api and o.name != "target"
    ]
    return inspect.Signature(params, return_annotation=Report)


check.__signature__ = _signature()  # type: ignore[attr-defined]


def identify(
    target,
    *,
    timeout: float = table.BY_NAME["timeout"].default,
    max_position: int = 2**24,
    in_process: bool = False,
    family: str = "rope",
    axes: Optional[int] = None,
):
    """Infer ``target``'s convention by probing it, as ``ropecheck identify`` does; returns an
    ``Identification``: ``.rotary`` (a rotary embedding at all), ``.options`` (its
    convention as ``check`` keywords), ``.flags`` (as ``ropecheck check`` flags),
    ``.layout``, ``.base``, ``.rotary_dim``, ``.to_json()``. A name runs in a worker
    process, a Python object here (as ``check``). ``family="nd"`` (or axial, mrope, pairs)
    with ``axes``: an N-D rotation, an ``NDIdentification`` (``.flags``, ``.family``,
    ``.pairs``, ``.table``: its ``--pair-table`` form).
    Raises ``UnusableTarget`` when the target cannot be loaded or called."""
    from ropecheck.identification.engine import UnusableTarget as Unusable
    from ropecheck.identification.engine import identify_spec
    from ropecheck.identification.nd import identify_nd_spec
    from ropecheck.properties.nd.families import ND_FAMILY_NAMES
    from ropecheck.session.loading import is_named

    if family not in ("rope", *ND_FAMILY_NAMES):
        names = ", ".join(ND_FAMILY_NAMES)
        raise ValueError(f"identify takes family rope or an N-D rotation ({names}), got {family!r}")
    here = in_process or not is_named(target)
    try:
        if family != "rope":
            return identify_nd_spec(target, axes, timeout, max_position, here)
        if axes is not None:
            raise ValueError("axes applies to an N-D family (family='nd')")
        return identify_spec(target, timeout, max_position, here)
    except Unusable as exc:
        raise UnusableTarget(f"cannot identify target: {exc}") from None
