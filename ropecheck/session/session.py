"""A check session: a target's properties x dtypes x modes, run through the one runner
(``properties.runner``), with the position-range probe first (1-D RoPE), with --opcheck an
opcheck row last, made of the checks' calls (``opcheck_row``), known failures applied and
failures that share a root cause grouped. Every front door runs one: the CLI
and the Python API all at once (``run``), the pytest plugin one check per test
(``run_one``), the conformance report one per target. ``ropecheck.session.prepare`` makes
it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import torch

from ropecheck.calling import modes as run_modes
from ropecheck.calling.launches import Recorded
from ropecheck.properties import position_range
from ropecheck.properties.core.contract import TargetHung
from ropecheck.properties.core.dtypes import torch_dtype
from ropecheck.properties.core.sizes import Sizes
from ropecheck.properties.inputs.strategies import FREE_HEAD_DIMS, MAX_POSITION
from ropecheck.properties.property import RANGE_PROBE, Property
from ropecheck.properties.runner import Result, RunOptions, run_property
from ropecheck.session import known_failures, opcheck_row
from ropecheck.session.options import Options
from ropecheck.session.sharing import Share
from ropecheck.targets.target import MIN_MAX_POSITION, Target


def column_label(dtype: str, mode: str = "eager") -> str:
    """A results column (and a JUnit name's bracket): the dtype, and the mode unless eager."""
    return dtype if mode == "eager" else f"{dtype} {mode}"


def probe_position_range(target: Target, dtype: str, run: RunOptions, reproduce: str) -> tuple[Result, Target]:
    """The position-range finding for one dtype, and the target restricted to the
    positions it accepts (so the properties judge its values, not its range)."""
    result = Result(RANGE_PROBE, dtype, "passed", position_range.FORMULA)
    head_dim = target.rotary_dim or FREE_HEAD_DIMS[0]
    x = torch.randn(1, 1, 1, head_dim, generator=torch.Generator().manual_seed(0), device="cpu").to(torch_dtype(dtype))
    caller = target.caller(run.timeout)
    limit = min(MAX_POSITION, target.max_position or MAX_POSITION)
    found = position_range.find_limit(lambda m: caller(x, torch.tensor([[m]], dtype=torch.int64, device="cpu")), limit)
    result.launches = getattr(caller, "launches", None)
    if found is None:
        return result, target
    at, why = found
    result.status, result.message = "failed", position_range.finding(at, why, MIN_MAX_POSITION)
    result.counterexample = f"x: shape {tuple(x.shape)} {dtype}, contiguous; positions [{at}]"
    result.reproduce = reproduce
    result.signature = "position-range"
    if at - 1 < MIN_MAX_POSITION:  # too few to draw from: the properties judge the whole range
        return result, target
    return result, target.with_(max_position=at - 1)


class Reproduce:
    """How a failure of this run is rerun alone, as its front door spells it: a
    ``ropecheck check`` command, a ``ropecheck.check(...)`` call, or a pytest command."""

    def __init__(
        self,
        options: Options,
        dtypes: list,
        seed: Optional[int],
        shown_target: str = "",
        pytest_args: Optional[list] = None,
    ):
        self.options, self.dtypes, self.seed = options, dtypes, seed
        self.shown_target, self.pytest_args = shown_target, pytest_args

    def __call__(self, name: str, mode: str = "eager", dtype: str = "") -> str:
        o = self.options
        if o.door == "pytest":
            args = [a for a in self.pytest_args or [] if not a.startswith("--rope-seed")]
            return shlex.join(
                ["pytest", *args]
                + ([f"--rope-seed={self.seed}"] if self.seed is not None else [])
                + ["-k", f"{name} and {dtype}"]
            )
        if o.door == "api":
            given = o.keywords()
            words = [self.shown_target] + [f"{k}={v!r}" for k, v in given.items()]
            words += [f"dtypes={[d for d in self.dtypes if d != '-']!r}"] if "dtypes" in o.given else []
            words += [f"properties=[{name!r}]"] + ([] if mode == "eager" else [f"modes=[{mode!r}]"])
            return f"ropecheck.check({', '.join(words + ([f'seed={self.seed}'] if self.seed is not None else []))})"
        words = ["ropecheck", "check"] + ([o.target] if isinstance(o.target, str) else []) + o.words()
        words += [w for d in self.dtypes if d != "-" for w in ("--dtype", d)]  # a builder takes no tensors
        words += ["--profile", o.profile] + (["--seed", str(self.seed)] if self.seed is not None else [])
        return shlex.join(words + ["--property", name] + ([] if mode == "eager" else ["--mode", mode]))


@dataclass
class Session:
    target: Target
    dtypes: list[str]
    properties: list[Property]
    run_options: RunOptions = field(default_factory=RunOptions)
    # how one check is rerun: (name, mode, dtype) -> a command or a call
    reproduce: Callable = lambda name, mode="eager", dtype="": ""
    known: list = field(default_factory=list)  # ropecheck.session.known_failures records
    results: list[Result] = field(default_factory=list)
    stopped: Optional[str] = None  # why the run stopped early
    crashes: dict = field(default_factory=dict)  # dtype -> the crash of its smallest call
    unsupported: dict = field(default_factory=dict)  # dtype -> why it cannot be called
    causes: list = field(default_factory=list)  # root causes shared by several failures
    compile_notes: list = field(default_factory=list)  # (message, count): torch.compile's warnings
    range_probe: bool = True  # probe the accepted position range first
    modes: list = field(default_factory=lambda: ["eager"])  # how the target is run (--mode)
    options: Optional[Options] = None  # the run's options (the JSON record echoes them)
    ranges: dict = field(default_factory=dict)  # dtype -> the target restricted to its accepted range
    # the comparison with a baseline record (ropecheck.report.baseline), set by the front door
    comparison: Optional[Any] = None
    # its warm-up launched Triton kernels: each new shape is a compile on a GPU, so the
    # checks draw their shapes from a pool (``Sizes.pool``, ``--sizes ...,pool=auto``)
    compiles_per_shape: bool = False
    # --opcheck: the checks' calls followed by torch.library.opcheck, an opcheck row per column
    opcheck: bool = False

    @property
    def eager_sizes(self) -> Sizes:
        """The sizes the checks outside the one-model modes draw at: the run's, from the
        pool (``Sizes.pool``) where it says auto and the target compiles per shape."""
        sizes = self.run_options.drawn_sizes
        return sizes.pooled() if sizes.pool == "auto" and self.compiles_per_shape else sizes

    @property
    def rows(self) -> list[str]:
        """The table's rows: the position-range probe, the properties, then opcheck's."""
        probe = [RANGE_PROBE] if self.range_probe else []
        return probe + [p.name for p in self.properties] + ([opcheck_row.NAME] if self.opcheck else [])

    @property
    def columns(self) -> list[tuple[str, str]]:
        """The table's columns: (dtype, mode), each dtype's modes side by side."""
        return [(dtype, mode) for dtype in self.dtypes for mode in self.modes]

    def _record(self, result: Result, on_result=lambda r: None) -> Result:
        result = known_failures.apply(self.target.name, [result], self.known)[0]
        self.results.append(result)
        on_result(result)
        return result

    def _crashed(self, prop: Property, dtype: str, mode: str) -> Result:
        """Its smallest call crashes in this dtype: so would every property."""
        crashed = Result(
            prop.name,
            dtype,
            "failed",
            prop.formula,
            message=self.crashes[dtype].split("\n")[0],
            counterexample=self.crashes[dtype].split("on the first, smallest input: ")[-1],
        )
        crashed.signature, crashed.mode = f"crashed: {crashed.message}", mode
        return crashed

    def target_for(self, dtype: str, on_result=lambda r: None) -> Target:
        """The target as checked in ``dtype``: restricted to the positions it accepts (the
        position-range probe, run once per dtype and recorded)."""
        if dtype not in self.ranges:
            target = self.target
            if self.range_probe and dtype not in self.crashes:
                found, target = probe_position_range(
                    target, dtype, self.run_options, self.reproduce(RANGE_PROBE, "eager", dtype)
                )
                self._record(found, on_result)
            self.ranges[dtype] = target
        return self.ranges[dtype]

    def check(self, prop: Property, dtype: str, mode: str = "eager") -> Result:
        """One property in one dtype and mode (not recorded). TargetHung propagates."""
        if dtype in self.crashes:
            return self._crashed(prop, dtype, mode)
        target = self.target_for(dtype)
        run_in = target if mode == "eager" else replace(target, mode=mode)
        if self.opcheck:
            run_in = replace(run_in, opcheck=True)
        options = self.run_options
        if mode in run_modes.ONE_MODEL_MODES:
            options = replace(options, sizes=options.drawn_sizes.one_model())
        else:
            options = replace(options, sizes=self.eager_sizes)
        result = run_property(prop, run_in, dtype, options, reproduce_hint=self.reproduce(prop.name, mode, dtype))
        result.mode = mode
        return result

    def run_one(self, name: str, dtype: str, mode: str = "eager") -> Result:
        """One row of the table in one column, recorded (the pytest plugin's test): the
        position-range probe or a property. After a hang the rest is skipped."""
        if self.stopped:
            return Result(name, dtype, "skipped", "", message=f"not run: {self.stopped}")
        if name == RANGE_PROBE:
            self.target_for(dtype)
            return next(r for r in self.results if r.property == RANGE_PROBE and r.dtype == dtype)
        if name == opcheck_row.NAME:
            try:
                return self._record(self.opcheck_row(dtype, mode, run_missing=True))
            except TargetHung as exc:
                return self._hung(exc, name, opcheck_row.FORMULA, dtype, mode)
        prop = next(p for p in self.properties if p.name == name)
        try:
            return self._record(self.check(prop, dtype, mode))
        except TargetHung as exc:
            return self._hung(exc, prop.name, prop.formula, dtype, mode)

    def _hung(self, exc: TargetHung, name: str, formula: str, dtype: str, mode: str, on_result=lambda r: None):
        hung = Result(
            name,
            dtype,
            "failed",
            formula,
            message=f"{exc}; the run was stopped here",
            counterexample=getattr(exc, "case", ""),
            mode=mode,
        )
        self.stopped = f"the target hung in {name} ({dtype}{'' if mode == 'eager' else ', ' + mode})"
        return self._record(hung, on_result)

    def run(self, on_result: Callable[[Result], None] = lambda r: None, share: Optional[Share] = None) -> list[Result]:
        """Every row in every column, dtype by dtype; stops at a hang. ``share``: the
        checks shared with a helper process (``ropecheck.session.sharing``), each run once,
        in either."""
        run_modes.run_notes(clear=True)
        if share is not None:
            try:
                self._run_shared(share, on_result)
            finally:
                share.close()
        else:
            for dtype in self.dtypes:
                running = (self.rows[0], position_range.FORMULA, "eager")
                try:
                    self.target_for(dtype, on_result)
                    for mode in self.modes:
                        for prop in self.properties:
                            running = (prop.name, prop.formula, mode)
                            self._record(self.check(prop, dtype, mode), on_result)
                except TargetHung as exc:
                    self._hung(exc, *running[:2], dtype, running[2], on_result)
                    break
        if self.opcheck and not self.stopped:
            for dtype, mode in self.columns:
                self._record(self.opcheck_row(dtype, mode), on_result)
        self.causes = group_causes(self.results)
        self.compile_notes = run_modes.run_notes()
        return self.results

    def opcheck_row(self, dtype: str, mode: str, run_missing: bool = False) -> Result:
        """The column's opcheck row (``opcheck_row.row``), made from the records of the
        column's checks; ``run_missing``: the checks this process has not run in it (a
        pytest process that ran only some) are run first, for their calls (not recorded)."""
        column = [r for r in self.results if (r.dtype, r.mode) == (dtype, mode)]
        if run_missing and dtype not in self.crashes:
            ran = {r.property for r in column}
            column += [self.check(p, dtype, mode) for p in self.properties if p.name not in ran]
        # a finding is rerun with the check whose calls showed it (pytest: the opcheck test,
        # which runs the checks it is made of)
        pytest = self.options is not None and self.options.door == "pytest"
        return opcheck_row.row(
            column, dtype, mode, lambda name: self.reproduce(opcheck_row.NAME if pytest else name, mode, dtype)
        )

    @property
    def checks(self) -> list[tuple[str, str, Property]]:
        """(dtype, mode, property) of every check, in the order a run takes them."""
        return [(dtype, mode, prop) for dtype in self.dtypes for mode in self.modes for prop in self.properties]

    def _run_shared(self, share: Share, on_result: Callable[[Result], None]) -> None:
        """The checks this process takes from ``share`` (the helper's results recorded as
        they arrive); the leader then runs what the helper took and did not finish and
        records the probes of every dtype, and the results are put in a run's order."""
        checks, done = self.checks, set()

        def record_arrived(arrived: list) -> None:
            for index, result in arrived:
                done.add(index)
                self.results.append(result)
                on_result(result)

        def run_check(index: int) -> None:
            dtype, mode, prop = checks[index]
            running = (RANGE_PROBE, position_range.FORMULA, "eager")
            try:
                self.target_for(dtype, on_result if share.leads else lambda r: None)
                running = (prop.name, prop.formula, mode)
                result = self._record(self.check(prop, dtype, mode), on_result)
            except TargetHung as exc:
                result = self._hung(exc, *running[:2], dtype, running[2], on_result)
                share.rows.stop(self.stopped or "")
            done.add(index)
            share.finished(index, result)

        while (index := share.rows.claim(share.order)) is not None:
            record_arrived(share.arrived())
            run_check(index)
        record_arrived(share.end())
        if not share.leads:
            return
        for index in share.rows.taken:  # the helper's, if it died before finishing them
            if index not in done and not share.rows.stopped:
                run_check(index)
        self.stopped = self.stopped or share.rows.stopped or None
        if not self.stopped:
            for dtype in self.dtypes:  # a dtype whose checks all ran in the helper
                self.target_for(dtype, on_result)
        order = {name: i for i, name in enumerate(self.rows)}
        self.results.sort(
            key=lambda r: (
                self.dtypes.index(r.dtype) if r.dtype in self.dtypes else len(self.dtypes),
                r.property != RANGE_PROBE,
                self.modes.index(r.mode) if r.mode in self.modes else 0,
                order.get(r.property, -1),
            )
        )

    def interface_coverage(self) -> dict:
        """column label -> the ``interfaces.space.Coverage`` of the pairs of argument classes
        its calls through the target's interface had (empty without an interface)."""
        interface = self.target.interface
        if interface is None or not interface.space.factors:
            return {}
        out = {}
        for dtype, mode in self.columns:
            rows = [dict(path) for r in self.results if (r.dtype, r.mode) == (dtype, mode) for path in r.paths]
            out[column_label(dtype, mode)] = interface.space.coverage(rows)
        return out

    def launches(self) -> Recorded:
        """The Triton launches of every check of the run (``ropecheck.calling.launches``):
        the specializations a GPU compiles for it, whichever column made them (one process
        compiles each once); empty for a target that launched no Triton kernel."""
        out = Recorded()
        for r in self.results:
            if r.launches:
                out.add(r.launches)
        return out

    @property
    def verdict(self) -> str:
        statuses = {r.status for r in self.results}
        if "error" in statuses:
            return "error"
        failed = "failed" in statuses or (self.comparison is not None and self.comparison.failed)
        return "failed" if failed else "passed"

    def close(self) -> None:
        """Stop the target's worker process, if any."""
        self.target.close()


def group_causes(results: list[Result]) -> list[dict]:
    """Failures that share a signature (the same exception at the same place, the same
    crash, the same contract breach, the same minimal input) are one root cause: each gets
    the cause's id; returns the causes, each with the properties it took down."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.status == "failed" and r.signature:
            groups.setdefault(r.signature, []).append(r)
    causes: list[dict] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        cause = f"C{len(causes) + 1}"
        for r in members:
            r.cause = cause
        first = members[0]
        same_input = first.signature.startswith("input: ")
        causes.append(
            {
                "id": cause,
                "message": first.message,
                "diagnosis": first.diagnosis,
                "counterexample": first.counterexample,
                "counterexample_label": first.counterexample_label(),
                "reproduce": first.reproduce,
                "properties": list(dict.fromkeys(r.property for r in members)),
                "dtypes": list(dict.fromkeys(column_label(r.dtype, r.mode) for r in members)),
                # one input failing several checks: what each of them saw
                "also": [
                    {"property": r.property, "dtype": column_label(r.dtype, r.mode), "message": r.message}
                    for r in members[1:]
                    if same_input and r.message != first.message
                ],
            }
        )
    return causes
