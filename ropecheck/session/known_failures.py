"""Known failures as data (as array-api-tests keeps xfail files): per-target records of
findings that are understood, so that a project's CI can run green while each finding
stays visible (status ``known`` in the table, the report and the JSON).

A file is TOML with one ``[[known]]`` table per record::

    [[known]]
    target = "rotary-embedding-torch"      # target name as given to ropecheck
    property = "reference"                 # a property name, or "*"
    dtypes = ["bfloat16"]                  # optional: all dtypes when left out
    reason = "positions built in the input dtype: bf16 cannot count past 256"

A record only excuses a *failure*; when the property passes, the result says so
(``known`` records that no longer fail are listed as fixed) and nothing is hidden.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_FILE = Path(__file__).with_name("known_failures.toml")


@dataclass(frozen=True)
class KnownFailure:
    target: str
    property: str
    reason: str
    dtypes: tuple[str, ...] = ()

    def matches(self, target: str, result) -> bool:
        return (
            self.target == target
            and self.property in ("*", result.property)
            and (not self.dtypes or result.dtype in self.dtypes)
        )


def load(paths: Iterable = (DEFAULT_FILE,)) -> list[KnownFailure]:
    """Records from TOML files; a malformed file raises ValueError naming it."""
    records = []
    for path in paths:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot read known failures from {path}: {exc}") from None
        for number, entry in enumerate(data.get("known", []), 1):
            missing = {"target", "property", "reason"} - set(entry)
            if missing:
                raise ValueError(f"{path}: record {number} lacks {', '.join(sorted(missing))}")
            records.append(
                KnownFailure(entry["target"], entry["property"], entry["reason"], tuple(entry.get("dtypes", ())))
            )
    return records


def apply(target: str, results: list, records: list[KnownFailure]) -> list:
    """Failed results that a record excuses become status ``known`` with its reason."""
    out = []
    for result in results:
        record = next((k for k in records if k.matches(target, result)), None)
        if record is not None and result.status == "failed":
            result = replace(result, status="known", message=f"known failure: {record.reason}\n  {result.message}")
        out.append(result)
    return out


def fixed(target: str, results: list, records: list[KnownFailure]) -> list[KnownFailure]:
    """Records for this target whose property ran and passed in every dtype it names."""
    out = []
    for record in (k for k in records if k.target == target):
        matching = [r for r in results if record.matches(target, r)]
        if matching and all(r.status == "passed" for r in matching):
            out.append(record)
    return out
