"""Property registries: one per family of checks (1-D, N-D, xPos), filled by a decorator."""

from __future__ import annotations

from typing import Callable, Optional


def property_registry(record: Callable, registry: Optional[dict] = None) -> tuple[dict, Callable]:
    """(registry, register): ``@register(name=..., formula=..., ...)`` over a check function
    stores ``record(check=function, **fields)`` in the registry (a new dict, or the one
    given) under its name."""
    registry = {} if registry is None else registry

    def register(**fields):
        def wrap(check):
            registry[fields["name"]] = record(check=check, **fields)
            return check

        return wrap

    return registry, register
