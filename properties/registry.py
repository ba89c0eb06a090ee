"""Property registries: one per family of checks (1-D, N-D, xPos), filled by a decorator."""

from __future__ import annotations

from typing import Callable


def property_registry(record: Callable) -> tuple[dict, Callable]:
    """(registry, register): ``@register(name=..., formula=..., ...)`` over a check function
    stores ``record(check=function, **fields)`` in the registry under its name."""
    registry: dict = {}

    def register(**fields):
        def wrap(check):
            registry[fields["name"]] = record(check=check, **fields)
            return check
        return wrap
    return registry, register
