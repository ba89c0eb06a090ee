"""Every target ropecheck knows: built-ins and third-party adapters, available or not."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Optional

from ropecheck.adapters import ADAPTERS
from ropecheck.properties.families import FAMILIES
from ropecheck.session.spec import family_words
from ropecheck.targets.builtins import BUILTIN_FORMS, BUILTINS, DEFAULT_TARGET


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # "built-in" | "adapter"
    library: str
    layout: str
    convention: str  # the flags it declares
    capabilities: str
    description: str
    why_unavailable: Optional[str]
    notes: str = ""
    default: bool = False  # the target `ropecheck check` uses without one
    family: str = "rope"  # its family (--family)
    api: str = ""  # the library interface it is called through (--api), "" none

    @property
    def available(self) -> bool:
        return self.why_unavailable is None


def library_version(library: str) -> str:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return "not installed"


def _capabilities(dtypes, backward, inplace, max_position, call="x", k_optional=False) -> str:
    parts = ["/".join(d.replace("float", "f") for d in dtypes)]
    if call != "x":
        parts.append(f"--call {call}" + (" (k may be None)" if k_optional else ""))
    parts.append("backward" if backward else "no backward")
    if inplace:
        parts.append("in place")
    if max_position is not None:
        parts.append(f"positions <= {max_position}")
    return ", ".join(parts)


def _family_flags(adapter) -> str:
    """The ``--family`` flags an N-D, xPos or builder adapter implies ("" for 1-D RoPE)."""
    if adapter.family == "rope":
        return ""
    return " ".join(["--family", adapter.family] + family_words(adapter.implies))


def entries() -> list[Entry]:
    out = []
    for name, (layout, _, description) in BUILTINS.items():
        why = description.split("unavailable: ", 1)[1] if "unavailable: " in description else None
        out.append(
            Entry(
                name,
                "built-in",
                "ropecheck",
                layout,
                f"--layout {layout} --base 10000",
                _capabilities(
                    ("float32", "bfloat16", "float16", "float64"), True, False, None, **BUILTIN_FORMS.get(name, {})
                ),
                description.split("; unavailable")[0],
                why,
                default=name == DEFAULT_TARGET,
            )
        )
    for adapter in ADAPTERS.values():
        c = adapter.convention if adapter.family == "rope" else None  # an N-D one (a PairRotation): its flags
        out.append(
            Entry(
                adapter.name,
                "adapter",
                adapter.library,
                c.layout if c else "?",
                c.flags() if c else _family_flags(adapter),
                _capabilities(
                    adapter.dtypes,
                    adapter.backward,
                    adapter.inplace,
                    adapter.max_position,
                    "x" if adapter.call == FAMILIES[adapter.family].calls[0] else adapter.call,
                    adapter.k_optional,
                ),
                adapter.description,
                adapter.why_unavailable(),
                adapter.notes,
                family=adapter.family,
                api=adapter.api or "",
            )
        )
    return out
