"""The one target record: an implementation under test, whatever its family and call form.

A ``Target`` holds the callable and everything a check may ask of it (it is the
``properties.core.contract.Subject`` the checks read): its family (``--family``; 1-D RoPE is
``rope``), its call form (``rope(x, positions)``, ``(q, k, positions)``, packed, or
``build_positions(segments)`` for a position builder), its family's convention (what the
float64 reference computes), and its capabilities (dtypes, devices, backward, in place,
the largest position it accepts, ...). Built-ins, adapters and a user's file declare one
alike; ``ropecheck.session.spec`` attaches what the flags say.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ropecheck.calling.caller import DEFAULT_TIMEOUT, Caller, Executor, PlainCaller
from ropecheck.calling.in_process import InProcess
from ropecheck.calling.presets import PRESETS
from ropecheck.properties.convention import Convention  # noqa: F401  (the 1-D convention, declared with targets)
from ropecheck.properties.core.contract import ROTATING_FORMS, check_call
from ropecheck.properties.core.dtypes import DTYPES
from ropecheck.properties.interfaces.interface import Interface
from ropecheck.properties.interfaces.space import Space
from ropecheck.properties.nd.families import ND_FAMILY_NAMES

MIN_MAX_POSITION = 255  # the smallest position range a target may declare
# an N-D rotation may declare less: a video model builds its table for a whole (frames, rows,
# columns) grid at once, and 32 per axis is already a grid of 32768 tokens (255: 16.7 million)
MIN_ND_MAX_POSITION = 31


@dataclass(frozen=True)
class Target:
    """One implementation under test, with its declared convention and capabilities.

    ``rotary_dim`` is also meaningful without a convention: it tells the spec-free checks
    which head sizes the target accepts (head_dim >= rotary_dim); ``head_dims`` are the
    head sizes an N-D or xPos target accepts (() for any even one).
    """

    name: str
    fn: Optional[Callable]
    convention: Any = None  # its family's convention (None: spec-free checks only)
    family: str = "rope"  # properties.families: rope (1-D), axial, mrope, nd, xpos, *-builder
    call: str = "x"  # its call form (properties.core.contract.CALL_FORMS)
    dtypes: tuple[str, ...] = tuple(DTYPES)
    backward: bool = True
    inplace: bool = False
    rotary_dim: Optional[int] = None
    n_axes: int = 1  # position axes
    # the coordinates an N-D target takes (properties.nd.coordinates; None: token indices)
    coordinates: Any = None
    head_dims: tuple = ()  # head sizes it accepts (N-D, xPos); () any even one
    max_position: Optional[int] = None  # largest position (per axis) it accepts (a fixed table)
    k_optional: bool = False  # qk: accepts k=None
    # positions are offset + arange(seq) in every row (an API taking per-row offsets)
    row_offsets: bool = False
    # device types it runs on (an adapter's record, Target(devices=...)); the checks make
    # its inputs on ``device`` (--device), which must be one of them
    devices: tuple[str, ...] = ("cpu", "cuda")
    device: str = "cpu"
    mode: str = "eager"  # how the checks run it (--mode, ropecheck.calling.modes)
    opcheck: bool = False  # its calls followed by torch.library.opcheck (--opcheck, ropecheck.calling.opcheck)
    # the library interface it is called through (--api: a preset of ropecheck.calling.presets)
    api: Optional[str] = None
    # context-parallel ranks its interface's calls are split across (--cp-size)
    cp_size: int = 1
    # the optional parameters of its interface its signature has (a kernel may lack them)
    optional_params: tuple = ()
    # an M-RoPE run through its interface (ropecheck.calling.forms.MRope: the 1-D RoPE its table
    # is made from, the sections); None: a 1-D one
    mrope: Any = None
    # the argument space its run draws from: its interface's, restricted by the run's options
    # and its own signature (None: the interface's whole space)
    space: Optional[Space] = field(default=None, compare=False)
    description: str = ""
    # the family parameters it implies (an N-D adapter's sections, layout, ...), as flags name them
    implies: dict = field(default_factory=dict, compare=False)
    # where calls run (a ropecheck.calling.worker.Worker), or None: this process
    executor: Optional[Executor] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        check_call(self.call)
        if self.api is not None and self.api not in PRESETS:
            raise ValueError(f"{self.name}: unknown api {self.api!r}; known: {', '.join(PRESETS)}")
        if self.convention is not None and getattr(self.convention, "rotary_dim", None) is not None:
            object.__setattr__(self, "rotary_dim", self.convention.rotary_dim)
        least = MIN_ND_MAX_POSITION if self.family in ND_FAMILY_NAMES else MIN_MAX_POSITION
        if self.max_position is not None and self.max_position < least:
            raise ValueError(f"{self.name}: max_position must be at least {least}, got {self.max_position}")

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def takes_tensors(self) -> bool:
        return self.call in ROTATING_FORMS

    @property
    def interface(self) -> Optional[Interface]:
        """What the checks read of its library interface (None: called in its call form),
        with the argument space its run draws from."""
        if not self.api:
            return None
        interface = PRESETS[self.api].interface
        return interface if self.space is None else replace(interface, space=self.space)

    def caller(self, timeout: Optional[float] = DEFAULT_TIMEOUT):
        """The target called under the contract (``properties.core.contract.Rope``), in its
        executor: its worker, or this process."""
        executor: Executor
        if self.executor is not None:
            executor = self.executor
        elif self.fn is not None:
            executor = InProcess(self.fn)
        else:
            raise ValueError(f"{self.name}: a target with neither a callable nor an executor cannot be called")
        if not self.takes_tensors:
            return PlainCaller(executor, timeout)
        table = self.interface.table if self.api and self.interface else None
        rows = (self.max_position or 0) + 1 if table is not None and table.by == "position" else 0
        return Caller(
            executor,
            self.call,
            timeout,
            self.inplace,
            self.device,
            self.mode,
            api=self.api or "",
            convention=self.mrope.convention if self.mrope is not None else self.convention,
            table_rows=rows,
            cp_size=self.cp_size,
            mrope=self.mrope,
            takes=self.optional_params,
            opcheck=self.opcheck,
        )

    def with_(self, **changes) -> "Target":
        return replace(self, **changes)

    def close(self) -> None:
        """Stop the worker process the target runs in, if any."""
        if self.executor is not None:
            self.executor.close()
