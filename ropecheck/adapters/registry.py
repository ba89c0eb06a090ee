"""Adapters: third-party RoPE implementations brought to the target contract.

One small declarative record per target (in the spirit of PyTorch's OpInfo): what to
import, how to build its callable in the call form it declares (``call``: "x" for the
canonical ``rope(x, positions)``, "qk" or "packed", see ``Target``), the convention it
computes, its capabilities, and how to install its library. Records never import their
library at definition time: ``ropecheck list`` shows every record, available or not, and
why not.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ropecheck.properties.convention import Convention
from ropecheck.properties.core.dtypes import DTYPES
from ropecheck.targets.target import Target


@dataclass(frozen=True)
class Adapter:
    """A third-party target.

    ``build()`` imports the library and returns the canonical callable; ``modules`` are
    the import names whose presence makes it available; ``install`` is the pip command
    that provides them.
    """

    name: str
    library: str  # distribution name, e.g. "transformers"
    build: Callable[[], Callable]
    convention: Optional[Convention] | Any  # 1-D: a Convention; --family pairs: its PairRotation
    description: str
    modules: tuple[str, ...] = ()
    install: str = ""
    dtypes: tuple[str, ...] = tuple(DTYPES)
    devices: tuple[str, ...] = ("cpu", "cuda")
    backward: bool = True
    inplace: bool = False
    rotary_dim: Optional[int] = None  # the head sizes it accepts are >= this one
    max_position: Optional[int] = None  # largest position it accepts (a fixed-length table)
    call: str = "x"  # its call form: "x", "qk", "packed" or "segments" (Target.call)
    k_optional: bool = False  # a "qk" target that also takes k=None
    row_offsets: bool = False  # takes per-row offsets: positions are offset + arange(seq) per row
    notes: str = ""  # what it cannot do here, shown by `ropecheck list`
    family: str = "rope"  # its family (--family): rope (1-D), axial, mrope, nd, xpos, *-builder
    implies: dict = field(default_factory=dict)  # the family parameters it implies (sections, layout, ...)
    api: Optional[str] = None  # the library interface it is called through (--api preset), None: its call form
    unavailable: Optional[Callable[[], Optional[str]]] = field(default=None, repr=False)

    def why_unavailable(self) -> Optional[str]:
        """None when the target can be built here, else the reason and the install hint."""
        for module in self.modules or (self.library,):
            if not _importable(module.split(".")[0]):
                return f"{module} is not installed ({self.install or 'pip install ' + self.library})"
        return self.unavailable() if self.unavailable else None

    def target(self) -> Target:
        target = self._target()
        if self.api is None:
            return target
        from ropecheck.calling.presets import PRESETS  # a library interface decides how it is called

        preset = PRESETS[self.api]
        return target.with_(**preset.capabilities(), backward=self.backward and preset.backward)

    def _target(self) -> Target:
        return Target(
            name=self.name,
            fn=self.build(),
            convention=self.convention,
            family=self.family,
            dtypes=self.dtypes,
            backward=self.backward,
            inplace=self.inplace,
            rotary_dim=self.rotary_dim,
            description=self.description,
            max_position=self.max_position,
            call=self.call,
            implies=dict(self.implies),
            k_optional=self.k_optional,
            row_offsets=self.row_offsets,
            devices=self.devices,
            api=self.api,
        )


def _importable(name: str) -> bool:
    if name in sys.modules:  # already imported (possibly as a bare package, see timm)
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_bare(module: str):
    """Import ``module`` (a dotted name) without running its parent packages' __init__
    files, which may need what this machine lacks (timm's torchvision, flash-attn's CUDA
    extension): each parent not yet imported is registered as a bare package (its folder,
    no code), then the module itself is imported as usual."""
    if module in sys.modules:
        return sys.modules[module]
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{parts[0]} is not an installed package")
    root = spec.submodule_search_locations[0]
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            path = os.path.join(root, *parts[1:depth])
            package = types.ModuleType(name)
            package.__path__ = [path]
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            package.__spec__.submodule_search_locations = [path]
            sys.modules[name] = package
    return importlib.import_module(module)


def per_head_dim(make: Callable):
    """make(head_dim) memoised: each head size gets one library module for the whole run,
    as a model keeps its own (so state a library keeps between calls is exercised).
    ``get(head_dim, device)``: the module moved to the device of the inputs it is called
    on, as a model moves its modules (``module.to(device)``): one per head size and device."""
    cache = {}

    def get(head_dim, device=None):
        key = (head_dim, None if device is None else str(device))
        if key not in cache:
            module = make(head_dim)
            if device is not None and callable(getattr(module, "to", None)):
                module = module.to(device)
            cache[key] = module
        return cache[key]

    return get


ADAPTERS: dict[str, Adapter] = {}


def register(adapter: Adapter) -> Adapter:
    if adapter.name in ADAPTERS:
        raise ValueError(f"adapter {adapter.name!r} registered twice")
    ADAPTERS[adapter.name] = adapter
    return adapter
