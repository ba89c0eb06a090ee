"""A compute-sanitizer report as a record (``SanitizerReport``, what
``ropecheck.calling.sanitizer_reports.parse`` reads from the tool's output) and the
reports of one root cause grouped into a ``Finding``."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Optional


@dataclass(frozen=True)
class SanitizerReport:
    """One error compute-sanitizer printed.

    tool: memcheck / racecheck / initcheck / synccheck (the tool that prints such a
    report; ``parse`` takes it from the report's form when not told). kind:
    ``out-of-bounds``, ``misaligned``, ``not-readable``, ``not-writable``,
    ``invalid-access`` (an access error of another kind), ``race`` (racecheck
    analysis), ``hazard`` (racecheck hazard: WAW / WAR / RAW in ``hazard``),
    ``uninitialized``, ``barrier``, ``api-error``, ``leak``, ``sanitizer-error``. kernel:
    the kernel's name as printed (None when the report names none); offset: the
    instruction offset in it ("0x90"); location: ``file:line`` when the kernel has line
    information. access: read / write / atomic (for races, the first
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
        return (
            self.tool,
            self.kind,
            self.hazard,
            self.kernel,
            self.access,
            self.space,
            self.size,
            self.location or self.offset,
            self.other,
        )


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


def said(found: list) -> str:
    """One line for a call's findings: the kernels' own errors; the CUDA API errors after
    one of them (a faulted kernel leaves the context unusable: every later call fails with
    'unspecified launch failure') counted, with the first, not listed one by one."""
    kernels = [f for f in found if f.first.kind != "api-error"]
    api = [f for f in found if f.first.kind == "api-error"]
    if not kernels or not api:
        return "; ".join(f.message for f in found)
    count = sum(f.count for f in api)
    return "; ".join(f.message for f in kernels) + (
        f"; then {count} CUDA API error{'s' if count > 1 else ''} (the first: {api[0].message})"
    )
