"""The project's Triton kernel compiled ahead of time for GPUs that are not here.

Triton compiles for a named target without a device: ``triton.compile(ASTSource(fn,
signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32))`` returns ttir, ttgir,
llir, ptx and a cubin (ptxas, cuobjdump and nvdisasm come in Triton's wheel). This module
compiles every specialization of ``rope_kernel`` that the checks and the GPU benchmarks
launch, exactly as a launch would specialize it:

- the arguments are the ones ``apply_rope`` hands ``rope_triton.launch`` (the same
  ``_Plan`` and launcher code; the kernel call itself is recorded instead of run), on
  torch's meta device: shapes, strides and dtypes are real, no memory is taken;
- a real launch gives every pointer whose address is divisible by 16 the attribute
  ``tt.divisibility = 16`` (PyTorch's CUDA allocations are 512-byte aligned), every
  integer divisible by 16 the same, and turns an integer equal to 1 (a unit stride) into
  a constant: Triton's own binder (``create_function_from_signature``) and
  ``JITFunction._pack_args`` make that signature / constexprs / attrs triple here, from
  meta tensors whose addresses are aligned like real allocations. Without those hints
  the loads come out 32-bit scalar;
- it compiles for sm_90a (H100 / H200: Triton names capability 90 so) and sm_80 (A100),
  and reads the cubin with cuobjdump: registers, local memory (spills), shared memory,
  and every global load and store instruction of the SASS with its width (``LDG.E.128``:
  128 bits).

    python -m ropecheck.kernels.aot                 # every case, sm_90a and sm_80: a table
    python -m ropecheck.kernels.aot --scope ci --arch sm_90a --json out.json

Compiled kernels are cached by Triton (``~/.triton/cache``, or ``TRITON_CACHE_DIR``):
a second run reads them back. Imports nothing of ropecheck but ``ropecheck.kernels``.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

from ropecheck.kernels.sass import Result, inspect_cubin, table, versions
from ropecheck.kernels.triton_env import bind_for_cuda

ARCHS = {"sm_90a": 90, "sm_80": 80}  # Triton compiles capability 90 as sm_90a
DTYPES = ("bfloat16", "float16", "float32")
LAYOUTS = ("half", "interleaved")
HEADS = ((64, None), (128, None), (256, None), (128, 64))  # (head_dim, rotary_dim)
FORMS = ("x", "qk", "packed", "inplace")
DIRECTIONS = ("forward", "backward")
MAIN = "bfloat16 half 128 qk forward"  # the benchmarks' main row: q 32 heads, k 8, bf16


@dataclass(frozen=True)
class Case:
    """One call of apply_rope: what a check or a benchmark launches.

    form: ``x`` (q alone, positions (batch, seq)), ``qk`` (q and k in one launch),
    ``packed`` (varlen (total, heads, head_dim) with cu_seqlens, per-token positions),
    ``inplace`` (q and k rotated in place), ``decode`` (one token per row, positions from
    per-row offsets, as a KV-cache decode step). direction: forward (rotation by m) or
    backward (by -m, the VJP)."""

    dtype: str = "bfloat16"
    layout: str = "half"
    head_dim: int = 128
    rotary_dim: Optional[int] = None
    form: str = "qk"
    direction: str = "forward"
    batch: int = 4
    seq: int = 4096
    heads_q: int = 32
    heads_k: int = 8

    @property
    def name(self) -> str:
        rotary = (
            f"{self.head_dim}" if self.rotary_dim in (None, self.head_dim) else f"{self.head_dim}/r{self.rotary_dim}"
        )
        return f"{self.dtype} {self.layout} {rotary} {self.form} {self.direction}"


def cases(scope: str = "all") -> list:
    """The cases of a scope. ``all``: dtypes x layouts x head sizes (64, 128, 256, 128 with
    rotary 64) x forms (x, qk, packed, inplace) x directions, at the benchmarks' shape
    (4 x 4096 tokens, 32 q heads, 8 k heads), plus a decode step and one toy-size call
    (head_dim 80, 3 heads: no alignment to speak of). ``ci``: a set covering every value
    of every axis once, the main path first. ``main``: the main path alone."""
    main = Case()
    if scope == "main":
        return [main]
    extra = [
        Case(batch=64, seq=1, form="decode"),
        Case(dtype="float32", head_dim=80, form="x", batch=2, seq=7, heads_q=3, heads_k=3),
    ]
    if scope == "ci":
        return [
            main,
            Case(direction="backward"),
            Case(dtype="float16"),
            Case(dtype="float32", form="x"),
            Case(layout="interleaved"),
            Case(head_dim=64),
            Case(head_dim=256),
            Case(rotary_dim=64),
            Case(form="packed"),
            Case(rotary_dim=64, form="inplace"),
            Case(dtype="float32", layout="interleaved", head_dim=64, form="x", direction="backward"),
            Case(dtype="float16", layout="interleaved", rotary_dim=64, form="packed", direction="backward"),
        ] + extra
    if scope != "all":
        raise ValueError(f"unknown scope {scope!r}: all, ci or main")
    grid = [
        Case(dtype=d, layout=lay, head_dim=h, rotary_dim=r, form=f, direction=dr)
        for d, lay, (h, r), f, dr in itertools.product(DTYPES, LAYOUTS, HEADS, FORMS, DIRECTIONS)
    ]
    grid.sort(key=lambda c: c != main)
    return grid + extra


# ----------------------------------------------------------------------- the launch, recorded


class _Recorder:
    """Stands for ``rope_kernel`` in ``rope_triton``: ``rope_kernel[grid](*args, **kwargs)``
    records the call instead of launching."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.calls.append((grid, args, kwargs))

        return call


class _MetaMemory:
    """Meta tensors at distinct addresses, each aligned as a CUDA allocation is (meta
    tensors report their storage offset as their address; nothing is allocated)."""

    STRIDE = 2**34  # bytes between two tensors' addresses: 512-aligned, never overlapping

    def __init__(self):
        import torch

        self.torch = torch
        self.count = 0
        self.base = torch.empty(2**62, dtype=torch.uint8, device="meta")

    def empty(self, shape, dtype):
        self.count += 1
        size = self.torch.empty((), dtype=dtype).element_size()
        numel = 1
        for n in shape:
            numel *= n
        start = self.count * self.STRIDE
        return self.base[start : start + numel * size].view(dtype).view(shape)


@dataclass
class Launch:
    """A recorded launch: its grid and Triton's signature / constexprs / attrs for it."""

    grid: tuple
    signature: dict
    constexprs: dict
    attrs: dict
    options: object = None

    def key(self) -> str:
        return repr(
            (
                sorted(self.signature.items()),
                sorted(self.constexprs.items()),
                sorted((k, repr(v)) for k, v in self.attrs.items()),
            )
        )


def record(case: Case) -> list:
    """The kernel calls ``apply_rope`` makes for ``case``, as (grid, args, kwargs)."""
    import torch

    from ropecheck.kernels import rope, rope_triton

    dtype = getattr(torch, case.dtype)
    memory = _MetaMemory()
    b, s, hq, hk, d = case.batch, case.seq, case.heads_q, case.heads_k, case.head_dim
    cu_seqlens = max_seqlen = None
    offsets = 0
    if case.form == "packed":
        q = memory.empty((b * s, hq, d), dtype)
        k = None
        positions = memory.empty((b * s,), torch.int64)
        cu_seqlens = memory.empty((b + 1,), torch.int32)
        max_seqlen = s
    elif case.form == "decode":
        q, k = memory.empty((b, s, hq, d), dtype), memory.empty((b, s, hk, d), dtype)
        positions, offsets = None, memory.empty((b,), torch.int64)
    else:
        q = memory.empty((b, s, hq, d), dtype)
        k = memory.empty((b, s, hk, d), dtype) if case.form in ("qk", "inplace") else None
        positions = memory.empty((b, s), torch.int64)
    plan = rope._Plan(q, positions, offsets, cu_seqlens, max_seqlen, case.layout, 10000.0, case.rotary_dim)
    if case.form == "inplace":
        q_out, k_out = q, k
    else:
        q_out = memory.empty(tuple(q.shape), dtype)
        k_out = None if k is None else memory.empty(tuple(k.shape), dtype)
    recorder = _Recorder()
    kernel, rope_triton.rope_kernel = rope_triton.rope_kernel, recorder
    try:
        plan.run(q, k, q_out, k_out, sign=1 if case.direction == "forward" else -1)
    finally:
        rope_triton.rope_kernel = kernel
    return recorder.calls


# ----------------------------------------------------------------------- compiling


_COMPILED_MODULES: dict = {}


def compiled_module(path: str, name: str = "_ropecheck_aot_module"):
    """The Python file ``path`` loaded as a fresh module with TRITON_INTERPRET=0 while its
    kernels are defined, so that its ``@triton.jit`` functions compile (whatever mode the
    rest of this process runs Triton in: without CUDA, ropecheck interprets). Once per path."""
    path = os.path.abspath(path)
    if path not in _COMPILED_MODULES:
        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            spec = importlib.util.spec_from_file_location(f"{name}_{len(_COMPILED_MODULES)}", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
        _COMPILED_MODULES[path] = module
    return _COMPILED_MODULES[path]


def compiled_kernel():
    """``rope_kernel`` as a compiling JITFunction (``compiled_module`` of rope_triton.py)."""
    from ropecheck.kernels import rope_triton

    return compiled_module(rope_triton.__file__, "_ropecheck_aot_rope_triton").rope_kernel


def specialize(kernel, call, capability: int) -> Launch:
    """What a launch of ``kernel`` with this recorded call would compile, for ``capability``."""
    grid, args, kwargs = call
    kwargs = dict(kwargs)
    kwargs.setdefault("debug", bool(getattr(kernel, "debug", False)))
    bound, specialization, options, backend = bind_for_cuda(kernel, args, kwargs, capability)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return Launch(tuple(grid), signature, constexprs, attrs, options)


def compile_launch(launch: Launch, capability: int, kernel=None):
    """``triton.compile`` of a Launch for ``capability``: the CompiledKernel (cached)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = kernel or compiled_kernel()
    source = ASTSource(kernel, launch.signature, launch.constexprs, launch.attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=launch.options.__dict__)


def compile_case(case: Case, arch: str) -> list:
    """Results of every launch ``case`` makes (one for each kernel call), for ``arch``."""
    capability = ARCHS[arch]
    results = []
    try:
        calls = record(case)
    except Exception as exc:  # the launcher refused the case: a result saying so
        return [Result(case.name, arch, False, error=f"recording the launch: {type(exc).__name__}: {exc}")]
    kernel = compiled_kernel()
    for call in calls:
        start = time.perf_counter()
        try:
            launch = specialize(kernel, call, capability)
            compiled = compile_launch(launch, capability, kernel)
            info = inspect_cubin(compiled.asm["cubin"], getattr(compiled, "hash", ""))
        except Exception as exc:
            results.append(
                Result(
                    case.name,
                    arch,
                    False,
                    time.perf_counter() - start,
                    error=f"{type(exc).__name__}: {str(exc).strip()[:2000]}",
                )
            )
            continue
        names = list(kernel.arg_names)
        aligned = [names[path[0]] for path, attrs in launch.attrs.items() if ["tt.divisibility", 16] in attrs]
        constexprs = {names[path[0]]: value for path, value in launch.constexprs.items()}
        results.append(
            Result(
                case.name,
                arch,
                True,
                time.perf_counter() - start,
                registers=info["registers"],
                spill_bytes=info["local"] + info["stack"],
                local_instructions=info["local_instructions"],
                shared_bytes=int(compiled.metadata.shared),
                num_warps=int(compiled.metadata.num_warps),
                loads=info["loads"],
                stores=info["stores"],
                widest_load=max(info["loads"], default=None),
                widest_store=max(info["stores"], default=None),
                constexprs=constexprs,
                aligned=aligned,
                grid=launch.grid,
            )
        )
    return results


def compile_all(scope: str = "all", archs=tuple(ARCHS), progress=None) -> list:
    """compile_case over every case of ``scope`` and every arch in ``archs``."""
    results = []
    for arch in archs:
        for case in cases(scope):
            for result in compile_case(case, arch):
                results.append(result)
                if progress:
                    progress(result)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropecheck.kernels.aot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scope", choices=("all", "ci", "main"), default="all")
    parser.add_argument(
        "--arch", action="append", choices=tuple(ARCHS), help="repeatable; default: every one (sm_90a, sm_80)"
    )
    parser.add_argument("--json", help="write the results here as JSON")
    parser.add_argument("--markdown", help="write the table here as markdown")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = compile_all(
        args.scope,
        tuple(args.arch or ARCHS),
        progress=lambda r: print(
            f"  {r.arch} {r.case}: {'ok' if r.ok else 'FAILED'} ({r.seconds:.1f} s)", file=sys.stderr, flush=True
        ),
    )
    text = table(results)
    print(text)
    failed = [r for r in results if not r.ok]
    elapsed = time.perf_counter() - start
    print(
        f"\n{len(results)} compiled kernels, {len(failed)} failed, {elapsed:.1f} s "
        f"({', '.join(f'{k} {v}' for k, v in versions().items())})"
    )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"versions": versions(), "seconds": elapsed, "results": [asdict(r) for r in results]},
                handle,
                indent=1,
                default=str,
            )
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
