"""Identify an N-D rotary position embedding (``ropecheck identify --family nd --axes N``).

The target, rope(x, positions (batch, seq, N)), is called once on the standard basis (head
j holds e_j, as the 1-D probes do) at positions moved along one axis at a time: the zero
vector and m e_a for m = 1, 2, 3, 4, 8, .. 2^20, for every axis a (``--positions float``:
float32 coordinates m FLOAT_STEP). When the target refuses that call, the top comes down
(1024, 512, 128, 16: a table of so many rows) and the largest position it takes is found
by bisection (``--max-position``). Each axis' matrices are read as the 1-D engine reads
its probe (``inference``: linear, norms and orthogonality, the coupled features, the 2x2
blocks a R(phi)); then, per pair, the angle relative to position 0 is unwrapped along each
axis (``inference.unwrap``): a pair must turn with exactly one axis, and its angle per
unit of that axis is its frequency theta; an angle at position 0 is its phase.

The probed pairs (first, second, axis, theta, phase) are a ``reference.nd.PairRotation``.
One matching step names it: every candidate declaration (``--family axial`` in each layout
and pair span, ``--family mrope`` in each layout, chunked or interleaved) is built by
``reference.nd`` with the split or sections the pair counts per axis give, its bases
(and coordinate scales, only when no declaration without one matches) fitted on the
probed frequencies in the candidate's own pair order (``inference.fit_base``), phases that
are theta O_a an offset per axis; the first whose pair table equals the probed one (same
pairs, same orientation, same axes, frequencies within their error bounds) gives the
flags. Otherwise the pair table itself (``--family pairs --pair-table FILE.json``)
expresses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import numpy as np

from ropecheck.calling.caller import DEFAULT_TIMEOUT
from ropecheck.identification.fitting import number
from ropecheck.identification.inference import (
    Bounds,
    check_linear,
    check_norms,
    fit_base,
    pair_blocks,
    record,
    round_within,
    structure,
    unwrap,
)
from ropecheck.identification.probe import Probe, choose_probe, linearity_vectors, probe_at
from ropecheck.identification.result import (
    DEFAULT_MAX_POSITION,
    PINNED,
    Evidence,
    NotRotary,
    UnusableTarget,
)
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.tolerance import ErrorModel
from ropecheck.reference import nd as ndref
from ropecheck.session.loading import TargetLoadError, load
from ropecheck.targets.target import Target

# the probe's largest position per axis, tried in turn (capped at the limit): 2^20 pins the low
# frequencies (as the 1-D engine's large call), the others are what tables of 1024 .. 17 rows take
ND_TOPS = (2**20, 1024, 512, 128, 16)
FLOAT_STEP = 2.0**-6  # --positions float: the ladder starts here (frequencies up to 64 pi per unit are read)
FIT_SLACK = 2.0**-22  # relative: a candidate's float64 frequency from a rounded base, beyond the measured bound


@dataclass
class NDIdentification:
    target: str
    n_axes: int
    rotary: bool = False  # an N-D rotary embedding ropecheck can name (flags or a pair table)
    reasons: list = field(default_factory=list)
    dtype: str = ""
    head_dim: int = 0
    max_position: int = 0  # per axis
    phase_error: float = 0.0  # bound on a phase read at position 0
    step: float = 1  # the probe's smallest position step: 1 (int64 positions) or FLOAT_STEP (float32 coordinates)
    refused_above: Optional[int] = None  # the largest position the target takes, when it refuses larger ones
    evidence: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    pairs: list = field(default_factory=list)  # [first, second, axis, theta, phase], by first feature
    theta_error: list = field(default_factory=list)
    pass_through: list = field(default_factory=list)
    family: Optional[str] = None  # axial, mrope or pairs
    declared: list = field(default_factory=list)  # the flags, as words (pairs: without the table's path)
    table_path: Optional[str] = None  # where the pair table was written
    confidence: str = "none"

    @property
    def worst_ratio(self) -> float:
        return max((e.ratio for e in self.evidence if e.judged), default=0.0)

    @property
    def table(self) -> dict:
        """The probed rotation in ``--pair-table`` form (``reference.nd.to_table``)."""
        first, second, axis, theta, phase = (tuple(column) for column in zip(*self.pairs)) if self.pairs else [()] * 5
        conv = ndref.PairRotation(
            self.head_dim,
            self.n_axes,
            first,
            second,
            axis,
            theta,
            description=f"identified by ropecheck identify from {self.target}",
            phase=phase,
        )
        return ndref.to_table(conv)

    @property
    def flags(self) -> str:
        if not self.rotary or self.family is None:
            return ""
        if self.family == "pairs":
            return " ".join(self.declared + ["--pair-table", self.table_path or "FILE.json"])
        return " ".join(self.declared)

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(flags=self.flags, table=self.table, worst_ratio=self.worst_ratio)
        return out


# --- the probe ------------------------------------------------------------------------


def ladder_to(top: int, step: float = 1) -> list:
    """step times 1, 2, 3, 4, 8, .. up to top."""
    return [step * m for m in (1, 2, 3) + tuple(2**k for k in range(2, 27)) if step * m <= top]


def axis_positions(n_axes: int, top: int, step: float = 1) -> list:
    """The zero vector, then m e_a for every axis a and m in step (1, 2, 3, 4, 8, ..) up to top."""
    ladder = ladder_to(top, step)
    rows = [(0 * step,) * n_axes]
    for a in range(n_axes):
        rows += [tuple(m if k == a else 0 for k in range(n_axes)) for m in ladder]
    return rows


def probe_axes(caller, ident: NDIdentification, limit: int) -> tuple[Probe, np.ndarray]:
    """One call on the basis and the linearity vectors at ``axis_positions``, its largest
    position the first of ND_TOPS (capped at ``limit``) the target takes; also the ladder."""
    tops = sorted({max(min(t, limit), 1) for t in ND_TOPS}, reverse=True)
    failed: list = []
    prev = limit
    for top in tops:
        rows = axis_positions(ident.n_axes, top, ident.step)
        try:
            probe = probe_at(caller, ident.dtype, ident.head_dim, rows, linearity_vectors(ident.head_dim))
        except CallError as exc:
            failed.append(f"positions up to {top} per axis: {exc}")
            prev = top
            continue
        ident.max_position = top
        if failed:
            ident.refused_above = largest_taken(caller, ident, top, prev)
            ident.notes.append(
                f"positions: the target refuses positions above {ident.refused_above} ({failed[-1]}): "
                f"--max-position {ident.refused_above} declares that to ropecheck check"
            )
        return probe, np.array([0 * ident.step] + ladder_to(top, ident.step))
    raise NotRotary(f"the call contract is broken at every probe range ({'; '.join(failed)})")


def largest_taken(caller, ident: NDIdentification, low: int, high: int) -> int:
    """The largest position in [low, high) the target takes on every axis at once (it takes
    ``low`` and refuses ``high``), by bisection with one token."""
    while high - low > 1:
        middle = (low + high) // 2
        try:
            probe_at(
                caller, ident.dtype, ident.head_dim, [(float(middle) if ident.step != 1 else middle,) * ident.n_axes]
            )
            low = middle
        except CallError:
            high = middle
    return low


def axis_probe(probe: Probe, axis: int, ladder: np.ndarray) -> Probe:
    """The rows of ``probe`` at 0 and along ``axis``, with the axis' position as m."""
    n = len(ladder) - 1
    rows = np.r_[0, 1 + axis * n + np.arange(n)]
    assert probe.extra_inputs is not None and probe.extra_outputs is not None
    return Probe(ladder, probe.matrices[rows], probe.extra_inputs, probe.extra_outputs[rows])


# --- reading the pairs ----------------------------------------------------------------


def read_pairs(ident: NDIdentification, probe: Probe, ladder: np.ndarray):
    """The probed pairs, each oriented counter-clockwise, with its axis, frequency, phase
    and the frequency's error bound; raises NotRotary with the reason."""
    amplitude = float(np.linalg.norm(probe.matrices, axis=1).max())
    bounds = Bounds(ident.dtype, amplitude)
    axes = [axis_probe(probe, a, ladder) for a in range(ident.n_axes)]
    for a, one in enumerate(axes):
        check_linear(ident, one, bounds)
        check_norms(ident, one.matrices, one.positions, bounds, f" (axis {a})")
    pairs, single = structure(ident, probe, None, bounds)
    ident.pass_through = [int(j) for j in single]
    c, s, residual = pair_blocks(probe.matrices, pairs)
    k = int(residual.max(axis=0).argmax())
    record(
        ident,
        "2x2 rotation",
        residual.max(),
        bounds.entry,
        f"blocks are a R(phi) to {residual.max():.3g}",
        f"not a rotation: the block of features {pairs[k]} is not a scaled 2x2 rotation "
        f"(off by {residual.max():.3g}; a reflection or a shear?)",
    )
    z = c + 1j * s
    amp = np.abs(z)
    record(
        ident,
        "amplitude",
        np.abs(amp - amp.mean()).max(),
        2 * bounds.norm,
        f"pair amplitudes {amp.min():.6g} .. {amp.max():.6g}",
        f"not a RoPE: the pairs are scaled differently ({amp.min():.6g} .. {amp.max():.6g})",
    )
    if abs(amp.mean() - 1.0) > 2 * bounds.norm:
        ident.notes.append(
            f"amplitude: rotated pairs are scaled by {amp.mean():.6g}; no N-D family declares that "
            f"(the reference check will fail)"
        )
    phase = np.angle(z[0])  # the angle at position 0
    relative = z * np.exp(-1j * phase)
    n = len(ladder) - 1
    thetas, errors = [], []
    for a in range(ident.n_axes):
        rows = np.r_[0, 1 + a * n + np.arange(n)]
        with np.errstate(divide="ignore", invalid="ignore"):  # theta 0: the pairs this axis does not drive
            # in units of the ladder's step (unwrap starts at 1): per step, then per unit of position
            theta, error, ratios, _, _ = unwrap(ladder / ident.step, relative.real[rows], relative.imag[rows], bounds)
            theta, error = theta / ident.step, error / ident.step
        p, q = np.unravel_index(ratios.argmax(), ratios.shape)
        record(
            ident,
            f"angles linear in x_{a}",
            ratios.max(),
            1.0,
            f"phi(x) = x_{a} theta + phase to {ratios.max():.2g} of the angle bound",
            f"not a RoPE: the angle of features {pairs[q]} is not proportional to position {a} "
            f"at x_{a} = {ladder[p]} ({ratios.max():.3g} times the float32 angle bound; a table that "
            f"wraps or clamps?)",
        )
        thetas.append(theta)
        errors.append(error)
    theta, error = np.array(thetas), np.array(errors)  # (N, pairs)
    driven = np.abs(theta) > 2 * error
    for p, pair in enumerate(pairs):
        axes_of = [int(a) for a in np.nonzero(driven[:, p])[0]]
        if len(axes_of) > 1:
            raise NotRotary(
                f"not an N-D RoPE that ropecheck names: features {pair} turn with axes {axes_of} together "
                f"(theta {', '.join(f'{theta[a, p]:.6g}' for a in axes_of)}): each pair of an axial, M-RoPE or "
                f"pair-table rotation turns with one axis (a sum of the axes' positions?)"
            )
        if not axes_of:
            raise NotRotary(
                f"not an N-D RoPE: features {pair} are coupled but turn with no axis (a fixed rotation "
                f"by {phase[p]:.6g} rad)"
            )
    ident.phase_error = math.sqrt(2.0) * bounds.entry / bounds.a  # of an angle read at position 0
    turned = np.abs(phase) > ident.phase_error
    if turned.any():
        ident.notes.append(
            f"offset: {int(turned.sum())} pairs turn at x = 0 (by up to {np.abs(phase).max():.3g} rad): positions "
            f"offset (--coord-offset when every pair of an axis turns by theta O_a), or a phase (a pair table's)"
        )
    out = []
    for p, pair in enumerate(pairs):
        a = int(np.nonzero(driven[:, p])[0][0])
        t = float(theta[a, p])
        first, second = pair if t > 0 else pair[::-1]
        ph = float(phase[p] if t > 0 else -phase[p]) if turned[p] else 0.0
        # the frequency as simply as its error allows (theta_0 = 1 reads 1, not 0.9999999999989914)
        simple = round_within(abs(t), float(error[a, p]) / abs(t))
        out.append((int(first), int(second), a, simple, ph, float(error[a, p])))
    out.sort()
    ident.pairs = [list(row[:5]) for row in out]
    ident.theta_error = [row[5] for row in out]


# --- matching the declarations --------------------------------------------------------


@dataclass
class Candidate:
    family: str
    words: list  # the flags, bases left out (filled in from the fit)
    build: Callable  # base (one value, or one per axis) -> PairRotation
    per_axis: bool  # one base per axis (axial) or one over the head (mrope)


def candidates(head_dim: int, n_axes: int, counts: list) -> list:
    """The declarations the pair counts per axis allow, simplest first."""
    out = []
    axes = ["--axes", str(n_axes)]
    if all(counts):
        split = [2 * c for c in counts]
        text = ",".join(map(str, split))
        for layout, span in (("interleaved", "axis"), ("half", "axis"), ("half", "head")):
            words = ["--family", "axial", *axes, "--layout", layout, "--split", text]
            words += ["--pair-span", "head"] if span == "head" else []
            out.append(
                Candidate(
                    "axial",
                    words,
                    lambda base, layout=layout, span=span, split=split: ndref.axial(
                        head_dim, n_axes, layout=layout, base=base, split=split, pair_span=span
                    ),
                    True,
                )
            )
    rotated = 2 * sum(counts)
    if rotated <= head_dim:
        sections = ",".join(map(str, counts))
        for interleaved in (False, True):
            for layout in ("half", "interleaved"):
                words = ["--family", "mrope", "--sections", sections, "--layout", layout]
                words += ["--mrope-interleaved"] if interleaved else []
                words += ["--rotary-dim", str(rotated)] if rotated < head_dim else []
                out.append(
                    Candidate(
                        "mrope",
                        words,
                        lambda base, layout=layout, interleaved=interleaved: ndref.mrope(
                            counts, layout=layout, base=base, head_dim=head_dim, interleaved=interleaved
                        ),
                        False,
                    )
                )
    return out


def in_order(conv: ndref.PairRotation, probed: dict):
    """The probed (theta, error) of each of ``conv``'s pairs in its order, or None when
    its pairs, their orientation or their axes differ from the probed ones."""
    first, second, axis, _ = conv.arrays
    if len(first) != len(probed):
        return None
    out = []
    for i, j, a in zip(first.tolist(), second.tolist(), axis.tolist()):
        row = probed.get(frozenset((i, j)))
        if row is None or row[0] != i or row[1] != a:
            return None
        out.append(row[2:])
    return np.array(out)


SCALES = ("none", "simplest", "tight")  # coordinate scales tried in turn: 1 only, the simplest number, 8 digits


def fitted_base(theta, error, width: int, scales: str = "none") -> tuple:
    """(base, S) of frequencies theta_k = S base^(-2k/width): S the coordinate scale, 1 unless
    pinned away from it and ``scales`` allows it (``simplest``: the fewest digits its bound
    allows; ``tight``: 8 digits, for a scale such as 2/3); base None: one pair, any base;
    nan: not geometric, or scaled where ``scales`` is none."""
    if len(theta) == 1:
        scale = round_within(theta[0], (error[0] + FIT_SLACK * theta[0]) / theta[0])
        return (None, scale) if scales != "none" or scale == 1.0 else (math.nan, 1.0)
    ln_s, d_ln_s, ln_b, d_ln_b, ratio, _ = fit_base(theta, error, width)
    if ratio > 1.0 or ln_b <= 0 or d_ln_b > PINNED or d_ln_s > PINNED:
        return math.nan, 1.0
    if abs(ln_s) > d_ln_s and scales == "none":
        return math.nan, 1.0
    scale = round_within(math.exp(-ln_s), FIT_SLACK / 4 if scales == "tight" else d_ln_s) if abs(ln_s) > d_ln_s else 1.0
    return round_within(math.exp(ln_b), d_ln_b), scale


def verify(conv: ndref.PairRotation, measured) -> float:
    """The largest |theta_probed - theta_declared| over its bound (theta_declared: per unit
    of position, its coordinate scale included)."""
    theta = np.asarray(conv.theta) * (np.asarray(conv.scale)[conv.arrays[2]] if conv.scale else 1.0)
    allowed = measured[:, 1] + FIT_SLACK * theta
    return float((np.abs(measured[:, 0] - theta) / allowed).max())


def coordinate_words(shift: list, scales: list) -> list:
    """--coord-scale S and --coord-offset O of theta (S x + O), given phases theta S O_x
    (``shift``: the offsets in units of x) and the scales S."""

    def joined(values) -> str:  # one value for all axes when they agree
        return number(values[0]) if len(set(values)) == 1 else ",".join(number(v) for v in values)

    words = []
    if any(t != 1.0 for t in scales):
        words += ["--coord-scale", joined(scales)]
    if any(shift):
        offset = joined([round_within(o * t, FIT_SLACK) if o else 0.0 for o, t in zip(shift, scales)])
        words += ["--coord-offset" + ("=" if offset.startswith("-") else ""), offset]
    return words


def limit_words(ident: NDIdentification) -> list:
    """--positions float and --max-position N, when the probe needed them."""
    words = ["--positions", "float"] if ident.step != 1 else []
    return words + ([] if ident.refused_above is None else ["--max-position", str(ident.refused_above)])


def offsets(ident: NDIdentification) -> Optional[list]:
    """O_a per axis when every pair's phase is theta O_a of its axis (mod 2 pi), within its
    bounds: O_a from the axis' slowest pair (unambiguous while theta O_a < pi), written as
    simply as that bound allows; None when the phases are not such offsets."""
    out = []
    for a in range(ident.n_axes):
        rows = [(row[3], row[4], e) for row, e in zip(ident.pairs, ident.theta_error) if row[2] == a]
        if not rows:
            out.append(0.0)
            continue
        theta, phase, error = (np.array(v) for v in zip(*rows))
        k = int(theta.argmin())
        offset = round_within(phase[k] / theta[k], ident.phase_error / abs(phase[k])) if phase[k] else 0.0
        allowed = ident.phase_error + abs(offset) * error + ErrorModel.angle_error(np.array([offset]), theta)[0]
        missed = np.abs(np.angle(np.exp(1j * (phase - theta * offset))))
        if (missed > allowed).any():
            return None
        out.append(offset)
    return out


def declared(ident: NDIdentification, cand: Candidate, shape, measured, shift: list, scales: str) -> bool:
    """Whether ``cand``, its bases and coordinate scales fitted on the probed frequencies in
    its own pair order, is the probed rotation; if so its flags become ``ident``'s."""
    axis = shape.arrays[2]
    groups = [axis == a for a in range(ident.n_axes)] if cand.per_axis else [np.ones(len(axis), bool)]
    fits = [fitted_base(measured[g, 0], measured[g, 1], 2 * int(g.sum()), scales) for g in groups]
    bases = [b for b, _ in fits]
    factors = [t for _, t in fits] * (ident.n_axes if not cand.per_axis else 1)
    known = [b for b in bases if b is not None]
    if any(math.isnan(b) for b in known):
        return False
    common = known[0] if known and all(b == known[0] for b in known) else None
    if common is not None or not known:  # one base (an axis of one pair turns at 1 whatever it is)
        base: float | list = 10000.0 if common is None else common
        shown = number(base)
    else:
        base = [b if b is not None else known[0] for b in bases]
        shown = ",".join(number(b) for b in base)
    conv = cand.build(base).with_coordinates(scale=factors)
    ratio = verify(conv, measured)
    if ratio > 1.0:
        return False
    ident.family = cand.family
    ident.declared = cand.words + ["--base", shown] + coordinate_words(shift, factors) + limit_words(ident)
    ident.evidence.append(
        Evidence("declaration", ratio, f"{conv.description}: every pair, axis and frequency as probed")
    )
    return True


def match(ident: NDIdentification) -> None:
    """The first candidate declaration whose pair table is the probed one; else the table."""
    probed = {frozenset(row[:2]): (row[0], row[2], row[3], e) for row, e in zip(ident.pairs, ident.theta_error)}
    counts = [sum(1 for row in ident.pairs if row[2] == a) for a in range(ident.n_axes)]
    idle = [a for a, c in enumerate(counts) if not c]
    if idle:
        ident.notes.append(f"axes: {idle} drive no pair (is --axes {ident.n_axes} more than the target takes?)")
    shift = offsets(ident) if any(row[4] for row in ident.pairs) else [0.0] * ident.n_axes
    if shift is not None:
        shapes = [(cand, cand.build(10000.0)) for cand in candidates(ident.head_dim, ident.n_axes, counts)]
        orders = [(cand, shape, in_order(shape, probed)) for cand, shape in shapes]  # the bases come from the fit
        for scales in SCALES:  # a declaration without a coordinate scale first
            for cand, shape, measured in orders:
                if measured is not None and declared(ident, cand, shape, measured, shift, scales):
                    return
    ident.family = "pairs"
    ident.declared = ["--family", "pairs"] + limit_words(ident)
    ident.notes.append(
        "declaration: no --family axial or mrope declaration has these pairs, axes and frequencies; "
        "the pair table expresses them"
    )


# --- the engine -----------------------------------------------------------------------


def heads_mix(caller, ident: NDIdentification, probe: Probe, ladder: np.ndarray) -> list:
    """Why a refused map may still be a rotation: a head's output that changes with the
    number of heads in the token (the probe's basis heads alone, and with the linearity
    vectors after them) means a rotation across a token's heads, before the head split."""
    rows = axis_positions(ident.n_axes, int(ladder[-1]), ident.step)
    try:
        alone = probe_at(caller, ident.dtype, ident.head_dim, rows)
    except CallError:
        return []
    bound = Bounds(ident.dtype, float(np.abs(probe.matrices).max())).entry
    if np.abs(alone.matrices - probe.matrices).max() <= bound:
        return []
    return [
        f"a head's output depends on the token's other heads ({ident.head_dim} heads and "
        f"{ident.head_dim + len(linearity_vectors(ident.head_dim))} heads give head 0 different outputs): a rotation "
        f"across a token's heads before the head split (LTX-Video's) is out of identify's reach; "
        f'--family pairs with a table\'s "heads" declares one to ropecheck check'
    ]


def identify_nd(
    target: Target,
    n_axes: int,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
    max_position: int = DEFAULT_MAX_POSITION,
    table_path: Optional[str] = None,
    float_positions: bool = False,
) -> NDIdentification:
    """Probe the N-D ``target`` and name its convention (``rotary`` False with reasons when
    it is not an N-D rotation ropecheck can name). Writes the probed pair table to
    ``table_path`` when given. ``float_positions``: the target takes float32 coordinates,
    probed from FLOAT_STEP on. Raises UnusableTarget when it cannot be called."""
    if n_axes < 1:
        raise ValueError(f"n_axes must be >= 1, got {n_axes}")
    limit = min(max_position, target.max_position) if target.max_position is not None else max_position
    ident = NDIdentification(target=target.name, n_axes=n_axes, step=FLOAT_STEP if float_positions else 1)
    caller = target.caller(timeout)
    try:
        start = [(0 * ident.step,) * n_axes, (1 * ident.step,) * n_axes]
        ident.dtype, ident.head_dim = choose_probe(caller, target, start)
        probe, ladder = probe_axes(caller, ident, max(limit, 1))
        try:
            read_pairs(ident, probe, ladder)
        except NotRotary as exc:
            ident.reasons.append(str(exc))
            ident.reasons += heads_mix(caller, ident, probe, ladder)
            return ident
    except NotRotary as exc:
        ident.reasons.append(str(exc))
        return ident
    except TargetHung as exc:
        raise UnusableTarget(str(exc)) from None
    match(ident)
    ident.rotary = True
    if table_path is not None:
        with open(table_path, "w") as f:
            json.dump(ident.table, f, indent=1)
        ident.table_path = table_path
    ident.confidence = "high" if ident.worst_ratio <= 1.0 and ident.family != "pairs" else "medium"
    return ident


def declared_axes(target: Target) -> int:
    """The axes a target declares: its own, or those its implied flags give (an adapter's
    --axes or --sections); else 2, as ropecheck check's default."""
    if target.n_axes > 1:
        return target.n_axes
    implied = target.implies or {}
    if implied.get("axes"):
        return int(implied["axes"])
    return len(implied["sections"]) if implied.get("sections") else 2


def identify_nd_spec(
    spec,
    n_axes: Optional[int] = None,
    timeout: Optional[float] = DEFAULT_TIMEOUT,
    max_position: int = DEFAULT_MAX_POSITION,
    in_process: bool = False,
    table_path: Optional[str] = None,
    float_positions: bool = False,
) -> NDIdentification:
    """Load ``spec`` as an N-D target and identify it; ``n_axes`` None: what the target
    declares (``declared_axes``)."""
    try:
        target = load(spec, worker=not in_process, family="nd")
    except TargetLoadError as exc:
        raise UnusableTarget(str(exc)) from None
    try:
        axes = n_axes or declared_axes(target)
        return identify_nd(target, axes, timeout, max_position, table_path, float_positions)
    finally:
        target.close()
