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

import io
import json
from dataclasses import dataclass, field
from typing import Optional

from rich.console import Console

from ropecheck import known_failures as known_failure_records
from ropecheck.call_forms import CALL_FORMS
from ropecheck.calling import DEFAULT_TIMEOUT
from ropecheck.families import FAMILIES, FamilyError
from ropecheck.loading import is_named
from ropecheck.output import (EXIT_STATUS, print_failures, print_notes, results_table, session_dict,
                              unusable_dict, verdict_line, write_junit)
from ropecheck.properties.runner import PROFILES, RunOptions
from ropecheck.reference import LAYOUTS
from ropecheck.session import Session, UnusableTarget, close, prepare, run_seed, spec_for

IN_PROCESS_OBJECT = ("it is a Python object, and a worker process cannot receive a lambda or a closure; "
                     "pass 'path/to/file.py:func' to isolate it in one")
IN_PROCESS_ASKED = "in_process=True"
POSITION_RANGE = (255, 2**24)  # --max-position's range


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
    def failures(self) -> list:
        return [r for r in self.results if r.status in ("failed", "error")]

    def _render(self, table: bool) -> str:
        console = Console(file=io.StringIO(), width=110, color_system=None, highlight=False)
        if self.session is None:
            console.print(f"ropecheck: {self.reason}", markup=False, soft_wrap=True)
        else:
            if table:
                console.print(results_table(self.session))
            print_failures(console, self.session)
            print_notes(console, self.session)
            if self.session.stopped:
                console.print(f"stopped early: {self.session.stopped}", markup=False)
            console.print(f"ropecheck {self.target}: " + verdict_line(self.session), soft_wrap=True)
        if self.in_process:
            console.print(f"(the target ran in this process: {self.in_process})", markup=False, soft_wrap=True)
        return console.file.getvalue().strip("\n")

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
            from ropecheck.output import write_unusable

            write_unusable(None, path, self.target, self.reason, self.exit_status)
        else:
            write_junit(path, self.session)


def _words(value) -> list:
    """A list option given as a list or as one string (comma-separated, as the CLI takes it)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _spec(target, call, layout, base, rotary_dim, scaling, family, axes, sections, split,
          mrope_interleaved, scale_base, gamma, max_position, backward, inplace, in_process, device):
    """The TargetSpec or FamilySpec the keywords describe (``session.spec_for``, as
    ``ropecheck check`` builds it), after the checks click makes for the CLI."""
    if call is not None and call not in CALL_FORMS:
        raise ValueError(f"call must be one of {', '.join(CALL_FORMS)}, got {call!r}")
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if max_position is not None and not POSITION_RANGE[0] <= max_position <= POSITION_RANGE[1]:
        raise ValueError(f"max_position must be in 255 .. 2^24, got {max_position}")
    if isinstance(scaling, dict):  # HF rope_parameters, as --scaling '{...}' takes them
        scaling = json.dumps(scaling)
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    return spec_for(target, family, layout=layout, base=base, rotary_dim=rotary_dim, scaling=scaling, axes=axes,
                    sections=sections, split=split, mrope_interleaved=mrope_interleaved, scale_base=scale_base,
                    gamma=gamma, max_position=max_position, backward=backward, inplace=inplace,
                    in_process=in_process, call=call, device=device)


def _reproduce(target, keywords: dict, seed) -> callable:
    """The Python call that reruns one check of this report."""
    shown = repr(target) if is_named(target) or target is None else getattr(target, "__name__", "target")
    defaults = {"backward": True}
    given = {k: v for k, v in keywords.items()
             if v is not None and v != defaults.get(k, False) and not (isinstance(v, (list, tuple)) and not v)}

    def call(name: str, mode: str = "eager") -> str:
        words = [shown] + [f"{k}={v!r}" for k, v in given.items()] + [f"properties=[{name!r}]"]
        words += [] if mode == "eager" else [f"modes=[{mode!r}]"]
        return f"ropecheck.check({', '.join(words + ([f'seed={seed}'] if seed is not None else []))})"

    return call


def check(target=None, *, call: Optional[str] = None, layout: Optional[str] = None, base=None,
          rotary_dim: Optional[int] = None, scaling=None, family: Optional[str] = None,
          axes: Optional[int] = None, sections=None, split=None, mrope_interleaved: bool = False,
          scale_base: Optional[float] = None, gamma: Optional[float] = None, dtypes=None,
          properties=None, max_position: Optional[int] = None, backward: bool = True,
          inplace: bool = False, profile: str = "ci", seed: Optional[int] = None,
          max_examples: Optional[int] = None, timeout: float = DEFAULT_TIMEOUT,
          strict_layouts: bool = False, known_failures=None, shipped_known_failures: bool = True,
          in_process: bool = False, device: Optional[str] = None, modes=None, sizes=None) -> Report:
    """Check ``target`` against the RoPE properties; see the module docstring.

    target: a Python callable (or ``Target``) in its call form, or a name as ``ropecheck check``
        takes it; default the built-in rotate-half.
    call: "x" rope(x, positions), "qk" rope(q, k, positions) -> (q_out, k_out), "packed"
        rope(x, cu_seqlens, positions); default what the target declares, else "x".
    layout, base, rotary_dim, scaling: the convention (scaling: a ``--scaling`` string or a
        dict of HF rope_parameters). Without a layout only the spec-free checks run.
    family, axes, sections, split, mrope_interleaved, scale_base, gamma: the N-D,
        multimodal and xPos families (``--family``); list values may be lists.
    dtypes, properties: what to run (default: all); a string may be comma-separated.
    profile: "ci" (the default here: derandomized, so a test suite is deterministic),
        "dev", "thorough" or "production" (derandomized, at production sizes); seed: the
        hypothesis seed for the random ones (default random).
    sizes: "toy" or "production", then key=value overrides, as ``--sizes`` (default: the
        profile's).
    known_failures: TOML files of known failures, besides ropecheck's shipped ones
        (``shipped_known_failures=False`` leaves those out).
    in_process: call a named target in this process instead of a worker process.
    device: where the inputs are made ("cpu", "cuda", "cuda:N"; default cpu, or the
        target's own); a machine without it gives an unusable report saying so.
    modes: how the target is run, e.g. ["eager", "compile"] (``ropecheck.modes``; default eager).
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    options = RunOptions(profile=profile, timeout=timeout, max_examples=max_examples,
                         strict_layouts=strict_layouts, sizes=sizes)  # ValueError: bad sizes
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be at least 1, got {max_examples}")
    here = IN_PROCESS_ASKED if in_process else ("" if is_named(target) or target is None else IN_PROCESS_OBJECT)
    try:
        spec = _spec(target, call, layout, base, rotary_dim, scaling, family, axes, sections, split,
                     mrope_interleaved, scale_base, gamma, max_position, backward, inplace, bool(here), device)
        chosen = spec.properties(_words(properties))
    except FamilyError as exc:
        raise ValueError(str(exc)) from None
    name = spec.name
    known = known_failure_records.load([*((known_failure_records.DEFAULT_FILE,) if shipped_known_failures else ()),
                                        *_words(known_failures)])
    try:
        prepared = prepare(spec, _words(dtypes), timeout, run_modes=modes)
    except UnusableTarget as exc:
        return Report(name, "unusable", reason=str(exc), in_process=here)
    seed = options.seed = run_seed(seed, profile)
    keywords = dict(call=call, layout=layout, base=base, rotary_dim=rotary_dim, scaling=scaling, family=family,
                    axes=axes, sections=sections, split=split, mrope_interleaved=mrope_interleaved,
                    scale_base=scale_base, gamma=gamma, dtypes=prepared.dtypes, max_position=max_position,
                    backward=backward, inplace=inplace, profile=profile if profile != "ci" else None,
                    max_examples=max_examples, strict_layouts=strict_layouts, in_process=in_process,
                    device=device, sizes=sizes)
    session = Session(prepared.target, prepared.dtypes, chosen, options, known=known, crashes=prepared.crashes,
                      unsupported=prepared.unsupported, range_probe=spec.range_probe(_words(properties)),
                      reproduce=_reproduce(target, keywords, seed), modes=prepared.modes)
    try:
        session.run()
    finally:
        close(prepared.target)
    return Report(name, session.verdict, session, in_process=here)


def identify(target, *, timeout: float = DEFAULT_TIMEOUT, max_position: int = 2**24,
             in_process: bool = False):
    """Infer ``target``'s convention by probing it, as ``ropecheck identify`` does; returns an
    ``Identification``: ``.rotary`` (a rotary embedding at all), ``.options`` (its
    convention as ``check`` keywords), ``.flags`` (as ``ropecheck check`` flags),
    ``.layout``, ``.base``, ``.rotary_dim``, ``.to_json()``. A name runs in a worker
    process, a Python object here (as ``check``).
    Raises ``UnusableTarget`` when the target cannot be loaded or called."""
    from ropecheck.identification import UnusableTarget as Unusable, identify_spec

    try:
        return identify_spec(target, timeout, max_position, in_process or not is_named(target))
    except Unusable as exc:
        raise UnusableTarget(f"cannot identify target: {exc}") from None
