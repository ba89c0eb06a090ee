"""The error columns of the GPU benchmark, on CPU (Triton kernels under the interpreter),
for small head counts: shows each implementation's max error against float64 at positions
1e3, 1e5, 1e6 without a GPU.

    .venv/bin/python benchmarks/cpu_errors.py [--dtype float32] [--heads 4 2] [--head-dim 64]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ropecheck.kernels.triton_env import import_triton  # noqa: E402

import_triton()  # before any library imports triton: the interpreter on CPU

import torch  # noqa: E402
from rich.console import Console  # noqa: E402

from benchmarks.gpu_impls import IMPLEMENTATIONS, Config, Unsupported  # noqa: E402
from benchmarks.gpu_protocol import ERROR_POSITIONS, Row, max_error, render  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--heads", type=int, nargs=2, default=(4, 2))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rotary-dim", type=int)
    parser.add_argument("--layout", default="half")
    parser.add_argument("--skip", nargs="*", default=["hf-compiled"],
                        help="implementations left out (torch.compile is slow on CPU)")
    args = parser.parse_args()
    torch.cuda.device = lambda index: contextlib.nullcontext()  # flash-attn's file asks for it
    cfg = Config(1, 64, *args.heads, args.head_dim, args.rotary_dim or args.head_dim,
                 args.layout, args.dtype)
    rows = []
    for name, prepare in IMPLEMENTATIONS.items():
        if name in args.skip:
            continue
        info = {}
        try:
            for start in ERROR_POSITIONS:
                info[f"max_error_at_{start}"] = max_error(
                    lambda q, k, p: prepare(cfg, q, k, p).run(), args.heads, args.head_dim,
                    cfg.rotary_dim, args.layout, getattr(torch, args.dtype), "cpu", start)
        except (ImportError, Unsupported) as exc:
            info["note"] = f"skipped: {exc}"
        rows.append(Row(cfg.name, name, info))
    Console(width=200).print(render(rows))


if __name__ == "__main__":
    main()
