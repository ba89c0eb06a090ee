"""Accuracy regressions against a baseline: the JSON record of an earlier run.

A record (``ropecheck check --json``, or ``ropecheck report``'s report.json, one run per
target) holds, per property x dtype x mode x call form, four figures: the verdict, the
largest normalised error (tolerance units), and for the reference check the accuracy
horizon and the error profile against position (the fixed sweep's relative error per
position). ``compare`` sets two runs side by side, figure by figure, on what both ran:

- a regression (it fails the run, exit 1): a property that passed now fails; a dtype that
  was checked is now refused (or a check that ran is now skipped); the largest error grew
  by more than ``factor``; the error at some swept position grew by more than ``factor``;
  the horizon dropped by a power of two (half of it or less);
- an improvement (reported, never failed): the same the other way;
- not compared (said, never failed): dtypes, modes, call forms or properties one run has
  and the other does not; the largest errors of runs that drew different inputs (another
  profile, seed, sizes or example budget); horizons of sweeps over other positions.

An error below one rounding of the compute dtype is counted as one rounding (1 / K_OPS
tolerance units; u relative to the pair's magnitude for the profile): the difference
between a bit-exact result and a once-rounded one is not a precision regression, and
ratios of figures that small say nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ropecheck.properties.tolerance import K_OPS, ErrorModel
from ropecheck.session.options import REGRESSION_FACTOR, UsageError

DEFAULT_FACTOR = REGRESSION_FACTOR
HORIZON_STEP = 2  # a horizon that fell to half or less is a regression
ONE_ROUNDING = 1.0 / K_OPS  # one rounding of the compute dtype, in tolerance units
CHECKED = ("passed", "known")  # a result with figures to compare
DRAWN = ("profile", "seed", "sizes", "max_examples")  # what decides the drawn inputs

Key = tuple  # (property, dtype, mode, call)


@dataclass
class Figures:
    status: str
    max_error: Optional[float] = None
    horizon: Optional[int] = None
    swept: bool = False  # the reference's accuracy sweep ran (horizon and profile)
    profile: dict = field(default_factory=dict)  # position -> relative error


@dataclass
class Run:
    """One side of a comparison: the figures of a record, and what decided them."""

    source: str
    target: str
    figures: dict  # Key -> Figures
    drawn: dict  # DRAWN -> value
    unsupported: dict = field(default_factory=dict)  # dtype -> why
    convention: object = None


def _number(value) -> Optional[float]:
    return None if value is None else float(value)  # "inf" (strict JSON) -> inf


def figures_of(status: str, max_error, accuracy: Optional[dict]) -> Figures:
    out = Figures(status, _number(max_error))
    if accuracy and accuracy.get("positions") and accuracy.get("relative_error"):
        out.swept, out.horizon = True, accuracy.get("horizon")
        out.profile = dict(zip(accuracy["positions"], accuracy["relative_error"]))
    return out


def run_of_record(record: dict, source: str) -> Run:
    """A ``ropecheck check --json`` record as one side of a comparison."""
    if record.get("verdict") == "unusable":
        raise UsageError(f"{source} is the record of a run that ended before any verdict: {record.get('reason')}")
    call = record.get("call") or "x"
    figures = {
        (r["property"], r["dtype"], r.get("mode", "eager"), call): figures_of(
            r["status"], r.get("max_error"), r.get("accuracy")
        )
        for r in record["results"]
    }
    options = record.get("options") or {}
    drawn = {
        "profile": record.get("profile"),
        "seed": record.get("seed"),
        "sizes": record.get("sizes"),
        "max_examples": options.get("max_examples"),
    }
    return Run(
        source,
        record.get("target", "?"),
        figures,
        drawn,
        record.get("unsupported_dtypes") or {},
        record.get("convention"),
    )


def runs_of_report(report: dict, source: str) -> dict:
    """A ``ropecheck report`` report.json as one run per target (eager, each target's own call)."""
    env = report.get("envelope", {})
    runs = {}
    for name, target in report["targets"].items():
        figures, unsupported = {}, {}
        for dtype, summary in target["dtypes"].items():
            if "properties" not in summary:
                unsupported[dtype] = summary.get("why", "")
                continue
            for prop, result in summary["properties"].items():
                accuracy = None
                if prop == "reference" and summary.get("error_profile"):
                    accuracy = {**summary["error_profile"], "horizon": summary.get("accuracy_horizon")}
                figures[(prop, dtype, "eager", "")] = figures_of(result["status"], result.get("max_error"), accuracy)
        drawn = {"profile": env.get("profile"), "seed": env.get("seed"), "sizes": None, "max_examples": None}
        runs[name] = Run(source, name, figures, drawn, unsupported, target.get("convention"))
    return runs


def load(path: str):
    """The record at ``path``: a Run (a check record) or {target: Run} (a report.json).
    UsageError (exit 2) when it cannot be read or is neither."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"--baseline: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--baseline: {path} is not JSON: {exc}") from None
    try:
        if isinstance(data, dict) and "targets" in data:
            return runs_of_report(data, path)
        if isinstance(data, dict) and "results" in data:
            return run_of_record(data, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--baseline: {path} is not a ropecheck record ({type(exc).__name__}: {exc})") from None
    raise UsageError(f"--baseline: {path} is neither a `ropecheck check --json` record nor a report.json")


def check_factor(factor) -> float:
    return DEFAULT_FACTOR if factor is None else float(factor)


# --- the comparison ----------------------------------------------------------------------------


@dataclass
class Delta:
    """One figure that changed: ``kind`` is verdict, refused, max_error, horizon or profile."""

    key: Key
    kind: str
    before: object
    after: object
    factor: Optional[float] = None  # after / before (errors), before / after (horizon)
    finding: str = ""  # regression, improvement or "" (changed within the threshold)
    where: str = ""  # the position of a profile delta

    def to_dict(self) -> dict:
        prop, dtype, mode, call = self.key
        factor = None if self.factor is None or not math.isfinite(self.factor) else self.factor
        return {
            "property": prop,
            "dtype": dtype,
            "mode": mode,
            "call": call,
            "figure": self.kind,
            "before": _jsonable(self.before),
            "after": _jsonable(self.after),
            "factor": factor,
            "finding": self.finding,
            "where": self.where,
        }


def _jsonable(value):
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


@dataclass
class Comparison:
    baseline: str
    factor: float
    deltas: list = field(default_factory=list)  # every figure that changed
    not_compared: list = field(default_factory=list)  # what could not be compared, and why
    notes: list = field(default_factory=list)  # what differs between the runs, compared anyway
    compared: int = 0  # figures compared
    updating: bool = False  # --update-baseline: shown, never failed

    @property
    def regressions(self) -> list:
        return [d for d in self.deltas if d.finding == "regression"]

    @property
    def improvements(self) -> list:
        return [d for d in self.deltas if d.finding == "improvement"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions) and not self.updating

    @property
    def shown(self) -> list:
        """The deltas worth a row: every finding, and figures that moved beyond one rounding."""
        return [d for d in self.deltas if d.finding or d.factor is None or f"{d.factor:.3g}" != "1"]

    def for_key(self, key: Key) -> list:
        return [d for d in self.deltas if d.key == key]

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "regression_factor": self.factor,
            "figures_compared": self.compared,
            "regressions": len(self.regressions),
            "improvements": len(self.improvements),
            "deltas": [d.to_dict() for d in self.deltas],
            "not_compared": list(self.not_compared),
            "notes": list(self.notes),
        }


def _ratio(after: float, before: float, floor: float) -> float:
    return max(after, floor) / max(before, floor)


def _error_delta(key: Key, kind: str, before: float, after: float, floor: float, factor: float, where="") -> list:
    if before == after:
        return []
    ratio = _ratio(after, before, floor)
    finding = "regression" if ratio > factor else "improvement" if ratio < 1.0 / factor else ""
    return [Delta(key, kind, before, after, ratio, finding, where)]


def _horizon_delta(key: Key, before: Optional[int], after: Optional[int]) -> list:
    if before == after:
        return []
    b, a = before or 0, after or 0  # none: the strict bound fails at position 0
    factor = math.inf if a == 0 else b / a
    finding = "regression" if a * HORIZON_STEP <= b else "improvement" if b * HORIZON_STEP <= a else ""
    return [Delta(key, "horizon", before, after, factor, finding)]


def _profile_deltas(key: Key, before: dict, after: dict, factor: float) -> list:
    """The error profile: the position where it grew the most and the one where it shrank
    the most (one delta each, not one per position)."""
    floor = ErrorModel(key[1] if key[1] != "-" else "float32").unit  # one rounding, relative to rho
    common = [p for p in before if p in after]
    if not common:
        return []
    ratios = {p: _ratio(after[p], before[p], floor) for p in common}
    worst, best = max(common, key=ratios.__getitem__), min(common, key=ratios.__getitem__)
    out = [d for d in _error_delta(key, "profile", before[worst], after[worst], floor, factor, f"position {worst}")]
    if best != worst:
        out += [
            d
            for d in _error_delta(key, "profile", before[best], after[best], floor, factor, f"position {best}")
            if d.finding == "improvement"
        ]
    return [d for d in out if d.factor != 1.0]


STATUS_RANK = {"passed": 0, "known": 1, "failed": 2, "error": 2}


def _pair(key: Key, before: Figures, after: Figures, factor: float, same_draws: bool, same_sweep: bool) -> list:
    if before.status != after.status:
        b, a = STATUS_RANK.get(before.status), STATUS_RANK.get(after.status)
        if after.status == "skipped" and b is not None:
            return [Delta(key, "refused", before.status, after.status, finding="regression")]
        finding = "" if a is None or b is None else "regression" if a > b else "improvement" if a < b else ""
        return [Delta(key, "verdict", before.status, after.status, finding=finding)]
    if before.status not in CHECKED:
        return []
    out = []
    if same_draws and before.max_error is not None and after.max_error is not None:
        out += _error_delta(key, "max_error", before.max_error, after.max_error, ONE_ROUNDING, factor)
    if before.swept and after.swept:
        if same_sweep:
            out += _horizon_delta(key, before.horizon, after.horizon)
        out += _profile_deltas(key, before.profile, after.profile, factor)
    return out


def _columns(keys) -> dict:
    """(dtype, mode, call) -> the properties run there."""
    out: dict = {}
    for prop, dtype, mode, call in keys:
        out.setdefault((dtype, mode, call), set()).add(prop)
    return out


def describe(column) -> str:
    dtype, mode, call = column
    return " ".join(
        filter(None, [dtype, "" if mode == "eager" else mode, f"call {call}" if call not in ("", "x") else ""])
    )


def drawn_differently(before: dict, after: dict) -> list:
    """What differs of what decides the drawn inputs (a report.json does not say its sizes:
    the profile's; None is a value for the seed and the example budget: none given)."""
    unknown = ("sizes",)
    return [k for k in DRAWN if before.get(k) != after.get(k) and not (k in unknown and None in (before[k], after[k]))]


def compare(before: Run, after: Run, factor: float = DEFAULT_FACTOR, only=None) -> Comparison:
    """``after`` against ``before`` on what both ran (``only``: these keys of ``after``; the
    pytest plugin compares one check at a time and leaves out what it did not run)."""
    out = Comparison(before.source, factor)
    keys_after = list(after.figures) if only is None else [k for k in only if k in after.figures]
    common = [k for k in keys_after if k in before.figures]
    if only is None:
        _missing(out, before, after)
    differ = drawn_differently(before.drawn, after.drawn)
    same_draws = not differ
    if differ and common:
        said = ", ".join(f"{k} {before.drawn.get(k)} -> {after.drawn.get(k)}" for k in differ)
        out.not_compared.append(
            f"largest errors: the two runs drew different inputs ({said}); "
            "verdicts, horizons and error profiles compared"
        )
    for key in common:
        b, a = before.figures[key], after.figures[key]
        same_sweep = not (b.swept and a.swept) or set(b.profile) == set(a.profile)
        if not same_sweep:
            out.not_compared.append(f"horizon of {key[0]} ({describe(key[1:])}): the sweeps covered other positions")
        out.compared += 1
        out.deltas += _pair(key, b, a, factor, same_draws, same_sweep)
    if only is not None:  # a dtype refused now, checked in the baseline
        for key in only:
            if key not in after.figures and key in before.figures and key[1] in after.unsupported:
                out.deltas.append(Delta(key, "refused", before.figures[key].status, "refused", finding="regression"))
    return out


def _missing(out: Comparison, before: Run, after: Run) -> None:
    """What one run has and the other does not: dtypes refused now are regressions."""
    if before.target != after.target:
        out.notes.append(f"the baseline checked {before.target!r}, this run {after.target!r}")
    if before.convention and after.convention and before.convention != after.convention:
        out.notes.append(f"the baseline declared {before.convention}, this run {after.convention}")
    calls = ({k[3] for k in before.figures}, {k[3] for k in after.figures})
    if calls[0] and calls[1] and not calls[0] & calls[1]:
        out.notes.append(f"the baseline called the target as {', '.join(calls[0])}, this run as {', '.join(calls[1])}")
    was, now = _columns(before.figures), _columns(after.figures)
    for column, props in was.items():
        if column not in now:
            dtype = column[0]
            if dtype in after.unsupported and any(
                before.figures[(p,) + tuple(column)].status in CHECKED for p in props
            ):
                for prop in sorted(props):
                    key = (prop,) + tuple(column)
                    out.deltas.append(
                        Delta(key, "refused", before.figures[key].status, "refused", finding="regression")
                    )
            else:
                out.not_compared.append(f"{describe(column)}: in the baseline, not in this run")
        else:
            for prop in sorted(props - now[column]):
                out.not_compared.append(f"{prop} ({describe(column)}): in the baseline, not in this run")
    for column, props in now.items():
        if column not in was:
            out.not_compared.append(f"{describe(column)}: not in the baseline")
        else:
            for prop in sorted(props - was[column]):
                out.not_compared.append(f"{prop} ({describe(column)}): not in the baseline")
