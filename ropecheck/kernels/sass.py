"""Reading what the compiler made of the kernel: registers, stack, shared and local memory,
and the width of every global load and store, from the cubin's SASS (``cuobjdump``, the
one triton bundles), cached beside triton's cache; and the table ``python -m
ropecheck.kernels.aot`` prints."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional


def tool(name: str) -> Optional[str]:
    """A CUDA binary tool: Triton's bundled copy first, then the PATH."""
    try:
        import triton.backends.nvidia as nvidia

        bundled = os.path.join(os.path.dirname(nvidia.__file__), "bin", name)
        if os.access(bundled, os.X_OK):
            return bundled
    except ImportError:  # pragma: no cover - triton without its nvidia backend
        pass
    return shutil.which(name)


_ACCESS = re.compile(r"\b(?P<op>LDG|STG|LDGSTS)(?P<mods>(?:\.[A-Z0-9_]+)*)")
_LOCAL = re.compile(r"\b(?:LDL|STL)\b")
_RESOURCES = re.compile(r"REG:(?P<reg>\d+)\s+STACK:(?P<stack>\d+)\s+SHARED:(?P<shared>\d+)\s+LOCAL:(?P<local>\d+)")


def access_width(mods: str) -> int:
    """Bits of one global access from its SASS modifiers (".E.128" -> 128): .128 / .64 /
    .U16 / .S16 / .U8 / .S8, else 32."""
    tokens = set(mods.split("."))
    for token, bits in (("128", 128), ("64", 64), ("U16", 16), ("S16", 16), ("U8", 8), ("S8", 8)):
        if token in tokens:
            return bits
    return 32


def read_sass(sass: str) -> dict:
    """Global loads and stores of a SASS listing by width (bits -> count), and the local
    memory instructions (LDL / STL: register spills)."""
    loads: Counter = Counter()
    stores: Counter = Counter()
    for line in sass.splitlines():
        match = _ACCESS.search(line)
        if match:
            (stores if match["op"] == "STG" else loads)[access_width(match["mods"])] += 1
    return {
        "loads": dict(sorted(loads.items())),
        "stores": dict(sorted(stores.items())),
        "local_instructions": len(_LOCAL.findall(sass)),
    }


@dataclass
class Result:
    """One case compiled for one architecture."""

    case: str
    arch: str
    ok: bool
    seconds: float = 0.0
    error: str = ""
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None  # local memory per thread (cuobjdump LOCAL + STACK)
    local_instructions: Optional[int] = None  # LDL/STL in the SASS
    shared_bytes: Optional[int] = None  # what the launch asks for (Triton's metadata)
    num_warps: Optional[int] = None
    loads: dict = field(default_factory=dict)  # bits -> global load instructions
    stores: dict = field(default_factory=dict)  # bits -> global store instructions
    widest_load: Optional[int] = None
    widest_store: Optional[int] = None
    constexprs: dict = field(default_factory=dict)
    aligned: list = field(default_factory=list)  # arguments with tt.divisibility 16
    grid: tuple = ()


def _inspection_cache(key: str) -> Optional[str]:
    """Where the inspection of the cubin with Triton cache key ``key`` is kept: beside
    Triton's cache (``TRITON_CACHE_DIR`` or ~/.triton/cache), in ropecheck-aot/."""
    try:
        import triton

        folder = triton.knobs.cache.dir
    except Exception:  # pragma: no cover - older Triton without knobs
        folder = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if not folder or not key:
        return None
    return os.path.join(folder, "ropecheck-aot", f"{key}.json")


def inspect_cubin(cubin: bytes, key: str = "") -> dict:
    """Registers, stack / local / shared bytes (cuobjdump --dump-resource-usage) and the
    global accesses of the SASS (cuobjdump --dump-sass) of a cubin; kept under ``key``
    (the compiled kernel's hash) so that a second run reads it back."""
    cached = _inspection_cache(key)
    if cached and os.path.exists(cached):
        with open(cached) as handle:
            info = json.load(handle)
        for name in ("loads", "stores"):
            info[name] = {int(bits): n for bits, n in info[name].items()}
        return info
    cuobjdump = tool("cuobjdump")
    if cuobjdump is None:
        raise RuntimeError("cuobjdump not found (it comes in Triton's wheel and with CUDA)")
    with tempfile.TemporaryDirectory(prefix="ropecheck-aot-") as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run([cuobjdump, "--dump-sass", path], capture_output=True, text=True, check=True).stdout
    resources = _RESOURCES.search(usage)
    if resources is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage[:300]!r}")
    info = read_sass(sass)
    info.update(
        registers=int(resources["reg"]),
        stack=int(resources["stack"]),
        local=int(resources["local"]),
        static_shared=int(resources["shared"]),
    )
    if cached:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(cached), exist_ok=True)
            with open(cached + ".tmp", "w") as handle:
                json.dump(info, handle)
            os.replace(cached + ".tmp", cached)
    return info


def _widths(counts: dict) -> str:
    return " ".join(f"{bits}x{n}" for bits, n in sorted(counts.items(), reverse=True)) or "-"


def table(results) -> str:
    """A markdown table of results."""
    lines = [
        "| case | arch | regs | spills (bytes, LDL/STL) | shared | warps | widest load | widest store "
        "| loads (bits x count) | stores | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if not r.ok:
            lines.append(f"| {r.case} | {r.arch} | FAILED: {r.error.splitlines()[0][:200]} |||||||||")
            continue
        lines.append(
            f"| {r.case} | {r.arch} | {r.registers} | {r.spill_bytes}, {r.local_instructions} "
            f"| {r.shared_bytes} | {r.num_warps} | {r.widest_load} | {r.widest_store} "
            f"| {_widths(r.loads)} | {_widths(r.stores)} | {r.seconds:.2f} |"
        )
    return "\n".join(lines)
