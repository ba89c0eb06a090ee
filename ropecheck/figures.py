"""Regenerate docs/figures: ``python -m ropecheck.figures [outdir]`` (matplotlib, Agg).

- decay.png: the long-range decay bound (1/(d/2)) sum_j |S_j| against relative distance,
  d = 128, base 10000 and 500000 (the seed's Mathematica figure);
- multimodal_layouts.png: RoPE-Tie vs RoPE-TV vs Qwen2-VL positions of text 3 + image 3x4 + text 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(outdir: str = "docs/figures") -> None:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "ropecheck"
    import matplotlib.pyplot as plt

    from ropecheck.reference import multimodal as mm
    from ropecheck.reference.relatives import decay_bound

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    r = np.linspace(0, 256, 2049)
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=100)
    for base in (10000.0, 500000.0):
        ax.plot(r, decay_bound(r, 128, base), lw=1, label=f"base {base:g}")
    ax.set_xlabel("relative distance m - n")
    ax.set_ylabel("(1/(d/2)) sum_j |S_j|")
    ax.set_title("RoPE long-range decay bound, d = 128")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "decay.png", metadata={"Software": None})
    plt.close(fig)

    seq = [("text", 3), ("image", 3, 4), ("text", 3)]
    spans = mm.media_spans(seq)
    fig, axes = plt.subplots(1, 3, figsize=(12, 4), dpi=100)
    for ax, (title, p) in zip(
        axes,
        (
            ("RoPE-Tie", mm.rope_tie_positions(seq)),
            ("RoPE-TV", mm.rope_tv_positions(seq)),
            ("Qwen2-VL M-RoPE (h, w axes)", mm.qwen2vl_positions(seq)[:, 1:]),
        ),
    ):
        for kind, a, b in spans:
            ax.scatter(
                p[a:b, 1],
                p[a:b, 0],
                marker="s" if kind == "image" else "o",
                label=kind if a == 0 or kind == "image" else None,
            )
            for t in range(a, b):
                ax.annotate(str(t), (p[t, 1], p[t, 0]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_title(title)
        ax.set_xlabel("axis 2 (column)")
        ax.set_ylabel("axis 1 (row)")
        ax.invert_yaxis()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("positions of text 3 + image 3x4 + text 3 (numbers: token order)")
    fig.tight_layout()
    fig.savefig(out / "multimodal_layouts.png", metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    main(*sys.argv[1:])
