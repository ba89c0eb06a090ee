"""The properties of 1-D RoPE (the ``ONE_D`` family, ``properties.one_d``). Each reads like
its formula.

The table's two halves: ``properties.map_checks`` (contract and the spec-free laws of the
map) and ``properties.call_checks`` (inverse, statelessness, batch independence, the
reference and backward, the table-fed interfaces' properties).

A check takes a Context (the target behind its Caller, the dtype, the error model) and a
drawn Case (plus extra drawn parameters), calls the target, and compares both sides of
its formula in float64 under the error model; it returns the largest error in tolerance
units (<= 1) or raises CheckFailure. Spec-free checks need no convention and compare
whole head vectors (the pairing is unknown); reference and backward compare elementwise
with the float64 reference of the declared convention.
"""

from __future__ import annotations

# the two halves register their properties in this order (the order of the table)
from ropecheck.properties import map_checks  # noqa: F401  (contract and the laws of the map)

# isort: split
from ropecheck.properties import call_checks  # noqa: F401  (the calls, the reference)
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.one_d import ONE_D_PROPERTIES, Context
from ropecheck.properties.property import Property

PROPERTIES: dict[str, Property] = ONE_D_PROPERTIES

__all__ = ["PROPERTIES", "Property", "Context", "CheckFailure"]
