"""What compute-sanitizer reports, read from its output (stdout or ``--log-file``):
``parse(text)`` into ``SanitizerReport`` records (``ropecheck.calling.sanitizer_findings``,
with ``findings``: one per root cause), ``error_summary(text)`` (its ``ERROR SUMMARY``
count) and ``read_log``. The formats are the ones NVIDIA's Compute Sanitizer documentation shows
(``ropecheck.calling.sanitizer`` lists them)."""

from __future__ import annotations

import re
from typing import Optional

from ropecheck.calling.sanitizer import TOOLS
from ropecheck.calling.sanitizer_findings import Finding, SanitizerReport, findings, said

__all__ = ["Finding", "SanitizerReport", "error_summary", "findings", "parse", "read_log", "said"]


# A line of sanitizer output: the prefix (default "=========", configurable with --prefix),
# then the text. Lines without the prefix are the program's own output.
_PREFIX = re.compile(r"^\s*=+ ?(?P<body>.*?)\s*$")
_SIZE = r"of size (?P<size>\d[\d,]*)(?: bytes?)?"
_ACCESS = re.compile(r"^Invalid __(?P<space>global|shared|local)__ (?P<access>read|write|atomic)\b.*?" + _SIZE, re.I)
_UNINIT = re.compile(
    r"^Uninitialized __(?P<space>global|shared|local)__ memory (?P<access>read|write)"
    r"\b.*?" + _SIZE,
    re.I,
)
_RACE = re.compile(
    r"^(?:(?P<severity>\w+):\s*)?Race reported between (?P<access>Read|Write) access at"
    r"\s*(?P<where>.*?)\s*(?:\[(?P<hazards>[\d,]+) hazards?\])?$",
    re.I,
)
_RACE_MORE = re.compile(
    r"^and (?P<access>Read|Write) access at\s*(?P<where>.*?)\s*"
    r"(?:\[(?P<hazards>[\d,]+) hazards?\])?$",
    re.I,
)
_HAZARDS_ALONE = re.compile(r"^\[(?P<hazards>[\d,]+) hazards?\]$", re.I)
_HAZARD = re.compile(
    r"^(?:(?P<severity>\w+):\s*)?(?:\([^)]*\)\s*)?Potential (?P<hazard>WAW|WAR|RAW) hazard "
    r"detected at __(?P<space>shared|global)__ (?P<address>0x[0-9a-fA-F]+) in block "
    r"(?P<block>\([^)]*\))",
    re.I,
)
_HAZARD_THREAD = re.compile(r"^(?P<access>Read|Write) Thread (?P<thread>\([^)]*\)) at (?P<where>.+)$", re.I)
_AT = re.compile(r"^at (?P<where>.+)$")
_BY_THREAD = re.compile(r"^by thread (?P<thread>\([^)]*\)) in block (?P<block>\([^)]*\))")
_ADDRESS = re.compile(r"^(?:Address|Access at|Access to) (?P<address>0x[0-9a-fA-F]+)(?: is (?P<what>.+?))?\.?$")
_NEAREST = re.compile(r"^and is .*allocation.*$")
_API = re.compile(r"^Program hit (?P<what>.+?) on CUDA API call to (?P<call>[\w:]+)")
_LEAK = re.compile(r"^Leaked (?P<size>[\d,]+) bytes at (?P<address>0x[0-9a-fA-F]+)")
_BARRIER = re.compile(r"^Barrier error detected\.?(?P<what>.*)$", re.I)
_SANITIZER_ERROR = re.compile(r"^Internal Sanitizer Error", re.I)
_SUMMARY = re.compile(r"^(?:ERROR|RACECHECK) SUMMARY:\s*(?P<n>[\d,]+) (?:errors?|hazards?)", re.I)
_END = re.compile(
    r"^(?:ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|COMPUTE-SANITIZER|CUDA-MEMCHECK|"
    r"Saved host backtrace|Host Frame|Device Frame)",
    re.I,
)
_WHAT_KIND = (
    ("out of bounds", "out-of-bounds"),
    ("misaligned", "misaligned"),
    ("not readable", "not-readable"),
    ("not writable", "not-writable"),
)


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
        if f.get("address") and self.kind in (
            "out-of-bounds",
            "misaligned",
            "not-readable",
            "not-writable",
            "invalid-access",
            "uninitialized",
        ):
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
            block = _Block(
                tool or "memcheck",
                "invalid-access",
                line,
                access=m["access"].lower(),
                space=m["space"].lower(),
                size=_int(m["size"]),
            )
            continue
        m = _UNINIT.match(line)
        if m:
            close()
            block = _Block(
                tool or "initcheck",
                "uninitialized",
                line,
                access=m["access"].lower(),
                space=m["space"].lower(),
                size=_int(m["size"]),
            )
            continue
        m = _RACE.match(line)
        if m:
            close()
            block = _Block(
                tool or "racecheck",
                "race",
                f"race between {m['access'].lower()} access",
                access=m["access"].lower(),
                space="shared",
                hazards=_int(m["hazards"]),
                other=[],
            )
            _race_place(block, m["where"], first=True)
            continue
        m = _HAZARD.match(line)
        if m:
            close()
            block = _Block(
                tool or "racecheck",
                "hazard",
                line.rstrip(" :"),
                hazard=m["hazard"].upper(),
                space=m["space"].lower(),
                address=m["address"],
                block=_triple(m["block"]),
                other=[],
            )
            continue
        m = _API.match(line)
        if m:
            close()
            reports.append(SanitizerReport(tool=tool or "memcheck", kind="api-error", message=line, other=(m["call"],)))
            continue
        m = _LEAK.match(line)
        if m:
            close()
            reports.append(
                SanitizerReport(
                    tool=tool or "memcheck", kind="leak", message=line, size=_int(m["size"]), address=m["address"]
                )
            )
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
                    f["hazards"] = (f.get("hazards") or 0) + (_int(m["hazards"]) or 0)
                continue
            m = _HAZARDS_ALONE.match(line)
            if m:
                f["hazards"] = (f.get("hazards") or 0) + (_int(m["hazards"]) or 0)
                continue
            if f.get("_pending"):  # the place of an access, on a line of its own
                _race_place(block, line, first=f["_pending"] == "first")
                continue
        m = _HAZARD_THREAD.match(line)
        if m and block.kind == "hazard":
            kernel, offset, location = _place(m["where"])
            if f.get("thread") is None:
                f.update(
                    thread=_triple(m["thread"]),
                    access=m["access"].lower(),
                    kernel=kernel,
                    offset=offset,
                    location=location,
                )
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
            f["allocation"] = line[len("and ") :]
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


def read_log(path: str, tool: Optional[str] = None) -> list:
    """``parse`` of a ``--log-file`` (an absent file: no reports)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse(handle.read(), tool)
    except FileNotFoundError:
        return []
