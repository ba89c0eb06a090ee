"""What the probes say of the maps structure: linear, norms independent of the
position, f(x, 0) = x, made of 2x2 rotations of feature pairs (which pairs: the layout),
the angles unwrapped over the doubling positions; each test against its error bound."""

from __future__ import annotations

import math

import numpy as np
import torch

from ropecheck.identification.fitting import wls
from ropecheck.identification.probe import Probe
from ropecheck.identification.result import RATIO_CAP, UNWRAP_LIMIT, Evidence, NotRotary
from ropecheck.properties.core.dtypes import UNIT_ROUNDOFF, torch_dtype
from ropecheck.properties.tolerance import K_OPS, U32, ErrorModel


class Bounds:
    """The error bounds of the module docstring for one probe dtype and amplitude."""

    def __init__(self, dtype: str, amplitude: float):
        self.model = ErrorModel(dtype)
        self.a = max(amplitude, 1e-300)
        self.entry = K_OPS * self.model.unit * self.a + self.model.floor
        self.norm = float(self.model.norm_bound(self.a))

    def linearity(self, v: np.ndarray) -> float:
        return K_OPS * self.model.unit * self.a * (np.linalg.norm(v) + np.abs(v).sum()) + self.model.floor * (
            1 + np.abs(v).sum()
        )

    def angle(self, positions, theta) -> np.ndarray:
        """(P, n) bound on |phi_read(m) - m theta_exact|."""
        return ErrorModel.angle_error(positions, np.abs(theta)) + math.sqrt(2.0) * self.entry / self.a


def record(ident, test, deviation, bound, detail, failure):
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ratio = float(np.nan_to_num(deviation / bound, nan=0.0, posinf=RATIO_CAP))
    ratio = min(ratio, RATIO_CAP)  # finite, so that JSON stays standard
    ident.evidence.append(Evidence(test, ratio, detail))
    if ratio > 1.0:
        raise NotRotary(failure)


def check_linear(ident, small: Probe, bounds: Bounds):
    assert small.extra_outputs is not None and small.extra_inputs is not None  # the small probe has them
    zero_out, vectors, outputs = small.extra_outputs[:, 0], small.extra_inputs[1:], small.extra_outputs[:, 1:]
    p = np.abs(zero_out).max()
    if p > bounds.model.floor:
        m = int(small.positions[np.abs(zero_out).max(axis=1).argmax()])
        shift = outputs - vectors[None] - zero_out[:, None]
        additive = np.abs(shift).max() <= max(bounds.linearity(v) for v in vectors)
        why = (
            "f(x, m) - x = p_m for every x: the encoding is additive (sinusoidal-like)"
            if additive
            else "the map is not linear"
        )
        record(
            ident,
            "zero",
            p,
            bounds.model.floor,
            f"max |f(0, m)| = {p:.3g}",
            f"not a rotary embedding: f(0, m) = p_m != 0 (|p_m| up to {p:.3g}, at m = {m}); {why}",
        )
    ident.evidence.append(Evidence("zero", 0.0, "f(0, m) = 0"))
    worst, where = 0.0, ""
    for k, v in enumerate(vectors):
        dev = np.abs(outputs[:, k] - np.einsum("pij,j->pi", small.matrices, v)).max()
        ratio = dev / bounds.linearity(v)
        if ratio > worst:
            worst, where = ratio, f"|f(v, m) - M_m v| = {dev:.3g} for |v|_1 = {np.abs(v).sum():g}"
    record(
        ident,
        "linearity",
        worst,
        1.0,
        where or "f(v, m) = M_m v",
        f"not a rotary embedding: the map is not linear ({where}, {worst:.3g} times the rounding bound)",
    )


def norm_trend(norms, positions, dtype: str) -> str:
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
        sigma = -np.log1p(-relative[ok]) + XPOS_OPS * model.unit + U32 * (SCALE_POW_CONST + np.abs(y - y[0]).max())
        beta, d_beta, ratio, _ = wls(np.stack([np.ones(ok.sum()), m[ok]], axis=1), y, sigma)
        fitted += 1
        worst = max(worst, ratio)
        trend |= abs(beta[1]) > d_beta[1]
        slopes.append(beta[1])
    if not fitted:
        return "too few finite norms to tell how they change"
    if worst > 1.0:
        return (
            f"not as a power of the position: a line fitted to log|f(e_j, m)| against m "
            f"leaves residuals {worst:.3g} times their rounding bound (a scale zeta^(m/s) "
            f"would leave them within it)"
        )
    if not trend:
        return (
            "with no measurable trend in m (log|f(e_j, m)| is a line in m within rounding, its slope within its bound)"
        )
    per = np.exp(np.array(slopes))
    return (
        f"as a power of the position: log|f(e_j, m)| is a line in m (residuals within "
        f"{worst:.2g} of their rounding bound), the norms scale by {per.min():.6g} .. "
        f"{per.max():.6g} per unit of position, as zeta^(m/s) (xPos-like)"
    )


def coarse_entries(matrices, dtype: str) -> str:
    """Words when every entry of M_m is a number of a coarser dtype than the probe's."""
    values = torch.from_numpy(np.ascontiguousarray(matrices))
    for coarse in ("bfloat16", "float16"):
        if UNIT_ROUNDOFF[coarse] > UNIT_ROUNDOFF[dtype] and torch.equal(
            values.to(torch_dtype(coarse)).to(torch.float64), values
        ):
            return (
                f"; every entry of M_m is a {coarse} number although the probe is {dtype}: "
                f"cos/sin (or the output) rounded to {coarse}?"
            )
    return ""


def check_norms(ident, matrices, positions, bounds: Bounds, where: str):
    norms = np.linalg.norm(matrices, axis=1)  # (P, d) column norms
    change = np.abs(norms - norms[:1])
    p, j = np.unravel_index(change.argmax(), change.shape)
    if change.max() > 2 * bounds.norm:
        with np.errstate(divide="ignore", invalid="ignore"):
            percent = 100 * float(np.nan_to_num(np.abs(norms / norms[:1] - 1.0), posinf=np.inf).max())
        failure = (
            f"not a rotation: |f(e_{j}, m)| changes with the position ({norms[0, j]:.6g} at "
            f"m = {positions[0]}, {norms[p, j]:.6g} at m = {positions[p]}): column norms change "
            f"by up to {percent:.2g} %, {norm_trend(norms, positions, ident.dtype)}"
            f"{coarse_entries(matrices, ident.dtype)}; norms are not preserved"
        )
    else:
        failure = ""
    record(
        ident,
        f"norms{where}",
        change.max(),
        2 * bounds.norm,
        f"column norms constant in m to {change.max():.3g}",
        failure,
    )
    gram = np.einsum("pki,pkj->pij", matrices, matrices)
    off = np.abs(gram - np.einsum("pi,ij->pij", np.einsum("pii->pi", gram), np.eye(gram.shape[1])))
    record(
        ident,
        f"orthogonality{where}",
        off.max(),
        2 * bounds.a * bounds.norm + bounds.norm**2,
        f"max |<f(e_i, m), f(e_j, m)>| = {off.max():.3g}",
        f"not a rotation: the columns of M_m are not orthogonal (inner product up to {off.max():.3g})",
    )
    return norms[0]


def check_identity_at_zero(ident, m0, bounds: Bounds):
    diag = np.diag(m0)
    off = np.abs(m0 - np.diag(diag)).max()
    i, j = np.unravel_index(np.abs(m0 - np.diag(diag)).argmax(), m0.shape)
    record(
        ident,
        "identity at 0",
        off,
        bounds.entry,
        f"max off-diagonal of M_0 = {off:.3g}",
        f"not a RoPE: f(x, 0) is not a multiple of x (f(e_{j}, 0)[{i}] = {m0[i, j]:.3g}); "
        f"position 0 must be the identity (positions offset?)",
    )
    if (diag <= 0).any():
        raise NotRotary(
            f"not a RoPE: f(e_j, 0) = {diag[diag <= 0][0]:.3g} e_j for "
            f"j = {int(np.argmax(diag <= 0))}; position 0 must be the identity"
        )


def components(coupled: np.ndarray) -> list[list[int]]:
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


def pair_blocks(matrices, pairs):
    """Per pair (p, q): c, s (the rotation read with p first), and the worst residual of
    the 2x2 block against a * R(phi)."""
    p, q = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    mpp, mqq = matrices[:, p, p], matrices[:, q, q]
    mpq, mqp = matrices[:, p, q], matrices[:, q, p]
    c, s = (mpp + mqq) / 2, (mqp - mpq) / 2
    residual = np.maximum(np.abs(mpp - mqq), np.abs(mqp + mpq)) / 2
    return c, s, residual


def unwrap(positions, c, s, bounds: Bounds):
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


def fit_base(theta, error, rotary_dim):
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


def match_layout(pairs, rotary_dim):
    """'half' or 'interleaved' when the unordered pairs are that layout's (over features
    0 .. r-1), with the pairs put in the layout's frequency order; else (None, pairs)."""
    found = {frozenset(p) for p in pairs}
    half = rotary_dim // 2
    for name, layout_pairs in (
        ("half", [(i, i + half) for i in range(half)]),
        ("interleaved", [(2 * i, 2 * i + 1) for i in range(half)]),
    ):
        if found == {frozenset(p) for p in layout_pairs}:
            return name, layout_pairs
    return None, pairs


def structure(ident, small, large, bounds):
    """Pairs (each (p, q), p < q) and pass-through features, from the coupling graph."""
    matrices = np.concatenate([small.matrices] + ([large.matrices] if large else []))
    coupling = np.abs(matrices).max(axis=0)
    np.fill_diagonal(coupling, 0.0)
    comps = components((coupling > bounds.entry) | (coupling.T > bounds.entry))
    big = [c for c in comps if len(c) > 2]
    if big:
        comp = big[0]
        shown = ", ".join(map(str, comp[:8])) + (", ..." if len(comp) > 8 else "")
        raise NotRotary(
            f"not a RoPE: features {{{shown}}} mix together ({len(comp)} features "
            f"in one invariant subspace): the map is not made of 2x2 rotations of "
            f"feature pairs"
        )
    edges = {frozenset(c) for c in comps if len(c) == 2}
    loose = max(
        (coupling[i, j] for i in range(len(coupling)) for j in range(i) if frozenset((i, j)) not in edges), default=0.0
    )
    ident.evidence.append(
        Evidence(
            "pairing", float(loose / bounds.entry), f"{len(edges)} coupled pairs; largest other coupling {loose:.3g}"
        )
    )
    pairs = [tuple(c) for c in comps if len(c) == 2]
    single = [c[0] for c in comps if len(c) == 1]
    if not pairs:
        raise NotRotary(
            "not a rotary embedding: the output does not depend on the position "
            "(f(x, m) = a x at every probe position): no feature pair rotates"
        )
    diag = matrices[:, single, single]
    change = np.abs(diag - diag[:1]).max(initial=0.0)
    record(
        ident,
        "pass-through",
        change,
        2 * bounds.entry,
        f"{len(single)} features unchanged at every position",
        "not a RoPE: a feature that no other feature couples to changes with the position",
    )
    return pairs, single
