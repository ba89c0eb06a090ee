"""Identify a RoPE implementation by black-box probing (``ropecheck identify``).

The target is called, through :class:`ropecheck.calling.Caller` only, on the standard
basis: batch 1, one token per probe position m, head_dim = d heads, head j holding e_j.
Output head j at position m is column j of the matrix M_m of the map x -> f(x, m). Two
calls are made: a *small* one at positions 0, 1, 2, 3, 4, 8, ..., 2^10 (below the
max_position_embeddings of every dynamic scheme), which also carries the zero vector and
three integer vectors for the linearity test, and a *large* one at 0, 1, 2, 4, ..., 2^20
(retried up to 2^16, then 2^12, when the target refuses large positions). No probe uses a
position above ``max_position`` (``--max-position``, default 2^24) or the target's declared
``max_position``: each of those tops is capped at it.

What is read from the matrices, in order (each step refuses the target with its reason):

1. f(0, m) = 0 (else the encoding is additive), f(v, m) = M_m v (linear);
2. column norms constant in m, columns orthogonal, M_0 = diag(a_j) (position 0 is the
   identity up to an amplitude). When norms change, how they change is measured: xPos-like
   only when log|f(e_j, m)| is a line in m within rounding while its slope is not
   (``_norm_trend``); else the change is reported as it is (size, residuals of that line,
   entries that all are numbers of a coarser dtype, e.g. cos/sin stored in bfloat16);
3. the coupled features: the connected components of {(i, j): |M_m[i, j]| above noise
   for some m}; each must be one feature (pass-through) or a pair (a 2x2 rotation);
4. each pair's 2x2 block is a * R(phi_m); its angle phi_m is unwrapped over the doubling
   positions (predict m * theta, take the nearest 2 pi branch) while the angle error is
   still well under pi/2, which pins the low frequencies; the angles must be linear in m;
5. the pairing is matched to the ``half`` / ``interleaved`` layouts (else reported as an
   exact list of pairs), the sign of the angles gives the direction, the frequencies of
   the two calls are compared (different: they depend on the call's positions, dynamic
   NTK), and log theta_k = -(2k/r) ln(base) - ln(s) is fitted;
6. frequencies that are not geometric: they are measured at the other head dims too
   (EXTRA_HEAD_DIMS and those ``ropecheck check`` draws, when the whole head rotates and the
   target takes them: YaRN's parameters are pinned only per rotary dim); the base from the
   geometric unscaled head (and the tail divided by a factor), the published scalings
   (Llama 3, YaRN) fitted to the rest on the rotary dim with the most pairs and verified at
   every one (``ropecheck.identify_scaling``). Only verified ``--scaling`` values that
   ``reference.scaling.parse`` reads are suggested (``linear:factor=s`` for geometric
   frequencies over s); what no value expresses (an amplitude without YaRN's frequencies,
   dynamic frequencies) is said in the notes.

Error model (every threshold below comes from it; ``ropecheck.tolerance`` derives it).
With u the unit roundoff of the compute dtype (the probe dtype, never finer than float32),
K = K_OPS = 6 and a the largest amplitude seen:

- an entry of M_m is a single rotated coordinate of a unit vector: |error| <= e = K u a +
  floor (floor: the subnormal spacing term);
- a column norm is off by at most nb = sqrt(2) K u a + floor (``ErrorModel.norm_bound``),
  so two norms differ by at most 2 nb and an inner product of two columns by 2 a nb + nb^2;
- f(v) - M_m v, for v exactly representable: f(v)'s own error K u a |v|_2 plus the
  entries' errors summed, (K u a + floor) |v|_1;
- f(0, m) must be exactly zero up to floor (0 times anything is 0);
- a pair's angle read from its block is off by at most sqrt(2) e / a from the angle the
  target used, which is off from m * theta_exact by the float32 allowance
  dphi(m) = 2^-24 |m| theta (2 ln(1/theta) + 6) (``ErrorModel.angle_error``); so an
  unwrapped estimate theta = Phi(m) / m has |theta - theta_exact| <= (dphi(m) +
  sqrt(2) e / a) / m, and the nearest 2 pi branch is provably right while that bound plus
  the prediction error stays below pi/2;
- the fit: with |ln theta_k - ln theta_exact,k| <= sigma_k (the relative bound above), a
  weighted least-squares line with hat matrix H has residuals at most
  sigma_k + sum_j |H_kj| sigma_j; larger residuals mean the frequencies are not geometric
  (per-frequency scaling). The same coefficients bound the error of ln(base) and ln(s).

Every test yields a *ratio*, the largest deviation over its bound (<= 1: what a correct
float32-angle kernel may do). The confidence is ``high`` when every ratio is <= 1 and the
base and scale are pinned to better than 1e-3 relative (so the printed digits are
significant) and the frequencies are geometric or a named scaling is verified, ``medium``
when the ratios are <= 1 but the parameters are coarser (low precision probe dtype, two or
fewer frequencies) or the frequencies are neither.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np
import torch

from ropecheck.calling import DEFAULT_TIMEOUT, Caller, CallError, TargetHung
from ropecheck.dtypes import UNIT_ROUNDOFF, torch_dtype
from ropecheck.identify_scaling import (Measured, Segments, base_candidates, best_segments,
                                        fit_segments, linear_candidate, match, number, wls)
from ropecheck.loading import TargetLoadError, load, load_isolated
from ropecheck.target import Target
from ropecheck.tolerance import K_OPS, U32, ErrorModel

SMALL_POSITIONS = (0, 1, 2, 3) + tuple(2**k for k in range(2, 11))
LARGE_MAX_POSITIONS = (2**20, 2**16, 2**12)  # each capped at the largest position allowed
DEFAULT_MAX_POSITION = 2**24
EXTRA_HEAD_DIMS = (256, 128)  # where a per-frequency scaling is measured too (with check's)
PROBE_DTYPES = ("float64", "float32", "bfloat16", "float16")
PROBE_HEAD_DIMS = (64, 128, 32, 16, 8, 80, 256)
UNWRAP_LIMIT = math.pi / 2  # branch choice is safe while the total angle error is below it
RATIO_CAP = 1e300
PINNED = 1e-3  # relative uncertainty under which base and scale count as pinned


class UnusableTarget(Exception):
    """The target cannot be loaded or called at all (exit status 2)."""


class NotRotary(Exception):
    """The probes show the map is not a rotary embedding (or not one ropecheck can name)."""


@dataclass
class Evidence:
    """One test: the largest deviation over its error bound (<= 1 passes)."""

    test: str
    ratio: float
    detail: str
    judged: bool = True  # False: a measurement (the fit of non-geometric frequencies), not a test


@dataclass
class Identification:
    target: str
    rotary: bool = False
    reasons: list = field(default_factory=list)  # why not a rotary embedding
    dtype: str = ""
    head_dim: int = 0
    evidence: list = field(default_factory=list)
    rotary_dim: Optional[int] = None
    pass_through: list = field(default_factory=list)
    layout: Optional[str] = None
    pairs: list = field(default_factory=list)  # (first, second) in frequency order
    direction: str = "counter-clockwise"
    theta: list = field(default_factory=list)
    theta_error: list = field(default_factory=list)
    max_position: int = 0  # largest position the frequencies were measured to
    geometric: bool = False
    base: Optional[float] = None
    base_error: Optional[float] = None  # relative
    base_pairs: Optional[int] = None  # pairs the base was fitted on
    scale: Optional[float] = None  # linear position scaling s (theta_k = base^(-2k/r) / s)
    scale_error: Optional[float] = None
    amplitude: float = 1.0
    scaled_amplitude: bool = False  # amplitude != 1 beyond rounding (YaRN's attention factor)
    dynamic: bool = False
    dynamic_theta: list = field(default_factory=list)  # frequencies at the large call's positions
    dynamic_base: Optional[float] = None
    named_scalings: list = field(default_factory=list)  # verified --scaling values, best first
    scaling_theta: list = field(default_factory=list)  # float64 inv_freq of named_scalings[0]
    notes: list = field(default_factory=list)
    confidence: str = "none"

    @property
    def worst_ratio(self) -> float:
        return max((e.ratio for e in self.evidence if e.judged), default=0.0)

    @property
    def flags(self) -> str:
        """The ``ropecheck check`` flags that describe the map ('' when none can)."""
        if not self.rotary or self.layout is None or self.base is None:
            return ""
        if not (self.geometric or self.named_scalings):
            return ""
        words = [f"--layout {self.layout}", f"--base {number(self.base)}"]
        if self.rotary_dim is not None and self.rotary_dim < self.head_dim:
            words.append(f"--rotary-dim {self.rotary_dim}")
        if self.scaling:
            words.append(self.scaling)
        return " ".join(words)

    @property
    def options(self) -> dict:
        """The same convention as ``ropecheck.check`` keywords ({} when none can describe it)."""
        if not self.flags:
            return {}
        out = {"layout": self.layout, "base": float(self.base)}
        if self.rotary_dim is not None and self.rotary_dim < self.head_dim:
            out["rotary_dim"] = self.rotary_dim
        if self.named_scalings:
            out["scaling"] = self.named_scalings[0]
        return out

    @property
    def scaling(self) -> str:
        """``--scaling VALUE`` for the verified named scaling ('' when there is none): VALUE
        always parses with reference.scaling.parse; what no value expresses is in the notes."""
        return f"--scaling {shlex.quote(self.named_scalings[0])}" if self.named_scalings else ""

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(flags=self.flags, scaling=self.scaling, options=self.options, worst_ratio=self.worst_ratio)
        return out


def match_named_scalings(measured: Measured, segments: Segments, measurements: list[Measured]):
    """The published scalings (Llama 3, YaRN) whose float64 frequencies and attention factor
    match every measurement (one per rotary dim probed), as verified candidates fitted on
    ``measured`` (``ropecheck.identify_scaling``), and notes in words on the families that
    were fitted but did not verify."""
    return match(measured, segments, measurements,
                 base_candidates(segments.ln_base, segments.d_ln_base))


# --- probing ---------------------------------------------------------------------------

@dataclass
class Probe:
    positions: np.ndarray  # (P,)
    matrices: np.ndarray  # (P, d, d): M[m][:, j] = f(e_j, m)
    extra_inputs: np.ndarray = None  # (k, d) the vectors after the basis
    extra_outputs: np.ndarray = None  # (P, k, d)


def _basis_input(positions, head_dim: int, extra: np.ndarray, dtype: str):
    heads = np.concatenate([np.eye(head_dim), extra]) if extra is not None else np.eye(head_dim)
    x = np.broadcast_to(heads, (1, len(positions)) + heads.shape).copy()
    return (torch.from_numpy(x).to(torch_dtype(dtype)),
            torch.tensor([list(positions)], dtype=torch.int64))


def _probe(caller: Caller, dtype: str, head_dim: int, positions, extra=None) -> Probe:
    x, pos = _basis_input(positions, head_dim, extra, dtype)
    y = caller(x, pos)[0].to(torch.float64).numpy()  # (P, heads, d)
    probe = Probe(np.asarray(positions), np.swapaxes(y[:, :head_dim, :], 1, 2))
    if extra is not None:
        probe.extra_inputs, probe.extra_outputs = extra, y[:, head_dim:, :]
    return probe


def _linearity_vectors(head_dim: int) -> np.ndarray:
    """Zero, v1, v2, v1 + v2 with small integer entries: exact in every dtype."""
    rng = np.random.default_rng(0)
    v1, v2 = (rng.integers(-4, 5, head_dim).astype(np.float64) for _ in range(2))
    return np.stack([np.zeros(head_dim), v1, v2, v1 + v2])


def _choose_probe(caller: Caller, target: Target) -> tuple[str, int]:
    """The first (dtype, head_dim) the target accepts, float64 first; UnusableTarget when
    it raises on all; NotRotary when it returns but always breaks the call contract."""
    head_dims = PROBE_HEAD_DIMS
    if target.rotary_dim:
        r = target.rotary_dim
        head_dims = (2 * r, r) + tuple(h for h in PROBE_HEAD_DIMS if h > r and h != 2 * r)
    raised, broken = [], []
    for dtype in (d for d in PROBE_DTYPES if d in target.dtypes):
        for head_dim in head_dims:
            try:
                _probe(caller, dtype, head_dim, (0, 1))
                return dtype, head_dim
            except CallError as exc:
                (raised if exc.kind == "raised" else broken).append(f"{dtype}, head_dim {head_dim}: {exc}")
            except TargetHung as exc:
                raise UnusableTarget(f"on {dtype}, head_dim {head_dim}: {exc}") from None
    tried = len(raised) + len(broken)
    if broken:
        raise NotRotary(f"the call contract is broken ({broken[0]}; {tried} dtype/head_dim "
                        f"combinations tried)")
    raise UnusableTarget(f"the target cannot be called ({raised[0]}; and on {tried - 1} other "
                         f"dtype/head_dim combinations)")


def _large_positions(limit: int, small_top: int) -> list[tuple]:
    """The large probe's position sets, largest first: 0, 1, 2, 4, ... up to each of
    LARGE_MAX_POSITIONS capped at ``limit``; only those reaching past the small probe."""
    out = []
    for top in LARGE_MAX_POSITIONS:
        top = min(top, limit)
        positions = (0, 1) + tuple(2**k for k in range(1, top.bit_length()))
        if positions[-1] > small_top and positions not in out:
            out.append(positions)
    return out


def _probe_large(caller, dtype, head_dim, notes, limit: int, small_top: int) -> Optional[Probe]:
    ladder = _large_positions(limit, small_top)
    if not ladder:
        notes.append(f"large positions: not probed (the largest position allowed is {limit})")
    for positions in ladder:
        try:
            return _probe(caller, dtype, head_dim, positions)
        except CallError as exc:
            notes.append(f"large positions: positions up to {positions[-1]} failed ({exc})")
        except TargetHung as exc:
            notes.append(f"large positions: positions up to {positions[-1]} hung ({exc})")
            return None
    return None


# --- inference -------------------------------------------------------------------------

class _Bounds:
    """The error bounds of the module docstring for one probe dtype and amplitude."""

    def __init__(self, dtype: str, amplitude: float):
        self.model = ErrorModel(dtype)
        self.a = max(amplitude, 1e-300)
        self.entry = K_OPS * self.model.unit * self.a + self.model.floor
        self.norm = float(self.model.norm_bound(self.a))

    def linearity(self, v: np.ndarray) -> float:
        return (K_OPS * self.model.unit * self.a * (np.linalg.norm(v) + np.abs(v).sum())
                + self.model.floor * (1 + np.abs(v).sum()))

    def angle(self, positions, theta) -> np.ndarray:
        """(P, n) bound on |phi_read(m) - m theta_exact|."""
        return (ErrorModel.angle_error(positions, np.abs(theta))
                + math.sqrt(2.0) * self.entry / self.a)


def _record(ident, test, deviation, bound, detail, failure):
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = float(np.nan_to_num(deviation / bound, nan=0.0, posinf=RATIO_CAP))
    ratio = min(ratio, RATIO_CAP)  # finite, so that JSON stays standard
    ident.evidence.append(Evidence(test, ratio, detail))
    if ratio > 1.0:
        raise NotRotary(failure)


def _check_linear(ident, small: Probe, bounds: _Bounds):
    zero_out, vectors, outputs = small.extra_outputs[:, 0], small.extra_inputs[1:], small.extra_outputs[:, 1:]
    p = np.abs(zero_out).max()
    if p > bounds.model.floor:
        m = int(small.positions[np.abs(zero_out).max(axis=1).argmax()])
        shift = outputs - vectors[None] - zero_out[:, None]
        additive = np.abs(shift).max() <= max(bounds.linearity(v) for v in vectors)
        why = ("f(x, m) - x = p_m for every x: the encoding is additive (sinusoidal-like)"
               if additive else "the map is not linear")
        _record(ident, "zero", p, bounds.model.floor, f"max |f(0, m)| = {p:.3g}",
                f"not a rotary embedding: f(0, m) = p_m != 0 (|p_m| up to {p:.3g}, at m = {m}); {why}")
    ident.evidence.append(Evidence("zero", 0.0, "f(0, m) = 0"))
    worst, where = 0.0, ""
    for k, v in enumerate(vectors):
        dev = np.abs(outputs[:, k] - np.einsum("pij,j->pi", small.matrices, v)).max()
        ratio = dev / bounds.linearity(v)
        if ratio > worst:
            worst, where = ratio, f"|f(v, m) - M_m v| = {dev:.3g} for |v|_1 = {np.abs(v).sum():g}"
    _record(ident, "linearity", worst, 1.0, where or "f(v, m) = M_m v",
            f"not a rotary embedding: the map is not linear ({where}, "
            f"{worst:.3g} times the rounding bound)")


def _norm_trend(norms, positions, dtype: str) -> str:
    """How the column norms change with m, in words (called once they do change).

    xPos scales pair i by zeta_i^((m - c)/s): log|f(e_j, m)| is then a line in m. Each log
    norm is off by at most ln(1 + nb(n)/n) (nb the norm bound at that norm) plus what a float32
    power costs (``properties.xpos_checks``: the scale rounded, its product, XPOS_OPS u; pow and
    a reciprocal, SCALE_POW_CONST u32; the exponent rounded, u32 |p ln zeta| <= u32 times the
    column's largest log-norm change); rounding zeta itself and the centre c only move the
    line. A weighted line per column (``identify_scaling.wls``) is xPos-like when every
    residual is within its bound while some slope is not within its own."""
    from ropecheck.properties.xpos_checks import SCALE_POW_CONST, XPOS_OPS  # only on this path: it is heavy

    model = ErrorModel(dtype)
    m = np.asarray(positions, dtype=np.float64)
    worst, slopes, trend, fitted = 0.0, [], False, 0
    for n in norms.T:
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = model.norm_bound(n) / n
        ok = np.isfinite(n) & (n > 0) & (relative < 0.5)
        if ok.sum() < 3:
            continue
        y = np.log(n[ok])
        sigma = (-np.log1p(-relative[ok]) + XPOS_OPS * model.unit
                 + U32 * (SCALE_POW_CONST + np.abs(y - y[0]).max()))
        beta, d_beta, ratio, _ = wls(np.stack([np.ones(ok.sum()), m[ok]], axis=1), y, sigma)
        fitted += 1
        worst = max(worst, ratio)
        trend |= abs(beta[1]) > d_beta[1]
        slopes.append(beta[1])
    if not fitted:
        return "too few finite norms to tell how they change"
    if worst > 1.0:
        return (f"not as a power of the position: a line fitted to log|f(e_j, m)| against m "
                f"leaves residuals {worst:.3g} times their rounding bound (a scale zeta^(m/s) "
                f"would leave them within it)")
    if not trend:
        return ("with no measurable trend in m (log|f(e_j, m)| is a line in m within rounding, "
                "its slope within its bound)")
    per = np.exp(np.array(slopes))
    return (f"as a power of the position: log|f(e_j, m)| is a line in m (residuals within "
            f"{worst:.2g} of their rounding bound), the norms scale by {per.min():.6g} .. "
            f"{per.max():.6g} per unit of position, as zeta^(m/s) (xPos-like)")


def _coarse_entries(matrices, dtype: str) -> str:
    """Words when every entry of M_m is a number of a coarser dtype than the probe's."""
    values = torch.from_numpy(np.ascontiguousarray(matrices))
    for coarse in ("bfloat16", "float16"):
        if UNIT_ROUNDOFF[coarse] > UNIT_ROUNDOFF[dtype] and torch.equal(
                values.to(torch_dtype(coarse)).to(torch.float64), values):
            return (f"; every entry of M_m is a {coarse} number although the probe is {dtype}: "
                    f"cos/sin (or the output) rounded to {coarse}?")
    return ""


def _check_norms(ident, matrices, positions, bounds: _Bounds, where: str):
    norms = np.linalg.norm(matrices, axis=1)  # (P, d) column norms
    change = np.abs(norms - norms[:1])
    p, j = np.unravel_index(change.argmax(), change.shape)
    if change.max() > 2 * bounds.norm:
        with np.errstate(divide="ignore", invalid="ignore"):
            percent = 100 * float(np.nan_to_num(np.abs(norms / norms[:1] - 1.0), posinf=np.inf).max())
        failure = (f"not a rotation: |f(e_{j}, m)| changes with the position ({norms[0, j]:.6g} at "
                   f"m = {positions[0]}, {norms[p, j]:.6g} at m = {positions[p]}): column norms change "
                   f"by up to {percent:.2g} %, {_norm_trend(norms, positions, ident.dtype)}"
                   f"{_coarse_entries(matrices, ident.dtype)}; norms are not preserved")
    else:
        failure = ""
    _record(ident, f"norms{where}", change.max(), 2 * bounds.norm,
            f"column norms constant in m to {change.max():.3g}", failure)
    gram = np.einsum("pki,pkj->pij", matrices, matrices)
    off = np.abs(gram - np.einsum("pi,ij->pij", np.einsum("pii->pi", gram), np.eye(gram.shape[1])))
    _record(ident, f"orthogonality{where}", off.max(), 2 * bounds.a * bounds.norm + bounds.norm**2,
            f"max |<f(e_i, m), f(e_j, m)>| = {off.max():.3g}",
            f"not a rotation: the columns of M_m are not orthogonal (inner product up to "
            f"{off.max():.3g})")
    return norms[0]


def _check_identity_at_zero(ident, m0, bounds: _Bounds):
    diag = np.diag(m0)
    off = np.abs(m0 - np.diag(diag)).max()
    i, j = np.unravel_index(np.abs(m0 - np.diag(diag)).argmax(), m0.shape)
    _record(ident, "identity at 0", off, bounds.entry, f"max off-diagonal of M_0 = {off:.3g}",
            f"not a RoPE: f(x, 0) is not a multiple of x (f(e_{j}, 0)[{i}] = {m0[i, j]:.3g}); "
            f"position 0 must be the identity (positions offset?)")
    if (diag <= 0).any():
        raise NotRotary(f"not a RoPE: f(e_j, 0) = {diag[diag <= 0][0]:.3g} e_j for "
                        f"j = {int(np.argmax(diag <= 0))}; position 0 must be the identity")


def _components(coupled: np.ndarray) -> list[list[int]]:
    """Connected components of the symmetric boolean adjacency matrix."""
    seen, out = set(), []
    for start in range(coupled.shape[0]):
        if start in seen:
            continue
        stack, comp = [start], []
        seen.add(start)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j in np.nonzero(coupled[i])[0]:
                if int(j) not in seen:
                    seen.add(int(j))
                    stack.append(int(j))
        out.append(sorted(comp))
    return out


def _pair_blocks(matrices, pairs):
    """Per pair (p, q): c, s (the rotation read with p first), and the worst residual of
    the 2x2 block against a * R(phi)."""
    p, q = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    mpp, mqq = matrices[:, p, p], matrices[:, q, q]
    mpq, mqp = matrices[:, p, q], matrices[:, q, p]
    c, s = (mpp + mqq) / 2, (mqp - mpq) / 2
    residual = np.maximum(np.abs(mpp - mqq), np.abs(mqp + mpq)) / 2
    return c, s, residual


def _unwrap(positions, c, s, bounds: _Bounds):
    """theta per pair from its angles at the doubling positions; returns (theta, error
    bound of theta, the angle-linearity ratios, the angles, the position each theta was
    read at)."""
    phi = np.arctan2(s, c)  # (P, n)
    one = int(np.nonzero(positions == 1)[0][0])
    theta = phi[one].copy()
    error = bounds.angle(np.array([1]), theta)[0]
    used = np.ones_like(theta)
    for idx in np.argsort(positions):
        m = float(positions[idx])
        if m <= 1:
            continue
        bound = bounds.angle(np.array([m]), theta)[0]
        safe = bound + m * error < UNWRAP_LIMIT
        branch = np.round((m * theta - phi[idx]) / (2 * math.pi))
        estimate = (phi[idx] + 2 * math.pi * branch) / m
        better = safe & (bound / m < error)
        theta = np.where(better, estimate, theta)
        error = np.where(better, bound / m, error)
        used = np.where(better, m, used)
    m = positions.astype(np.float64)[:, None]
    allowed = bounds.angle(positions, theta) + m * error
    residual = np.abs(np.angle(np.exp(1j * (phi - m * theta))))
    informative = allowed < UNWRAP_LIMIT
    ratios = np.where(informative, residual / allowed, 0.0)
    return theta, error, ratios, phi, used


def _fit(theta, error, rotary_dim):
    """Weighted least squares ln theta_k = b0 + b1 (2k/r); returns (ln_s, d_ln_s, ln_base,
    d_ln_base, ratio, residual / allowed per k). The bounds follow the module docstring."""
    n = len(theta)
    y = np.log(theta)
    sigma = np.log1p(error / theta)
    x = 2.0 * np.arange(n) / rotary_dim
    design = np.stack([np.ones(n), x], axis=1)
    weight = 1.0 / sigma**2
    coef = np.linalg.solve(design.T @ (design * weight[:, None]), (design * weight[:, None]).T)
    beta = coef @ y
    hat = design @ coef
    allowed = sigma + np.abs(hat) @ sigma
    per_k = np.abs(y - design @ beta) / allowed
    d_beta = np.abs(coef) @ sigma
    return -beta[0], d_beta[0], -beta[1], d_beta[1], float(per_k.max()), per_k


def round_within(value: float, relative: float) -> float:
    """The value with the fewest significant digits inside value * exp(+-relative)."""
    low, high = value * math.exp(-relative), value * math.exp(relative)
    for digits in range(1, 16):
        rounded = float(f"{value:.{digits - 1}e}")
        if low <= rounded <= high:
            return rounded
    return value


def _match_layout(pairs, rotary_dim):
    """'half' or 'interleaved' when the unordered pairs are that layout's (over features
    0 .. r-1), with the pairs put in the layout's frequency order; else (None, pairs)."""
    found = {frozenset(p) for p in pairs}
    half = rotary_dim // 2
    for name, layout_pairs in (("half", [(i, i + half) for i in range(half)]),
                               ("interleaved", [(2 * i, 2 * i + 1) for i in range(half)])):
        if found == {frozenset(p) for p in layout_pairs}:
            return name, layout_pairs
    return None, pairs


def _structure(ident, small, large, bounds):
    """Pairs (each (p, q), p < q) and pass-through features, from the coupling graph."""
    matrices = np.concatenate([small.matrices] + ([large.matrices] if large else []))
    coupling = np.abs(matrices).max(axis=0)
    np.fill_diagonal(coupling, 0.0)
    comps = _components((coupling > bounds.entry) | (coupling.T > bounds.entry))
    big = [c for c in comps if len(c) > 2]
    if big:
        comp = big[0]
        shown = ", ".join(map(str, comp[:8])) + (", ..." if len(comp) > 8 else "")
        raise NotRotary(f"not a RoPE: features {{{shown}}} mix together ({len(comp)} features "
                        f"in one invariant subspace): the map is not made of 2x2 rotations of "
                        f"feature pairs")
    edges = {frozenset(c) for c in comps if len(c) == 2}
    loose = max((coupling[i, j] for i in range(len(coupling)) for j in range(i)
                 if frozenset((i, j)) not in edges), default=0.0)
    ident.evidence.append(Evidence("pairing", float(loose / bounds.entry),
                                   f"{len(edges)} coupled pairs; largest other coupling {loose:.3g}"))
    pairs = [tuple(c) for c in comps if len(c) == 2]
    single = [c[0] for c in comps if len(c) == 1]
    if not pairs:
        raise NotRotary("not a rotary embedding: the output does not depend on the position "
                        "(f(x, m) = a x at every probe position): no feature pair rotates")
    diag = matrices[:, single, single]
    change = np.abs(diag - diag[:1]).max(initial=0.0)
    _record(ident, "pass-through", change, 2 * bounds.entry,
            f"{len(single)} features unchanged at every position",
            "not a RoPE: a feature that no other feature couples to changes with the position")
    return pairs, single


def identify(target: Target, timeout: Optional[float] = DEFAULT_TIMEOUT,
             max_position: int = DEFAULT_MAX_POSITION) -> Identification:
    """Probe ``target`` and infer its convention. Raises UnusableTarget when it cannot be
    called; a map that is not a rotary embedding gives ``rotary=False`` with reasons. No
    probe uses a position above ``max_position`` (nor above the target's declared
    ``max_position``)."""
    if max_position < 1:
        raise ValueError(f"max_position must be >= 1, got {max_position}")
    limit = min(max_position, target.max_position) if target.max_position is not None else max_position
    limit = max(limit, 1)
    ident = Identification(target=target.name)
    caller = Caller(target, timeout)
    small_positions = tuple(p for p in SMALL_POSITIONS if p <= limit)
    try:
        ident.dtype, ident.head_dim = _choose_probe(caller, target)
        small = _probe(caller, ident.dtype, ident.head_dim, small_positions,
                       _linearity_vectors(ident.head_dim))
    except NotRotary as exc:
        ident.reasons.append(str(exc))
        return ident
    except CallError as exc:
        ident.reasons.append(f"the call contract is broken at positions up to "
                             f"{small_positions[-1]}: {exc}")
        return ident
    except TargetHung as exc:
        raise UnusableTarget(str(exc)) from None
    try:
        _infer(ident, small, caller, limit)
        ident.rotary = True
    except NotRotary as exc:
        ident.reasons.append(str(exc))
    ident.confidence = _confidence(ident)
    return ident


def _span(probe: Probe) -> str:
    return f" (m <= 2^{int(probe.positions.max()).bit_length() - 1})"


def _infer(ident: Identification, small: Probe, caller: Caller, limit: int):
    amplitude = float(np.linalg.norm(small.matrices, axis=1).max())
    bounds = _Bounds(ident.dtype, amplitude)
    _check_linear(ident, small, bounds)
    _check_norms(ident, small.matrices, small.positions, bounds, _span(small))
    _check_identity_at_zero(ident, small.matrices[0], bounds)
    large = _probe_large(caller, ident.dtype, ident.head_dim, ident.notes, limit,
                         int(small.positions.max()))
    if large is not None:
        _check_norms(ident, large.matrices, large.positions, bounds, _span(large))
    pairs, single = _structure(ident, small, large, bounds)

    # the pairs' blocks, amplitude and angles in each call
    measured = []
    for probe in (small, large) if large is not None else (small,):
        c, s, residual = _pair_blocks(probe.matrices, pairs)
        k = int(residual.max(axis=0).argmax())
        where = _span(probe)
        _record(ident, f"2x2 rotation{where}", residual.max(), bounds.entry,
                f"blocks are a R(phi) to {residual.max():.3g}",
                f"not a rotation: the block of features {pairs[k]} is not a scaled 2x2 rotation "
                f"(off by {residual.max():.3g}; a reflection or a shear?)")
        amp = np.hypot(c, s)
        _record(ident, f"amplitude{where}", np.abs(amp - amp.mean()).max(), 2 * bounds.norm,
                f"pair amplitudes {amp.min():.6g} .. {amp.max():.6g}",
                f"not a RoPE: the pairs are scaled differently ({amp.min():.6g} .. {amp.max():.6g})")
        theta, error, ratios, _, used = _unwrap(probe.positions, c, s, bounds)
        p, k = np.unravel_index(ratios.argmax(), ratios.shape)
        _record(ident, f"angles linear in m{where}", ratios.max(), 1.0,
                f"phi(m) = m theta to {ratios.max():.2g} of the angle bound",
                f"not a RoPE: the angle of features {pairs[k]} is not proportional to the position "
                f"at m = {probe.positions[p]} ({ratios.max():.3g} times the float32 angle bound; "
                f"a cos/sin cache that wraps or clamps?)")
        measured.append((theta, error, int(probe.positions.max()), used))
        ident.amplitude = float(amp.mean())

    ident.scaled_amplitude = abs(ident.amplitude - 1.0) > 2 * bounds.norm
    # the measured amplitude (a mean of hypot(c, s)) is off by at most a norm bound, with one
    # more rounding for an attention factor that multiplies cos and sin
    amplitude_error = float(ErrorModel(ident.dtype, extra_ops=1).norm_bound(bounds.a))
    if ident.scaled_amplitude:
        implied = math.exp((ident.amplitude - 1.0) / 0.1)
        ident.notes.append(f"amplitude: rotated pairs are scaled by {ident.amplitude:.6g} (a YaRN "
                           f"attention factor 0.1 ln(s) + 1 would mean s = {implied:.4g})")
    passed = np.array([small.matrices[0, j, j] for j in single])
    if len(single) and np.abs(passed - 1.0).max() > bounds.entry:
        ident.notes.append(f"pass-through scaled: pass-through features are multiplied by "
                           f"{passed.mean():.6g}")

    theta, error, top, used = measured[0]
    if len(measured) == 2:
        t2, e2, top2, used2 = measured[1]
        if (np.abs(theta - t2) > error + e2).any():
            ident.dynamic = True
        else:
            theta, error, top, used = t2, e2, top2, used2
    ident.max_position = top

    # direction and pairing, then the frequencies
    keys = _orient(ident, pairs, theta, error, single, measured)
    by_pair = dict(zip(pairs, used))
    positions = (large if large is not None and not ident.dynamic else small).positions
    _frequencies(ident, keys, measured, Measured(
        np.array(ident.theta), np.array(ident.theta_error), np.array([by_pair[k] for k in keys]),
        math.sqrt(2.0) * bounds.entry / bounds.a, ident.amplitude, amplitude_error),
        lambda: _measure_more(ident, caller, tuple(int(p) for p in positions)))


def _measure_more(ident, caller, positions) -> list[Measured]:
    """The frequencies at the other head dims of EXTRA_HEAD_DIMS (a scaling's parameters
    may be pinned only per rotary dim: YaRN's integer ramp ends), when the whole head
    rotates in a standard layout; each read as in steps 4-5 (blocks a R(phi), angles linear
    in m), with the bounds of its own amplitude. A head dim the target refuses is noted."""
    from ropecheck.properties.strategies import FREE_HEAD_DIMS  # what ropecheck check draws

    if ident.layout is None or ident.rotary_dim != ident.head_dim:
        return []
    out, refused = [], []
    for head_dim in dict.fromkeys(EXTRA_HEAD_DIMS + FREE_HEAD_DIMS):
        if head_dim == ident.head_dim:
            continue
        try:
            probe = _probe(caller, ident.dtype, head_dim, positions)
        except CallError as exc:
            refused.append(f"{head_dim} ({exc})")
            continue
        except TargetHung as exc:
            refused.append(f"{head_dim} ({exc})")
            break
        half = head_dim // 2
        pairs = ([(i, i + half) for i in range(half)] if ident.layout == "half"
                 else [(2 * i, 2 * i + 1) for i in range(half)])
        bounds = _Bounds(ident.dtype, float(np.linalg.norm(probe.matrices, axis=1).max()))
        c, s, residual = _pair_blocks(probe.matrices, pairs)
        theta, error, ratios, _, used = _unwrap(probe.positions, c, s, bounds)
        if ident.direction != "counter-clockwise":
            theta = -theta
        if residual.max() > bounds.entry or ratios.max() > 1.0 or (theta <= 0).any():
            refused.append(f"{head_dim} (not the same kind of map there: blocks or angles off)")
            continue
        out.append(Measured(theta, error, used, math.sqrt(2.0) * bounds.entry / bounds.a,
                            float(np.hypot(c, s).mean()),
                            float(ErrorModel(ident.dtype, extra_ops=1).norm_bound(bounds.a))))
    if refused:
        ident.notes.append(f"head dims: not measured at {'; '.join(refused)}")
    return out


def _orient(ident, pairs, theta, error, single, measured):
    """Layout, direction, pairs in frequency order, rotary dim; returns the pairs as keys
    (first < second) in frequency order."""
    r, d = 2 * len(pairs), ident.head_dim
    rotated = sorted(i for p in pairs for i in p)
    by_pair = {pair: (t, e) for pair, t, e in zip(pairs, theta, error)}
    dyn = {pair: t for pair, t in zip(pairs, measured[-1][0])} if ident.dynamic else {}
    trailing = rotated == list(range(r)) and single == list(range(r, d))
    layout, ordered = _match_layout(pairs, r) if rotated == list(range(r)) else (None, pairs)
    signs = np.sign([by_pair[p][0] for p in pairs])
    if layout is not None and (signs < 0).all():
        ident.direction = "clockwise (negated angles)"
    elif layout is not None and not (signs > 0).all():
        layout, ordered = None, pairs
    if layout is None:  # orient each pair counter-clockwise, order by frequency
        ordered = [p if by_pair[p][0] > 0 else p[::-1] for p in pairs]
        ordered.sort(key=lambda p: -abs(by_pair[tuple(sorted(p))][0]))
        if len(pairs) > 1:
            ident.notes.append("pairing: no standard layout matches; the exact pairs are listed "
                               "(first, second), highest frequency first")
    ident.layout, ident.pairs = layout, [tuple(int(i) for i in p) for p in ordered]
    keys = [tuple(sorted(p)) for p in ordered]
    ident.theta = [abs(float(by_pair[k][0])) for k in keys]
    ident.theta_error = [float(by_pair[k][1]) for k in keys]
    ident.dynamic_theta = [abs(float(dyn[k])) for k in keys] if ident.dynamic else []
    ident.pass_through = [int(j) for j in single]
    ident.rotary_dim = r if trailing else None
    if not trailing and single:
        ident.notes.append(f"rotary dim: the pass-through features {_ranges(single)} are not the "
                           f"trailing block (--rotary-dim R means features R .. d-1 pass through)")
    return keys


def _frequencies(ident, keys, measured, freq: Measured, more):
    """Base and scale from the frequencies, or the named scaling, or what is measured in words."""
    r = 2 * len(keys)
    theta, error = freq.theta, freq.error
    if len(theta) == 1:
        ident.notes.append("frequencies: one pair only, the base cannot be told")
        return
    ln_s, d_ln_s, ln_b, d_ln_b, ratio, _ = _fit(theta, error, r)
    ident.geometric = ratio <= 1.0
    ident.evidence.append(Evidence("geometric frequencies", ratio,
                                   "ln theta_k linear in k" if ident.geometric else
                                   "frequencies are not base^(-2k/r) / s", judged=ident.geometric))
    if ident.geometric and ln_b > 0:
        ident.base = round_within(math.exp(ln_b), d_ln_b)
        ident.base_error = float(math.expm1(d_ln_b))
        ident.base_pairs = len(theta)
        ident.scale = round_within(math.exp(ln_s), d_ln_s) if abs(ln_s) > d_ln_s else 1.0
        ident.scale_error = float(math.expm1(d_ln_s))
        if ident.scale != 1.0:
            _linear(ident, freq)
        elif ident.scaled_amplitude:
            ident.notes.append(f"scaling: no --scaling value scales the rotated pairs by "
                               f"{ident.amplitude:.6g} with unscaled geometric frequencies (YaRN's and "
                               f"LongRoPE's attention factors come with per-frequency scaling)")
    elif ident.geometric:
        ident.geometric = False
        ident.notes.append("frequencies: they increase with the pair index (reversed order)")
    else:
        _per_frequency(ident, freq, more)
    if ident.dynamic:
        _, _, ln_b2, d2, ratio2, _ = _fit(np.array(ident.dynamic_theta), error, r)
        ident.dynamic_base = round_within(math.exp(ln_b2), d2) if ratio2 <= 1 else None
        at = measured[-1][2]
        ident.notes.append(f"dynamic: the frequencies depend on the call's positions (dynamic "
                           f"NTK): with positions up to {at} "
                           + (f"the base is {ident.dynamic_base:g}" if ident.dynamic_base else
                              "they are not geometric")
                           + f"; the flags describe positions up to {measured[0][2]} (no --scaling "
                             f"value is suggested for frequencies that change with the call)")


def _linear(ident, freq: Measured):
    """Geometric frequencies divided by s: linear:factor=s when it also explains the amplitude."""
    ident.notes.append(f"position scaling: frequencies divided by {ident.scale:g} "
                       f"(linear / position interpolation, m -> m / {ident.scale:g})")
    if ident.dynamic:
        return
    candidate = linear_candidate(freq, ident.base, ident.scale)
    if candidate.verified:
        ident.named_scalings.append(candidate.flag)
        ident.scaling_theta = candidate.theta
        ident.evidence.append(Evidence(f"scaling {candidate.family}",
                                       max(candidate.ratio, candidate.amplitude_ratio),
                                       f"{candidate.flag}: float64 inv_freq and attention factor vs "
                                       f"the measured theta and amplitude"))
    elif candidate.ratio <= 1.0:
        ident.notes.append(f"scaling: the frequencies are {candidate.flag} but the rotated pairs are "
                           f"scaled by {ident.amplitude:.6g}: no --scaling value has both (the flags "
                           f"describe the map without either)")
    else:
        ident.notes.append(f"scaling: {candidate.flag} misses the measured frequencies by "
                           f"{candidate.ratio:.3g} times their bound (the factor is not pinned)")


def _per_frequency(ident, freq: Measured, more):
    """Not geometric: the base from the geometric head (and tail), then the named scalings
    fitted on the rotary dim with the most pairs and verified at every one measured."""
    ident.notes.append("frequencies: not geometric: a per-frequency scaling (YaRN / "
                       "Llama-3 / LongRoPE style); see the table")
    if fit_segments(freq) is None:
        ident.notes.append("base: the leading pairs are not geometric from theta_0 = 1: the base "
                           "cannot be told")
        return
    measurements = [freq] + ([] if ident.dynamic else more())
    measured, segments = best_segments(measurements)
    ident.base = round_within(math.exp(segments.ln_base), segments.d_ln_base)
    ident.base_error = float(math.expm1(segments.d_ln_base))
    ident.base_pairs = segments.pairs
    n = measured.n
    tail = (f" and the last {segments.tail} (divided by {math.exp(segments.ln_scale):.6g})"
            if segments.tail > 1 else "")
    ident.notes.append(f"base: fitted on {segments.pairs} of {n} pairs at rotary dim "
                       f"{measured.rotary_dim}: the first {segments.head} (unscaled){tail}, "
                       f"geometric with one base")
    ident.evidence.append(Evidence(f"geometric head/tail (r = {measured.rotary_dim})", segments.ratio,
                                   f"pairs 0..{segments.head - 1}"
                                   + (f" and {n - segments.tail}..{n - 1}" if segments.tail > 1 else "")
                                   + " are base^(-2k/r) (/ s)"))
    if ident.dynamic:
        return
    dims = ", ".join(str(m.rotary_dim) for m in measurements)
    verified, notes = match_named_scalings(measured, segments, measurements)
    ident.notes += [f"scaling: {note}" for note in notes]
    if verified and verified[0].base != ident.base:
        ident.notes.append(f"base: {number(verified[0].base)}: the fit alone gives {ident.base:g} "
                           f"+-{ident.base_error:.1e}; the named scaling verifies with these digits")
        ident.base = verified[0].base
    verified = [c for c in verified if c.base == ident.base]
    for candidate in verified:
        ident.named_scalings.append(candidate.flag)
        ident.evidence.append(Evidence(f"scaling {candidate.family}",
                                       max(candidate.ratio, candidate.amplitude_ratio),
                                       f"{candidate.flag}: float64 inv_freq and attention factor vs "
                                       f"the measured theta and amplitude at rotary dims {dims}"))
        ident.notes.append(f"scaling: {candidate.family} fitted from the {candidate.how}; verified at "
                           f"rotary dims {dims}: frequencies within {candidate.ratio:.2g}, amplitude "
                           f"within {candidate.amplitude_ratio:.2g} of their bounds")
    if verified:
        ident.scaling_theta = verified[0].theta
        if len(verified) > 1:
            ident.notes.append(f"scaling: {len(verified)} families describe the measured frequencies "
                               f"equally well (too few pairs in the band to tell them apart)")
        if verified[0].family == "llama3":
            ident.notes.append("scaling: Llama 3 depends only on original_max_position_embeddings / "
                               "low_freq_factor and / high_freq_factor (the band edges' wavelengths): "
                               "every parameter set with the same ratios is the same map")
        if verified[0].family == "yarn" and "truncate" not in verified[0].flag:
            ident.notes.append(f"scaling: YaRN's ramp ends are integers at each rotary dim, so "
                               f"original_max_position_embeddings, beta_fast and beta_slow are pinned "
                               f"only to ranges (and only their ratios matter: original / beta_fast, original / beta_slow): the values suggested reproduce rotary dims {dims}")
    else:
        ident.notes.append("scaling: no named scaling (Llama 3, YaRN) matches the measured "
                           "frequencies within their bounds; no --scaling value is suggested")


def _ranges(indices) -> str:
    out, start = [], None
    for k, i in enumerate(indices):
        if start is None:
            start = i
        if k + 1 == len(indices) or indices[k + 1] != i + 1:
            out.append(f"{start}" if start == i else f"{start}..{i}")
            start = None
    return ", ".join(out)


def _confidence(ident: Identification) -> str:
    if not ident.rotary:
        return "none"
    pinned = ((ident.geometric or bool(ident.named_scalings)) and ident.base_error is not None
              and ident.base_error < PINNED and (ident.scale_error or 0.0) < PINNED)
    return "high" if pinned and ident.worst_ratio <= 1.0 else "medium"


def identify_spec(spec: str, timeout: Optional[float] = DEFAULT_TIMEOUT,
                  max_position: int = DEFAULT_MAX_POSITION, in_process: bool = False) -> Identification:
    """Load ``spec`` (file.py:func, module:attr or a built-in name) and identify it, its
    calls running in a worker process unless ``in_process``."""
    try:
        target = load(spec) if in_process else load_isolated(spec)
    except TargetLoadError as exc:
        raise UnusableTarget(str(exc)) from None
    try:
        return identify(target, timeout, max_position)
    finally:
        target.executor_close()
