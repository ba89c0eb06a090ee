"""NVIDIA compute-sanitizer around a worker process, and a parser of what it prints.

A RoPE kernel can be numerically right and still read or write memory it does not own: a
masked load that reaches one element past its row, a store past a non-power-of-two rotary
dimension into the next head. The values come out right, so no property check sees it;
compute-sanitizer's memcheck does. This module is the part of ``--sanitize`` that knows
nothing of ropecheck (it imports nothing else from it):

- ``wrap(argv, tool)`` puts ``compute-sanitizer --tool TOOL ...`` in front of the
  worker's interpreter command line (``[sys.executable, "-c", code]``);
- ``environment()`` is what the worker's environment needs for memcheck to see a
  tensor's overrun at all (PyTorch's caching allocator hands out pieces of large
  segments; each tensor must be its own ``cudaMalloc``);
- ``available()`` says why the sanitizer cannot run here (None when it can);
- ``parse(text)`` turns its output (stdout or ``--log-file``) into ``SanitizerReport``
  records, ``error_summary(text)`` reads its ``ERROR SUMMARY`` count, and ``findings``
  groups reports into one per root cause (kernel, kind, access, source line).

The formats parsed are the ones NVIDIA's Compute Sanitizer documentation shows
(https://docs.nvidia.com/compute-sanitizer/ComputeSanitizer/): memcheck's
``Invalid __global__ read of size 4 bytes`` with its ``at``, ``by thread``, ``Address ...
is out of bounds | is misaligned`` and ``and is N bytes after the nearest allocation``
lines; racecheck's analysis (``Race reported between Write access at ... and Read access
at ... [N hazards]``) and hazard (``Potential WAW hazard detected at __shared__ 0x0 in
block (0,0,0)``) reports; initcheck's ``Uninitialized __global__ memory read of size N
bytes``; synccheck's ``Barrier error detected``; CUDA API errors (``Program hit ... on
CUDA API call to ...``) and leaks. Older CUDA-MEMCHECK spellings (``of size 4`` without
``bytes``, ``at 0x90 in kernel``) are accepted too.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, Sequence

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
EXECUTABLE = "compute-sanitizer"
# Exit status compute-sanitizer returns when the program itself succeeded but errors were
# found (its --error-exitcode). Distinct from ropecheck's 0/1/2 and from signals.
ERROR_EXITCODE = 86
# memcheck --padding: bytes of guard after every allocation, so an overrun into the
# allocation that happens to follow is still reported (the planted kernels overrun by up
# to 32 elements of 4 bytes at the production head sizes).
PADDING = 256
PRINT_LIMIT = 100
# The worker's environment under the sanitizer: every tensor its own cudaMalloc, so that
# memcheck knows where each one ends (the caching allocator's 2 MiB segments hide it).
ENVIRONMENT = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def find_executable() -> Optional[str]:
    """compute-sanitizer's path: $COMPUTE_SANITIZER, the PATH, then the CUDA toolkit's
    usual places ($CUDA_HOME/bin, /usr/local/cuda/bin); None when there is none."""
    given = os.environ.get("COMPUTE_SANITIZER")
    if given:
        return given if os.access(given, os.X_OK) else None
    found = shutil.which(EXECUTABLE)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            for sub in ("bin", "compute-sanitizer"):
                path = os.path.join(home, sub, EXECUTABLE)
                if os.access(path, os.X_OK):
                    return path
    return None


def available() -> Optional[str]:
    """Why compute-sanitizer cannot check a kernel here, or None when it can.

    Checks that torch sees a CUDA device (without creating a context) and that the
    executable is found. It cannot know whether the driver lets the sanitizer attach
    (under gVisor it answers "Device not supported"): that shows as a sanitizer error in
    the output, which ``parse`` reports with kind ``sanitizer-error``."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency of ropecheck
        return f"torch cannot be imported: {exc}"
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        return f"no CUDA device here (torch {torch.__version__}, {build}; torch.cuda.is_available() is False)"
    if find_executable() is None:
        return (
            f"{EXECUTABLE} is not on the PATH (nor in $CUDA_HOME/bin or "
            "/usr/local/cuda/bin); it comes with the CUDA toolkit, or set $COMPUTE_SANITIZER"
        )
    return None


def wrap(
    argv: Sequence[str],
    tool: str = "memcheck",
    *,
    log_file: Optional[str] = None,
    print_limit: int = PRINT_LIMIT,
    error_exitcode: int = ERROR_EXITCODE,
    padding: Optional[int] = None,
    extra: Sequence[str] = (),
    executable: Optional[str] = None,
) -> list:
    """``argv`` (the worker's ``[python, "-c", code]``) run under compute-sanitizer.

    ``tool``: memcheck (default), racecheck, initcheck or synccheck. ``log_file``: where
    the sanitizer writes its report (``%p`` becomes the process id); without it, it
    prints to stdout, mixed with the program's output. ``print_limit``: errors printed at
    most (0: all). ``error_exitcode``: exit status when the program succeeded but errors
    were found. ``padding``: memcheck's guard bytes after each allocation (default
    ``PADDING`` for memcheck, none for the others). ``extra``: more sanitizer options,
    e.g. ``("--kernel-name", "regex:rope")``. ``executable``: the sanitizer to run
    (default ``find_executable()``, else the bare name).

    Child processes are followed (``--target-processes all``; those that never use CUDA,
    such as Triton's ptxas, are not errors: ``--require-cuda-init no``), backtraces are
    left out (one line per report is what ``parse`` keeps), and the sanitizer's own
    options end with ``--`` so that nothing in ``argv`` is taken for one."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}; one of {', '.join(TOOLS)}")
    if not argv:
        raise ValueError("nothing to run under compute-sanitizer: argv is empty")
    if print_limit < 0:
        raise ValueError(f"print_limit must be >= 0, got {print_limit}")
    command = [
        executable or find_executable() or EXECUTABLE,
        "--tool",
        tool,
        "--print-limit",
        str(int(print_limit)),
        "--error-exitcode",
        str(int(error_exitcode)),
        "--target-processes",
        "all",
        "--require-cuda-init",
        "no",
        "--show-backtrace",
        "no",
    ]
    if tool == "memcheck":
        pad = PADDING if padding is None else int(padding)
        if pad:
            command += ["--padding", str(pad)]
    elif padding:
        raise ValueError("--padding is a memcheck option")
    if tool == "racecheck":
        command += ["--racecheck-report", "all"]
    if log_file is not None:
        command += ["--log-file", str(log_file)]
    return command + list(extra) + ["--"] + [str(word) for word in argv]


def environment(base: Optional[dict] = None) -> dict:
    """The worker's environment under the sanitizer: ``base`` (default os.environ) plus
    ``ENVIRONMENT`` (PyTorch's CUDA caching allocator off)."""
    env = dict(os.environ if base is None else base)
    env.update(ENVIRONMENT)
    return env
