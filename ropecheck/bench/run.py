"""A ``ropecheck bench`` run from its options: the target (and ``--against``) built and
warmed up as ``check`` builds them, the shapes and dtypes chosen, the rows timed
(``runner``), compared with a baseline (``gate``) and written (``output``). The CLI and the
pytest plugin run it."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ropecheck.bench import gate, shapes
from ropecheck.bench.runner import Plan, Row, Runner, Subject, default_dtype, fits, reference_property
from ropecheck.calling.worker import cores
from ropecheck.properties.core.contract import BUILDER_FORMS
from ropecheck.properties.nd.families import ND_FAMILY_NAMES
from ropecheck.session.options import Options, UsageError
from ropecheck.session.prepare import resolve_dtypes, warm_up
from ropecheck.session.spec import UnusableTarget, build

THRESHOLD = {"cuda": 0.05, "cpu": 0.10}  # --fail-slower's defaults


def device_name(device: str) -> str:
    """What the device is, as a baseline must match it: the GPU's name, or the CPU's model
    and core count."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {cores()} cores"


@dataclass
class BenchRun:
    """What a run times, and its rows once timed."""

    options: Options
    subject: Subject
    plan: Plan
    rows_to_time: list  # (shape, dtype)
    other: Optional[Subject] = None
    left_out: list = field(default_factory=list)  # (shape name, why) of shapes cut to the memory
    baseline: Optional[gate.Baseline] = None
    threshold: float = 0.05
    rows: list = field(default_factory=list)
    runner: Optional[Runner] = None

    @property
    def device(self) -> str:
        return self.plan.device

    @property
    def device_name(self) -> str:
        return device_name(self.plan.device)

    def run(self, on_row: Callable[[Row], None] = lambda row: None) -> list:
        for shape, dtype in self.rows_to_time:
            row = self.row(shape, dtype)
            self.rows.append(row)
            on_row(row)
        return self.rows

    def row(self, shape: shapes.Shape, dtype: str) -> Row:
        """One row timed and gated; a row that fails the gate is timed again in new
        processes and fails only when that rerun does too (``gate.confirmed``)."""
        if self.runner is None:
            self.runner = Runner(self.subject, self.plan, self.other)
        row = self.runner.row(shape, dtype)
        row.device = self.device_name
        gate.judge(row, self.baseline, self.threshold)
        if row.gate is not None and row.gate.failed:
            for subject in (self.subject, self.other):
                if subject is not None:
                    subject.restart()
            again = self.runner.row(shape, dtype)
            again.device = self.device_name
            gate.judge(again, self.baseline, self.threshold)
            row = gate.confirmed(row, again)
        return row

    def close(self) -> None:
        for subject in (self.subject, self.other):
            if subject is not None:
                subject.target.close()
                if subject.in_process is not None:
                    subject.in_process.close()

    @property
    def exit_status(self) -> int:
        """1 when a row is wrong, failed to run, or is slower than the gate allows; else 0."""
        bad = any(r.status != "timed" or (r.gate is not None and r.gate.failed) for r in self.rows)
        return 1 if bad else 0


def _subject(options: Options, name: str, dtypes: list) -> Subject:
    built = build(options)
    try:
        if built.family not in ("rope", *ND_FAMILY_NAMES):
            raise UsageError(
                f"bench times rotations of q and k (--family rope, or an N-D one: {', '.join(ND_FAMILY_NAMES)}); "
                f"{name!r} is --family {built.family}"
            )
        if built.call in BUILDER_FORMS:
            raise UsageError(f"--call {built.call}: a table builder moves no q or k to time (bench its applier)")
        reference_property(built)
        problems = warm_up(built, dtypes, options.timeout)
        bad = {d: p for d, p in problems.items() if d in dtypes and p}
        if bad:
            dtype, problem = next(iter(bad.items()))
            raise UnusableTarget(f"target {name!r} cannot be called in {dtype}: {problem}")
    except ValueError as exc:
        built.close()
        raise UsageError(str(exc)) from None
    except BaseException:
        built.close()
        raise
    return Subject(name, built, options.timeout)


def _shapes(options: Options, target, device: str) -> list:
    """The rows ``--shapes``, ``--sizes`` and ``--shape`` ask for: the 1-D steps for 1-D
    RoPE, ``image`` for an N-D rotation (at the head size it declares)."""
    nd = target.family != "rope"
    steps = ("image",) if nd else shapes.STEPS_1D
    names = options.shapes or (["image"] if nd else ["decode", "prefill"])
    unknown = [n for n in names if n not in steps]
    if unknown:
        kind = "an N-D rotation" if nd else "1-D RoPE"
        raise UsageError(f"--shapes: {', '.join(unknown)} is not one of {', '.join(steps)} (for {kind})")
    sizes = options.bench_sizes or ("gpu" if device.startswith("cuda") else "cpu")
    head_dim = (target.head_dims or (0,))[0] if nd else 0
    rows = shapes.shapes(names, sizes, head_dim)
    if options.shape:
        try:
            rows = shapes.override(rows, options.shape)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if nd and any(r.model.head_dim not in target.head_dims for r in rows):
        raise UsageError(f"--shape: {target.name!r} takes head sizes {', '.join(map(str, target.head_dims))}")
    return rows


def prepare(options: Options) -> BenchRun:
    """The run ``options`` ask for. UsageError for options it cannot use, UnusableTarget
    when a target cannot be loaded or called (exit 2)."""
    if len(options.modes) != 1:
        raise UsageError("bench times one --mode at a time")
    device = options.device or "cpu"
    if options.timer.startswith("cuda") and not device.startswith("cuda"):
        raise UsageError(f"--timer {options.timer} times a CUDA device: add --device cuda")
    baseline = gate.load(options.bench_baseline, device_name(device)) if options.bench_baseline else None
    name = options.target if isinstance(options.target, str) else "rotate-half"
    subject = _subject(options, name or "rotate-half", [])
    try:
        rows = _shapes(options, subject.target, device)
        dtypes, _ = resolve_dtypes(options.dtypes, subject.target)
        if not options.dtypes:
            dtypes = [default_dtype(subject.target, device)]
        for dtype in dtypes:
            problem = warm_up(subject.target, [dtype], options.timeout).get(dtype)
            if problem:
                raise UnusableTarget(f"target {name!r} cannot be called in {dtype}: {problem}")
        other = _subject(options.replace(target=options.against), options.against, dtypes) if options.against else None
    except BaseException:
        subject.target.close()
        raise
    left_out, chosen = [], []
    for dtype in dtypes:
        for shape in rows:
            rotary = getattr(subject.target.convention, "rotary_dim", None)
            if rotary and rotary > shape.model.head_dim:
                left_out.append((f"{dtype} {shape.name}", f"--rotary-dim {rotary} > head size"))
            elif fits(shape, dtype, device):
                chosen.append((shape, dtype))
            else:
                left_out.append((f"{dtype} {shape.name}", "does not fit in the memory here"))
    kind = "cuda" if device.startswith("cuda") else "cpu"
    threshold = options.fail_slower if options.fail_slower is not None else THRESHOLD[kind]
    plan = Plan(device, options.timer, options.threads, options.budget)
    return BenchRun(options, subject, plan, chosen, other, left_out, baseline, threshold)
