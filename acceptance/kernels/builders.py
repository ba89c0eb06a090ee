"""Multimodal position builders for the acceptance corpus: build_positions(segments) ->
array (tokens, n_axes); segments ("text", n), ("image", h, w), ("video", t, h, w)."""
import numpy as np


def _qwen2vl(segments, restart_after_media=True):
    rows, start = [], 0
    for seg in segments:
        if seg[0] == "text":
            n = seg[1]
            rows += [[start + i] * 3 for i in range(n)]
            start += n
        else:
            t, h, w = (1, seg[1], seg[2]) if seg[0] == "image" else seg[1:]
            for ti in range(t):
                for hi in range(h):
                    for wi in range(w):
                        rows.append([start + ti, start + hi, start + wi])
            start = (start + max(t, h, w)) if restart_after_media else start + 1
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def qwen2vl_positions(segments):
    return _qwen2vl(segments)


def qwen2vl_text_resumes_too_early(segments):  # the next text starts one past the media's start
    return _qwen2vl(segments, restart_after_media=False)
