"""The frequencies of an identified rotary map: measured at more positions and head sizes,
oriented, fitted to base^(-2k/r) / s (the base and a linear position scaling), or matched
to the published per-frequency scalings (``ropecheck.identification.scaling``)."""

from __future__ import annotations

import math

import numpy as np

from ropecheck.identification.fitting import Measured, Segments, base_candidates, fit_segments, number
from ropecheck.identification.inference import Bounds, fit_base, match_layout, pair_blocks, round_within, unwrap
from ropecheck.identification.probe import probe_at
from ropecheck.identification.result import EXTRA_HEAD_DIMS, PINNED, Evidence, Identification
from ropecheck.identification.scaling import best_segments, linear_candidate, match
from ropecheck.properties.core.contract import CallError, TargetHung
from ropecheck.properties.tolerance import ErrorModel


def match_named_scalings(measured: Measured, segments: Segments, measurements: list[Measured]):
    """The published scalings (Llama 3, YaRN) whose float64 frequencies and attention factor
    match every measurement (one per rotary dim probed), as verified candidates fitted on
    ``measured`` (``ropecheck.identify_scaling``), and notes in words on the families that
    were fitted but did not verify."""
    return match(measured, segments, measurements, base_candidates(segments.ln_base, segments.d_ln_base))


def measure_more(ident, caller, positions) -> list[Measured]:
    """The frequencies at the other head dims of EXTRA_HEAD_DIMS (a scaling's parameters
    may be pinned only per rotary dim: YaRN's integer ramp ends), when the whole head
    rotates in a standard layout; each read as in steps 4-5 (blocks a R(phi), angles linear
    in m), with the bounds of its own amplitude. A head dim the target refuses is noted."""
    from ropecheck.properties.inputs.strategies import FREE_HEAD_DIMS  # what ropecheck check draws

    if ident.layout is None or ident.rotary_dim != ident.head_dim:
        return []
    out, refused = [], []
    for head_dim in dict.fromkeys(EXTRA_HEAD_DIMS + FREE_HEAD_DIMS):
        if head_dim == ident.head_dim:
            continue
        try:
            probe = probe_at(caller, ident.dtype, head_dim, positions)
        except CallError as exc:
            refused.append(f"{head_dim} ({exc})")
            continue
        except TargetHung as exc:
            refused.append(f"{head_dim} ({exc})")
            break
        half = head_dim // 2
        pairs = (
            [(i, i + half) for i in range(half)]
            if ident.layout == "half"
            else [(2 * i, 2 * i + 1) for i in range(half)]
        )
        bounds = Bounds(ident.dtype, float(np.linalg.norm(probe.matrices, axis=1).max()))
        c, s, residual = pair_blocks(probe.matrices, pairs)
        theta, error, ratios, _, used = unwrap(probe.positions, c, s, bounds)
        if ident.direction != "counter-clockwise":
            theta = -theta
        if residual.max() > bounds.entry or ratios.max() > 1.0 or (theta <= 0).any():
            refused.append(f"{head_dim} (not the same kind of map there: blocks or angles off)")
            continue
        out.append(
            Measured(
                theta,
                error,
                used,
                math.sqrt(2.0) * bounds.entry / bounds.a,
                float(np.hypot(c, s).mean()),
                float(ErrorModel(ident.dtype, extra_ops=1).norm_bound(bounds.a)),
            )
        )
    if refused:
        ident.notes.append(f"head dims: not measured at {'; '.join(refused)}")
    return out


def orient(ident, pairs, theta, error, single, measured):
    """Layout, direction, pairs in frequency order, rotary dim; returns the pairs as keys
    (first < second) in frequency order."""
    r, d = 2 * len(pairs), ident.head_dim
    rotated = sorted(i for p in pairs for i in p)
    by_pair = {pair: (t, e) for pair, t, e in zip(pairs, theta, error)}
    dyn = {pair: t for pair, t in zip(pairs, measured[-1][0])} if ident.dynamic else {}
    trailing = rotated == list(range(r)) and single == list(range(r, d))
    layout, ordered = match_layout(pairs, r) if rotated == list(range(r)) else (None, pairs)
    signs = np.sign([by_pair[p][0] for p in pairs])
    if layout is not None and (signs < 0).all():
        ident.direction = "clockwise (negated angles)"
    elif layout is not None and not (signs > 0).all():
        layout, ordered = None, pairs
    if layout is None:  # orient each pair counter-clockwise, order by frequency
        ordered = [p if by_pair[p][0] > 0 else p[::-1] for p in pairs]
        ordered.sort(key=lambda p: -abs(by_pair[tuple(sorted(p))][0]))
        if len(pairs) > 1:
            ident.notes.append(
                "pairing: no standard layout matches; the exact pairs are listed "
                "(first, second), highest frequency first"
            )
    ident.layout, ident.pairs = layout, [tuple(int(i) for i in p) for p in ordered]
    keys = [tuple(sorted(p)) for p in ordered]
    ident.theta = [abs(float(by_pair[k][0])) for k in keys]
    ident.theta_error = [float(by_pair[k][1]) for k in keys]
    ident.dynamic_theta = [abs(float(dyn[k])) for k in keys] if ident.dynamic else []
    ident.pass_through = [int(j) for j in single]
    ident.rotary_dim = r if trailing else None
    if not trailing and single:
        ident.notes.append(
            f"rotary dim: the pass-through features {ranges(single)} are not the "
            f"trailing block (--rotary-dim R means features R .. d-1 pass through)"
        )
    return keys


def fit_frequencies(ident, keys, measured, freq: Measured, more):
    """Base and scale from the frequencies, or the named scaling, or what is measured in words."""
    r = 2 * len(keys)
    theta, error = freq.theta, freq.error
    if len(theta) == 1:
        ident.notes.append("frequencies: one pair only, the base cannot be told")
        return
    ln_s, d_ln_s, ln_b, d_ln_b, ratio, _ = fit_base(theta, error, r)
    ident.geometric = ratio <= 1.0
    ident.evidence.append(
        Evidence(
            "geometric frequencies",
            ratio,
            "ln theta_k linear in k" if ident.geometric else "frequencies are not base^(-2k/r) / s",
            judged=ident.geometric,
        )
    )
    if ident.geometric and ln_b > 0:
        ident.base = round_within(math.exp(ln_b), d_ln_b)
        ident.base_error = float(math.expm1(d_ln_b))
        ident.base_pairs = len(theta)
        ident.scale = round_within(math.exp(ln_s), d_ln_s) if abs(ln_s) > d_ln_s else 1.0
        ident.scale_error = float(math.expm1(d_ln_s))
        if ident.scale != 1.0:
            linear_scaling(ident, freq)
        elif ident.scaled_amplitude:
            ident.notes.append(
                f"scaling: no --scaling value scales the rotated pairs by "
                f"{ident.amplitude:.6g} with unscaled geometric frequencies (YaRN's and "
                f"LongRoPE's attention factors come with per-frequency scaling)"
            )
    elif ident.geometric:
        ident.geometric = False
        ident.notes.append("frequencies: they increase with the pair index (reversed order)")
    else:
        per_frequency(ident, freq, more)
    if ident.dynamic:
        _, _, ln_b2, d2, ratio2, _ = fit_base(np.array(ident.dynamic_theta), error, r)
        ident.dynamic_base = round_within(math.exp(ln_b2), d2) if ratio2 <= 1 else None
        at = measured[-1][2]
        ident.notes.append(
            f"dynamic: the frequencies depend on the call's positions (dynamic "
            f"NTK): with positions up to {at} "
            + (f"the base is {ident.dynamic_base:g}" if ident.dynamic_base else "they are not geometric")
            + f"; the flags describe positions up to {measured[0][2]} (no --scaling "
            f"value is suggested for frequencies that change with the call)"
        )


def linear_scaling(ident, freq: Measured):
    """Geometric frequencies divided by s: linear:factor=s when it also explains the amplitude."""
    ident.notes.append(
        f"position scaling: frequencies divided by {ident.scale:g} "
        f"(linear / position interpolation, m -> m / {ident.scale:g})"
    )
    if ident.dynamic:
        return
    candidate = linear_candidate(freq, ident.base, ident.scale)
    if candidate.verified:
        ident.named_scalings.append(candidate.flag)
        ident.scaling_theta = candidate.theta
        ident.evidence.append(
            Evidence(
                f"scaling {candidate.family}",
                max(candidate.ratio, candidate.amplitude_ratio),
                f"{candidate.flag}: float64 inv_freq and attention factor vs the measured theta and amplitude",
            )
        )
    elif candidate.ratio <= 1.0:
        ident.notes.append(
            f"scaling: the frequencies are {candidate.flag} but the rotated pairs are "
            f"scaled by {ident.amplitude:.6g}: no --scaling value has both (the flags "
            f"describe the map without either)"
        )
    else:
        ident.notes.append(
            f"scaling: {candidate.flag} misses the measured frequencies by "
            f"{candidate.ratio:.3g} times their bound (the factor is not pinned)"
        )


def per_frequency(ident, freq: Measured, more):
    """Not geometric: the base from the geometric head (and tail), then the named scalings
    fitted on the rotary dim with the most pairs and verified at every one measured."""
    ident.notes.append(
        "frequencies: not geometric: a per-frequency scaling (YaRN / Llama-3 / LongRoPE style); see the table"
    )
    if fit_segments(freq) is None:
        ident.notes.append("base: the leading pairs are not geometric from theta_0 = 1: the base cannot be told")
        return
    measurements = [freq] + ([] if ident.dynamic else more())
    measured, segments = best_segments(measurements)
    assert measured is not None and segments is not None  # freq's own segments were fitted above
    ident.base = round_within(math.exp(segments.ln_base), segments.d_ln_base)
    ident.base_error = float(math.expm1(segments.d_ln_base))
    ident.base_pairs = segments.pairs
    n = measured.n
    tail = f" and the last {segments.tail} (divided by {math.exp(segments.ln_scale):.6g})" if segments.tail > 1 else ""
    ident.notes.append(
        f"base: fitted on {segments.pairs} of {n} pairs at rotary dim "
        f"{measured.rotary_dim}: the first {segments.head} (unscaled){tail}, "
        f"geometric with one base"
    )
    ident.evidence.append(
        Evidence(
            f"geometric head/tail (r = {measured.rotary_dim})",
            segments.ratio,
            f"pairs 0..{segments.head - 1}"
            + (f" and {n - segments.tail}..{n - 1}" if segments.tail > 1 else "")
            + " are base^(-2k/r) (/ s)",
        )
    )
    if ident.dynamic:
        return
    dims = ", ".join(str(m.rotary_dim) for m in measurements)
    verified, notes = match_named_scalings(measured, segments, measurements)
    ident.notes += [f"scaling: {note}" for note in notes]
    if verified and verified[0].base != ident.base:
        ident.notes.append(
            f"base: {number(verified[0].base)}: the fit alone gives {ident.base:g} "
            f"+-{ident.base_error:.1e}; the named scaling verifies with these digits"
        )
        ident.base = verified[0].base
    verified = [c for c in verified if c.base == ident.base]
    for candidate in verified:
        ident.named_scalings.append(candidate.flag)
        ident.evidence.append(
            Evidence(
                f"scaling {candidate.family}",
                max(candidate.ratio, candidate.amplitude_ratio),
                f"{candidate.flag}: float64 inv_freq and attention factor vs "
                f"the measured theta and amplitude at rotary dims {dims}",
            )
        )
        ident.notes.append(
            f"scaling: {candidate.family} fitted from the {candidate.how}; verified at "
            f"rotary dims {dims}: frequencies within {candidate.ratio:.2g}, amplitude "
            f"within {candidate.amplitude_ratio:.2g} of their bounds"
        )
    if verified:
        ident.scaling_theta = verified[0].theta
        if len(verified) > 1:
            ident.notes.append(
                f"scaling: {len(verified)} families describe the measured frequencies "
                f"equally well (too few pairs in the band to tell them apart)"
            )
        if verified[0].family == "llama3":
            ident.notes.append(
                "scaling: Llama 3 depends only on original_max_position_embeddings / "
                "low_freq_factor and / high_freq_factor (the band edges' wavelengths): "
                "every parameter set with the same ratios is the same map"
            )
        if verified[0].family == "yarn" and "truncate" not in verified[0].flag:
            ident.notes.append(
                f"scaling: YaRN's ramp ends are integers at each rotary dim, so "
                f"original_max_position_embeddings, beta_fast and beta_slow are pinned "
                f"only to ranges (and only their ratios matter: original / beta_fast, original / beta_slow): "
                f"the values suggested reproduce rotary dims {dims}"
            )
    else:
        ident.notes.append(
            "scaling: no named scaling (Llama 3, YaRN) matches the measured "
            "frequencies within their bounds; no --scaling value is suggested"
        )


def ranges(indices) -> str:
    out, start = [], None
    for k, i in enumerate(indices):
        if start is None:
            start = i
        if k + 1 == len(indices) or indices[k + 1] != i + 1:
            out.append(f"{start}" if start == i else f"{start}..{i}")
            start = None
    return ", ".join(out)


def confidence(ident: Identification) -> str:
    if not ident.rotary:
        return "none"
    pinned = (
        (ident.geometric or bool(ident.named_scalings))
        and ident.base_error is not None
        and ident.base_error < PINNED
        and (ident.scale_error or 0.0) < PINNED
    )
    return "high" if pinned and ident.worst_ratio <= 1.0 else "medium"
