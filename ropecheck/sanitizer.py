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
import re
import shutil
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

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
        return (f"no CUDA device here (torch {torch.__version__}, {build}; "
                "torch.cuda.is_available() is False)")
    if find_executable() is None:
        return (f"{EXECUTABLE} is not on the PATH (nor in $CUDA_HOME/bin or "
                "/usr/local/cuda/bin); it comes with the CUDA toolkit, or set $COMPUTE_SANITIZER")
    return None


def wrap(argv: Sequence[str], tool: str = "memcheck", *, log_file: Optional[str] = None,
         print_limit: int = PRINT_LIMIT, error_exitcode: int = ERROR_EXITCODE,
         padding: Optional[int] = None, extra: Sequence[str] = (),
         executable: Optional[str] = None) -> list:
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
    command = [executable or find_executable() or EXECUTABLE, "--tool", tool,
               "--print-limit", str(int(print_limit)), "--error-exitcode", str(int(error_exitcode)),
               "--target-processes", "all", "--require-cuda-init", "no", "--show-backtrace", "no"]
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


@dataclass(frozen=True)
class SanitizerReport:
    """One error compute-sanitizer printed.

    tool: memcheck / racecheck / initcheck / synccheck (the tool that prints such a
    report; ``parse`` takes it from the report's form when not told). kind:
    ``out-of-bounds``, ``misaligned``, ``not-readable``, ``not-writable``,
    ``invalid-access`` (an access error of another kind), ``race`` (racecheck
    analysis), ``hazard`` (racecheck hazard: WAW / WAR / RAW in ``hazard``),
    ``uninitialized``, ``barrier``, ``api-error``, ``leak``, ``sanitizer-error``. kernel: the kernel's name as printed (None when the report names
    none); offset: the instruction offset in it ("0x90"); location: ``file:line`` when the
    kernel has line information. access: read / write / atomic (for races, the first
    access). space: global / shared / local. size: bytes accessed. address: as printed.
    thread, block: (x, y, z). allocation: the memcheck line placing the address against
    the nearest allocation. hazard: WAW / WAR / RAW (racecheck hazard reports). hazards:
    racecheck's hazard count. other: the other access(es) of a race or hazard; for an API
    error, the call that failed. message: the report in one line."""

    tool: str
    kind: str
    message: str
    kernel: Optional[str] = None
    offset: Optional[str] = None
    location: Optional[str] = None
    access: Optional[str] = None
    space: Optional[str] = None
    size: Optional[int] = None
    address: Optional[str] = None
    thread: Optional[tuple] = None
    block: Optional[tuple] = None
    allocation: Optional[str] = None
    hazard: Optional[str] = None
    hazards: Optional[int] = None
    other: tuple = field(default_factory=tuple)

    def key(self) -> tuple:
        """What makes two reports one finding: the same tool, kind, kernel, access and
        source place (threads, blocks and addresses differ between the reports of one bug)."""
        return (self.tool, self.kind, self.hazard, self.kernel, self.access, self.space, self.size,
                self.location or self.offset, self.other)


# A line of sanitizer output: the prefix (default "=========", configurable with --prefix),
# then the text. Lines without the prefix are the program's own output.
_PREFIX = re.compile(r"^\s*=+ ?(?P<body>.*?)\s*$")
_SIZE = r"of size (?P<size>\d[\d,]*)(?: bytes?)?"
_ACCESS = re.compile(r"^Invalid __(?P<space>global|shared|local)__ (?P<access>read|write|atomic)\b.*?"
                     + _SIZE, re.I)
_UNINIT = re.compile(r"^Uninitialized __(?P<space>global|shared|local)__ memory (?P<access>read|write)"
                     r"\b.*?" + _SIZE, re.I)
_RACE = re.compile(r"^(?:(?P<severity>\w+):\s*)?Race reported between (?P<access>Read|Write) access at"
                   r"\s*(?P<where>.*?)\s*(?:\[(?P<hazards>[\d,]+) hazards?\])?$", re.I)
_RACE_MORE = re.compile(r"^and (?P<access>Read|Write) access at\s*(?P<where>.*?)\s*"
                        r"(?:\[(?P<hazards>[\d,]+) hazards?\])?$", re.I)
_HAZARDS_ALONE = re.compile(r"^\[(?P<hazards>[\d,]+) hazards?\]$", re.I)
_HAZARD = re.compile(r"^(?:(?P<severity>\w+):\s*)?(?:\([^)]*\)\s*)?Potential (?P<hazard>WAW|WAR|RAW) hazard "
                     r"detected at __(?P<space>shared|global)__ (?P<address>0x[0-9a-fA-F]+) in block "
                     r"(?P<block>\([^)]*\))", re.I)
_HAZARD_THREAD = re.compile(r"^(?P<access>Read|Write) Thread (?P<thread>\([^)]*\)) at (?P<where>.+)$", re.I)
_AT = re.compile(r"^at (?P<where>.+)$")
_BY_THREAD = re.compile(r"^by thread (?P<thread>\([^)]*\)) in block (?P<block>\([^)]*\))")
_ADDRESS = re.compile(r"^(?:Address|Access at) (?P<address>0x[0-9a-fA-F]+)(?: is (?P<what>.+?))?\.?$")
_NEAREST = re.compile(r"^and is .*allocation.*$")
_API = re.compile(r"^Program hit (?P<what>.+?) on CUDA API call to (?P<call>[\w:]+)")
_LEAK = re.compile(r"^Leaked (?P<size>[\d,]+) bytes at (?P<address>0x[0-9a-fA-F]+)")
_BARRIER = re.compile(r"^Barrier error detected\.?(?P<what>.*)$", re.I)
_SANITIZER_ERROR = re.compile(r"^Internal Sanitizer Error", re.I)
_SUMMARY = re.compile(r"^(?:ERROR|RACECHECK) SUMMARY:\s*(?P<n>[\d,]+) (?:errors?|hazards?)", re.I)
_END = re.compile(r"^(?:ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|COMPUTE-SANITIZER|CUDA-MEMCHECK|"
                  r"Saved host backtrace|Host Frame|Device Frame)", re.I)
_WHAT_KIND = (("out of bounds", "out-of-bounds"), ("misaligned", "misaligned"),
              ("not readable", "not-readable"), ("not writable", "not-writable"))


def _int(text: Optional[str]) -> Optional[int]:
    return None if text is None else int(text.replace(",", ""))


def _triple(text: str) -> tuple:
    return tuple(int(v) for v in re.findall(r"-?\d+", text))


def _place(where: str) -> tuple:
    """'kernel(args)+0x90 in file.py:12' / 'kernel+0x90' / '0x90 in kernel(args)' /
    'kernel():0x160 in file.cu:6' / 'file.cu:12' -> (kernel, offset, location)."""
    where = where.strip()
    head, sep, tail = where.rpartition(" in ")
    if not sep:
        head, tail = where, ""
    location = None
    if tail and re.search(r":\d+$", tail) and not re.match(r"^0x[0-9a-fA-F]+$", head):
        location = tail
        tail = ""
    kernel = offset = None
    if re.match(r"^0x[0-9a-fA-F]+$", head):  # CUDA-MEMCHECK's "at 0x90 in kernel(args)"
        offset, kernel = head, tail or None
        placed = re.match(r"^(?P<location>[^:]+:\d+):(?P<kernel>.+)$", kernel or "")
        if placed:  # "at 0x170 in ./race.cu:4:test(int*)"
            location, kernel = placed["location"].strip(), placed["kernel"]
    else:
        match = re.match(r"^(?P<kernel>.*?)(?:\+|:)(?P<offset>0x[0-9a-fA-F]+)$", head)
        if match:
            kernel, offset = match["kernel"], match["offset"]
        elif re.search(r":\d+$", head) and not tail:  # only 'file.cu:12'
            location = location or head
        else:
            kernel = head or None
    if kernel:
        kernel = re.sub(r"^void ", "", kernel).strip() or None
    return kernel, offset, location


def _kernel_name(kernel: Optional[str]) -> Optional[str]:
    """The kernel's bare name: 'void f<(bool)0>(int *, float)' -> 'f'."""
    if not kernel:
        return kernel
    name = kernel.split("(", 1)[0].split("<", 1)[0].strip()
    return name or kernel


class _Block:
    """The lines of one report being read."""

    def __init__(self, tool, kind, first, **fields):
        self.tool, self.kind, self.lines = tool, kind, [first]
        self.fields = fields

    def report(self) -> SanitizerReport:
        f = self.fields
        parts = [self.lines[0]]
        if f.get("kernel") and self.kind != "race":
            parts.append(f"in {_kernel_name(f['kernel'])}" + (f" ({f['location']})" if f.get("location") else ""))
        if f.get("thread") is not None:
            parts.append(f"thread {f['thread']} block {f['block']}")
        if f.get("address") and self.kind in ("out-of-bounds", "misaligned", "not-readable",
                                               "not-writable", "invalid-access", "uninitialized"):
            parts.append(f"address {f['address']}" + (f" {f['what']}" if f.get("what") else ""))
        if f.get("allocation"):
            parts.append(f["allocation"])
        if f.get("other"):
            parts.append("and " + "; ".join(f["other"]))
        if f.get("hazards"):
            parts.append(f"{f['hazards']} hazards")
        message = "; ".join(p for p in parts if p)
        fields = {k: v for k, v in f.items() if k in SanitizerReport.__dataclass_fields__}
        if isinstance(fields.get("other"), list):
            fields["other"] = tuple(fields["other"])
        if fields.get("kernel"):
            fields["kernel"] = _kernel_name(fields["kernel"])
        return SanitizerReport(tool=self.tool, kind=self.kind, message=message, **fields)


def _race_place(block: "_Block", where: str, first: bool) -> None:
    """Record where a race's access is (its own line, or the end of the 'at' line)."""
    f = block.fields
    where = where.strip()
    if not where:  # the place follows on the next line
        f["_pending"] = "first" if first else "other"
        return
    f["_pending"] = None
    kernel, offset, location = _place(where)
    if first:
        f["kernel"], f["offset"], f["location"] = kernel, offset, location
        block.lines[0] += f" at {_describe(kernel, offset, location)}"
    else:
        f["other"][-1] += f" at {_describe(kernel, offset, location)}"


def _describe(kernel: Optional[str], offset: Optional[str], location: Optional[str]) -> str:
    """'kernel+0x90 (file.py:12)', from what is known of a place."""
    text = (_kernel_name(kernel) or "") + (f"+{offset}" if offset else "")
    if location:
        text = f"{text} ({location})" if text else location
    return text or "?"


def parse(text: str, tool: Optional[str] = None) -> list:
    """The errors in compute-sanitizer's output ``text``, in order, as SanitizerReport.

    ``tool``: the tool that ran (memcheck, racecheck, ...), recorded in every report; by
    default each report's form says (an invalid access: memcheck; a race or hazard:
    racecheck; an uninitialized read: initcheck; a barrier error: synccheck; API errors
    and leaks: memcheck). Lines without the sanitizer's prefix (the program's output
    interleaved on stdout) are skipped; so are backtraces and summaries."""
    if tool is not None and tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}; one of {', '.join(TOOLS)}")
    reports: list = []
    block: Optional[_Block] = None

    def close():
        nonlocal block
        if block is not None:
            reports.append(block.report())
        block = None

    for raw in text.splitlines():
        prefixed = _PREFIX.match(raw)
        if not prefixed:
            continue
        line = prefixed["body"].strip()
        if not line:
            close()
            continue
        if _END.match(line):
            close()
            continue
        m = _ACCESS.match(line)
        if m:
            close()
            block = _Block(tool or "memcheck", "invalid-access", line, access=m["access"].lower(),
                           space=m["space"].lower(), size=_int(m["size"]))
            continue
        m = _UNINIT.match(line)
        if m:
            close()
            block = _Block(tool or "initcheck", "uninitialized", line, access=m["access"].lower(),
                           space=m["space"].lower(), size=_int(m["size"]))
            continue
        m = _RACE.match(line)
        if m:
            close()
            block = _Block(tool or "racecheck", "race", f"race between {m['access'].lower()} access",
                           access=m["access"].lower(), space="shared", hazards=_int(m["hazards"]),
                           other=[])
            _race_place(block, m["where"], first=True)
            continue
        m = _HAZARD.match(line)
        if m:
            close()
            block = _Block(tool or "racecheck", "hazard", line.rstrip(" :"), hazard=m["hazard"].upper(),
                           space=m["space"].lower(), address=m["address"], block=_triple(m["block"]),
                           other=[])
            continue
        m = _API.match(line)
        if m:
            close()
            reports.append(SanitizerReport(tool=tool or "memcheck", kind="api-error", message=line,
                                           other=(m["call"],)))
            continue
        m = _LEAK.match(line)
        if m:
            close()
            reports.append(SanitizerReport(tool=tool or "memcheck", kind="leak", message=line,
                                           size=_int(m["size"]), address=m["address"]))
            continue
        m = _BARRIER.match(line)
        if m:
            close()
            block = _Block(tool or "synccheck", "barrier", line)
            continue
        if _SANITIZER_ERROR.match(line):
            close()
            reports.append(SanitizerReport(tool=tool or "memcheck", kind="sanitizer-error", message=line))
            continue
        if block is None:
            continue
        # continuation lines of the report being read
        f = block.fields
        if block.kind == "race":
            m = _RACE_MORE.match(line)
            if m:
                f["other"].append(f"{m['access'].lower()} access")
                _race_place(block, m["where"], first=False)
                if m["hazards"]:
                    f["hazards"] = (f.get("hazards") or 0) + _int(m["hazards"])
                continue
            m = _HAZARDS_ALONE.match(line)
            if m:
                f["hazards"] = (f.get("hazards") or 0) + _int(m["hazards"])
                continue
            if f.get("_pending"):  # the place of an access, on a line of its own
                _race_place(block, line, first=f["_pending"] == "first")
                continue
        m = _HAZARD_THREAD.match(line)
        if m and block.kind == "hazard":
            kernel, offset, location = _place(m["where"])
            if f.get("thread") is None:
                f.update(thread=_triple(m["thread"]), access=m["access"].lower(), kernel=kernel,
                         offset=offset, location=location)
            else:
                f["other"].append(f"{m['access'].lower()} by thread {_triple(m['thread'])}")
            continue
        m = _AT.match(line)
        if m and f.get("kernel") is None and f.get("offset") is None:
            f["kernel"], f["offset"], f["location"] = _place(m["where"])
            continue
        m = _BY_THREAD.match(line)
        if m:
            f["thread"], f["block"] = _triple(m["thread"]), _triple(m["block"])
            continue
        m = _ADDRESS.match(line)
        if m:
            f["address"] = m["address"]
            what = (m["what"] or "").strip()
            f["what"] = what or None
            if block.kind == "invalid-access":
                for words, kind in _WHAT_KIND:
                    if words in what:
                        block.kind = kind
                        break
            continue
        if _NEAREST.match(line):
            f["allocation"] = line[len("and "):]
            continue
    close()
    return reports


def error_summary(text: str) -> Optional[int]:
    """The count in the last ``ERROR SUMMARY: N errors`` (or ``RACECHECK SUMMARY: N
    hazards displayed``) line of ``text``; None when there is none (the sanitizer did not
    finish, or this is not its output)."""
    count = None
    for raw in text.splitlines():
        prefixed = _PREFIX.match(raw)
        if prefixed:
            m = _SUMMARY.match(prefixed["body"].strip())
            if m:
                count = _int(m["n"])
    return count


@dataclass(frozen=True)
class Finding:
    """Reports of one root cause: the first one, and how many there were."""

    first: SanitizerReport
    count: int

    @property
    def message(self) -> str:
        return self.first.message + (f" (and {self.count - 1} more like it)" if self.count > 1 else "")


def findings(reports: Iterable[SanitizerReport]) -> list:
    """One Finding per root cause (``SanitizerReport.key``), in order of first report."""
    groups: "OrderedDict[tuple, list]" = OrderedDict()
    for report in reports:
        groups.setdefault(report.key(), []).append(report)
    return [Finding(first=group[0], count=len(group)) for group in groups.values()]


def read_log(path: str, tool: Optional[str] = None) -> list:
    """``parse`` of a ``--log-file`` (an absent file: no reports)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse(handle.read(), tool)
    except FileNotFoundError:
        return []
