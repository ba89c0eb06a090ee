"""GPU throughput and accuracy of RoPE kernels side by side: ropecheck's fused Triton
kernel, Liger's, flash-attn's Triton rotary, HF eager and torch.compile of HF eager.

Run on a CUDA machine (skipped without one; each library is skipped when not installed):

    python -m pytest benchmarks/bench_gpu_rope.py --benchmark-enable -p no:cacheprovider

Each round is one call timed with CUDA events after an L2 flush (benchmarks/gpu_protocol.py);
extra_info holds the bytes model, GB/s, % of a device-to-device copy of the same bytes
measured in the same run, and the max error against float64 at positions 1e3, 1e5, 1e6.
A table of all rows is printed at the end of the run.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("GPU benchmarks need a CUDA device (none here)", allow_module_level=True)

from benchmarks.gpu_impls import IMPLEMENTATIONS, Config, Unsupported  # noqa: E402
from benchmarks.gpu_protocol import (  # noqa: E402
    ERROR_POSITIONS, ROWS, CudaClock, Row, copy_bandwidth, flush_l2, max_error, qk_bytes)

ROUNDS = 50
TOKENS = {1: (1, 1), 128: (1, 128), 16384: (4, 4096), 32768: (8, 4096)}  # B*S -> (B, S)


def _configs() -> list[Config]:
    configs = [Config(*TOKENS[n], 32, 8, 128, 128) for n in TOKENS]
    big = TOKENS[16384]
    configs += [Config(*big, 32, 8, 128, 128, dtype=d) for d in ("float16", "float32")]
    configs += [Config(*big, 28, 4, 128, 128), Config(*big, 48, 8, 128, 128),
                Config(*big, 32, 8, 64, 64), Config(*big, 32, 8, 256, 256),
                Config(*big, 32, 8, 128, 64),  # partial rotary
                Config(*big, 32, 8, 128, 128, layout="interleaved"),
                Config(*TOKENS[1], 32, 8, 128, 128, layout="interleaved")]
    return configs


CONFIGS = _configs()


def _inputs(cfg: Config):
    generator = torch.Generator(device="cuda").manual_seed(0)
    dtype = getattr(torch, cfg.dtype)
    q = torch.randn(cfg.batch, cfg.seq, cfg.heads_q, cfg.head_dim, device="cuda", dtype=dtype,
                    generator=generator)
    k = torch.randn(cfg.batch, cfg.seq, cfg.heads_k, cfg.head_dim, device="cuda", dtype=dtype,
                    generator=generator)
    offsets = torch.arange(cfg.batch, device="cuda") * 977 % 4096  # per-row KV-cache offsets
    return q, k, offsets[:, None] + torch.arange(cfg.seq, device="cuda")


def _errors(prepare, cfg: Config) -> dict:
    small = Config(1, 64, cfg.heads_q, cfg.heads_k, cfg.head_dim, cfg.rotary_dim, cfg.layout,
                   cfg.dtype, cfg.base)
    return {f"max_error_at_{start}": max_error(
        lambda q, k, p: prepare(small, q, k, p).run(), (cfg.heads_q, cfg.heads_k), cfg.head_dim,
        cfg.rotary_dim, cfg.layout, getattr(torch, cfg.dtype), "cuda", start)
        for start in ERROR_POSITIONS}


@pytest.mark.benchmark(timer=CudaClock(), disable_gc=True)
@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name.replace(" ", "-") for c in CONFIGS])
def test_rope_gpu(benchmark, cfg: Config, implementation: str):
    benchmark.group = cfg.name
    prepare = IMPLEMENTATIONS[implementation]
    q, k, positions = _inputs(cfg)
    try:
        info = _errors(prepare, cfg)
        prepared = prepare(cfg, q, k, positions)  # last: torch.compile's cache holds this shape
    except (ImportError, Unsupported) as exc:
        pytest.skip(f"{implementation}: {exc}")
    benchmark.pedantic(prepared.run, setup=flush_l2, rounds=ROUNDS, warmup_rounds=3)
    read, written = qk_bytes(q, k, cfg.rotary_dim, prepared.inplace)
    moved = read + written + prepared.side_bytes
    info.update(bytes_moved=moved, bytes_qk_read=read, side_bytes=prepared.side_bytes,
                inplace=prepared.inplace, device=torch.cuda.get_device_name())
    if benchmark.stats is not None:  # None under --benchmark-disable
        median = benchmark.stats.stats.median
        copy = copy_bandwidth(read)
        info.update(median_s=median, gb_per_s=moved / median / 1e9, copy_gb_per_s=copy / 1e9,
                    percent_of_copy=100.0 * moved / median / copy)
    benchmark.extra_info.update(info)
    ROWS.append(Row(cfg.name, implementation, info))
