"""Plots of the conformance report: relative error against position on log axes, one
line per target, one figure per dtype (matplotlib, Agg backend, deterministic)."""

from __future__ import annotations

from pathlib import Path


def plot_error_profiles(data: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    dtypes = sorted({d for t in data["targets"].values() for d in t["dtypes"]})
    for dtype in dtypes:
        lines = [
            (name, t["dtypes"][dtype]["error_profile"])
            for name, t in data["targets"].items()
            if t["dtypes"].get(dtype, {}).get("error_profile")
        ]
        if not lines:
            continue
        figure, axes = plt.subplots(figsize=(9, 5.5))
        for number, (name, profile) in enumerate(lines):
            points = [(p, e) for p, e in zip(profile["positions"], profile["relative_error"]) if p > 0]
            axes.loglog(
                [p for p, _ in points],
                [max(e, 1e-17) for _, e in points],
                label=name,
                linewidth=1.2,
                linestyle=("-", "--", ":", "-.")[number % 4],
            )
        axes.set_xlabel("position m")
        axes.set_ylabel("max |y - y_ref| / |pair|")
        axes.set_title(f"error against the float64 reference, {dtype}")
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize=7, ncol=2)
        figure.tight_layout()
        name = f"error_vs_position_{dtype}.png"
        figure.savefig(out_dir / name, dpi=110, metadata={"Software": None})
        plt.close(figure)
        names.append(name)
    return names
