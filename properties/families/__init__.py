"""Every family of targets, by the name ``--family`` takes: 1-D RoPE (``rope``, the
default), the N-D families (``axial``, ``mrope``, ``nd``), ``xpos``, the multimodal
position builders and the table builders (``table-builder``, ``cache-builder``). A family
is one ``property.Family`` record: adding one is a record in its checks' module and a line
here. The catalogue is a layer of its own, above every family's checks, so a family may
live in a folder of its own (``properties/nd/``) without a cycle back to this list."""

from __future__ import annotations

from ropecheck.properties import (
    checks,  # noqa: F401  (registers the 1-D properties)
    xpos_backward,  # noqa: F401  (registers xPos's backward)
)
from ropecheck.properties.builder_checks import BUILDER_FAMILIES
from ropecheck.properties.nd.families import ND_FAMILIES
from ropecheck.properties.one_d import ONE_D
from ropecheck.properties.property import Family, FamilyError
from ropecheck.properties.table_builder_checks import TABLE_FAMILIES
from ropecheck.properties.xpos_checks import XPOS

FAMILIES: dict[str, Family] = {f.name: f for f in (ONE_D, *ND_FAMILIES, XPOS, *BUILDER_FAMILIES, *TABLE_FAMILIES)}
DEFAULT_FAMILY = ONE_D.name


def family(name: str) -> Family:
    """The family called ``name``; FamilyError for an unknown one."""
    if name not in FAMILIES:
        raise FamilyError(f"unknown --family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]
