"""Multimodal position ids (seed: RoPE-Tie, RoPE-TV, Qwen2-VL M-RoPE), as pure functions
of a sequence description.

A sequence is a list of segments, in order:
    ("text", n)          n tokens
    ("image", h, w)      h rows x w columns of patches, row-major
    ("video", t, h, w)   t frames of h x w patches, frame-major then row-major
(for Qwen2-VL, h, w are the grid after spatial merging: the LLM's tokens). A builder
returns positions of shape (tokens, n_axes) -- the *builder contract*
``build_positions(segments) -> array (seq, n_axes)``. The first text token is at 0, and
"L" below is the last text position before a medium (-1 at the start).

- RoPE-Tie (2 axes: row, col): text n -> (n, n); patch (i, j), i = 1..h, j = 1..w, at
  (L + i s, L + j t), s = w + 1, t = h + 1; the next text starts at L + (w+1)(h+1).
- RoPE-TV (RoPE-Tie-v2; 2 axes: row, col): patch (i, j) at (b1 + i, b2 + j),
  b1 = L + (wh - h)/2, b2 = L + (wh - w)/2; the next text at L + wh + 1. Positions may be
  half-integers (returned in float64, exactly). With 3 axes (row, col, frame) a video
  t x h x w has patch (i, j, k) at (b1 + i, b2 + j, b3 + k), b_axis = L + (wht - extent)/2,
  and the next text at L + wht + 1 (the seed's 3-D extension); an image is a one-frame video.
- Qwen2-VL M-RoPE (3 axes: t, h, w): text continues from st = previous max + 1 as
  (n, n, n); a medium's patch (k, i, j) (0-based) at (st + k * temporal_scale, st + i,
  st + j); the next text at (max over all its positions and axes) + 1 -- HF 4.x
  ``get_rope_index``. ``temporal_scale`` is Qwen2.5-VL's second_per_grid_t *
  tokens_per_second (1 for Qwen2-VL; positions are truncated to integers like HF's ``.long()``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

KINDS = {"text": 1, "image": 2, "video": 3}


class SegmentError(ValueError):
    """A sequence description that is not a list of well-formed segments."""


def validate_segments(segments) -> list[tuple]:
    out = []
    for seg in segments:
        seg = tuple(seg)
        if not seg or seg[0] not in KINDS or len(seg) != 1 + KINDS[seg[0]]:
            raise SegmentError(f"bad segment {seg!r}: use ('text', n), ('image', h, w) or ('video', t, h, w)")
        if any(not isinstance(v, (int, np.integer)) or v < (0 if seg[0] == "text" else 1) for v in seg[1:]):
            raise SegmentError(f"bad segment {seg!r}: sizes must be integers (>= 1 for media)")
        out.append((seg[0],) + tuple(int(v) for v in seg[1:]))
    return out


def token_count(segments) -> int:
    return sum(int(np.prod(seg[1:])) for seg in validate_segments(segments))


def media_spans(segments) -> list[tuple[str, int, int]]:
    """(kind, first token index, end token index) of every segment."""
    spans, at = [], 0
    for seg in validate_segments(segments):
        n = int(np.prod(seg[1:]))
        spans.append((seg[0], at, at + n))
        at += n
    return spans


def _grid(t: int, h: int, w: int) -> np.ndarray:
    """(k, i, j) of every patch, 1-based, frame-major then row-major: shape (t h w, 3)."""
    k, i, j = np.meshgrid(np.arange(1, t + 1), np.arange(1, h + 1), np.arange(1, w + 1), indexing="ij")
    return np.stack([k.ravel(), i.ravel(), j.ravel()], -1)


def rope_tie_positions(segments) -> np.ndarray:
    """RoPE-Tie (row, col) positions, int64 (tokens, 2). Videos are not defined by the seed."""
    rows, nxt = [], 0
    for seg in validate_segments(segments):
        if seg[0] == "text":
            p = np.arange(nxt, nxt + seg[1])
            rows.append(np.stack([p, p], -1))
            nxt += seg[1]
        elif seg[0] == "image":
            _, h, w = seg
            L = nxt - 1
            g = _grid(1, h, w)
            rows.append(np.stack([L + g[:, 1] * (w + 1), L + g[:, 2] * (h + 1)], -1))
            nxt = L + (w + 1) * (h + 1)
        else:
            raise SegmentError("RoPE-Tie defines text and images only (the seed leaves video to RoPE-TV)")
    return np.concatenate(rows or [np.zeros((0, 2))]).astype(np.int64).reshape(-1, 2)


def rope_tv_positions(segments, n_axes: int = 2) -> np.ndarray:
    """RoPE-TV positions, float64 (tokens, n_axes): 2 axes (row, col) for text + images,
    3 axes (row, col, frame) for text + images + videos. Exact (half-integers)."""
    if n_axes not in (2, 3):
        raise ValueError(f"RoPE-TV has 2 or 3 axes, got {n_axes}")
    rows, nxt = [], Fraction(0)
    for seg in validate_segments(segments):
        if seg[0] == "text":
            rows += [[nxt + a] * n_axes for a in range(seg[1])]
            nxt += seg[1]
            continue
        if seg[0] == "video" and n_axes == 2:
            raise SegmentError("2-D RoPE-TV has no video: use 3 axes")
        t, h, w = (1,) + seg[1:] if seg[0] == "image" else seg[1:]
        L = nxt - 1
        n = (w * h * t) if n_axes == 3 else (w * h)
        extents = (h, w, t)[:n_axes]
        beta = [L + Fraction(n - e, 2) for e in extents]
        for k, i, j in _grid(t, h, w).tolist():
            rows.append([beta[0] + i, beta[1] + j] + ([beta[2] + k] if n_axes == 3 else []))
        nxt = L + n + 1
    return np.array([[float(v) for v in r] for r in rows], dtype=np.float64).reshape(-1, n_axes)


def qwen2vl_positions(segments, temporal_scale: float = 1.0) -> np.ndarray:
    """Qwen2-VL (temporal_scale 1) / Qwen2.5-VL M-RoPE (t, h, w) positions, int64 (tokens, 3)."""
    rows, st = [], 0
    for seg in validate_segments(segments):
        if seg[0] == "text":
            p = np.arange(st, st + seg[1])
            block = np.stack([p, p, p], -1)
        else:
            t, h, w = (1,) + seg[1:] if seg[0] == "image" else seg[1:]
            g = _grid(t, h, w) - 1
            block = np.stack([(g[:, 0] * temporal_scale).astype(np.int64), g[:, 1], g[:, 2]], -1) + st
        rows.append(block)
        if len(block):
            st = int(block.max()) + 1
    return np.concatenate(rows or [np.zeros((0, 3))]).astype(np.int64).reshape(-1, 3)


def flat_positions(segments, n_axes: int = 1) -> np.ndarray:
    """Plain 1-D RoPE over the flattened sequence, (n, .., n): what every builder must give
    on text-only input (compatibility)."""
    n = token_count(segments)
    return np.repeat(np.arange(n)[:, None], n_axes, axis=1)


BUILDERS = {
    "rope-tie": (rope_tie_positions, 2),
    "rope-tv": (rope_tv_positions, 2),
    "mrope": (qwen2vl_positions, 3),
}


def reference_builder(family: str, n_axes: int | None = None):
    """The reference ``build_positions`` of a family, and its number of axes."""
    if family not in BUILDERS:
        raise ValueError(f"unknown builder family {family!r}; known: {', '.join(BUILDERS)}")
    fn, default_axes = BUILDERS[family]
    n_axes = default_axes if n_axes is None else n_axes
    if family == "rope-tv":
        return (lambda segments: rope_tv_positions(segments, n_axes)), n_axes
    if n_axes != default_axes:
        raise ValueError(f"{family} has {default_axes} axes, not {n_axes}")
    return fn, n_axes


def describe_segments(segments: Sequence) -> str:
    return " + ".join(f"{s[0]} {'x'.join(map(str, s[1:]))}" for s in segments) or "empty"
