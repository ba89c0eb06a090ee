"""What ropecheck and its worker process say to each other: named messages with keyword
fields (``Warm``, ``Load``, ``Call``, ``Time``, ``Exit``; ``Loaded``, ``Failed``, ``Done``,
``timed.Timed``), pickled with CPU tensors sent by value, views kept (``dumps``)."""

from __future__ import annotations

import copyreg
import io
import pickle
from dataclasses import dataclass

import torch

from ropecheck.calling.execution import Outcome, Request
from ropecheck.calling.timed import TimeRequest

# ropecheck -> worker


@dataclass(frozen=True)
class Load:
    """Load the target: ``loader`` ("module:function") called with ``args`` returns
    (callable, a picklable description of it); ``path`` is ropecheck's sys.path."""

    path: list
    loader: str
    args: tuple


@dataclass(frozen=True)
class Warm:
    """Get ready for these modes while ropecheck starts up (``modes.warm_up``); no reply."""

    modes: tuple


@dataclass(frozen=True)
class Call:
    """Run one call of the loaded target; then poll awake ``spin`` seconds for the next."""

    request: Request
    spin: float = 0.0


@dataclass(frozen=True)
class Time:
    """Time a block of samples (``ropecheck.calling.timed``); the reply is a ``Timed``."""

    request: TimeRequest


@dataclass(frozen=True)
class Exit:
    """Stop."""


# worker -> ropecheck


@dataclass(frozen=True)
class Loaded:
    """The target is loaded; ``info`` is its description."""

    info: object


@dataclass(frozen=True)
class Failed:
    """Loading failed, or a result could not be sent back: ``message`` says why."""

    message: str


@dataclass(frozen=True)
class Internal:
    """ropecheck's own code failed in the worker, around the target's call (not the
    target's doing): ``message`` says where."""

    message: str


@dataclass(frozen=True)
class Done:
    """A call's outcome."""

    outcome: Outcome


@dataclass(frozen=True)
class Crashed:
    """Not sent: what ropecheck reads when the worker died instead of answering."""

    message: str


# --- tensors by value, views kept --------------------------------------------------------


def _rebuild(dtype, shape, stride, offset, data):
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).as_strided(shape, stride, offset)


def _reduce(t: torch.Tensor):
    if t.device.type != "cpu" or t.is_sparse or t.is_quantized:
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    t = t.detach()
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return _rebuild, (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), raw.numpy().tobytes())


class _Pickler(pickle.Pickler):
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[torch.Tensor] = _reduce
    for _cls in (torch.nn.Parameter,):
        dispatch_table[_cls] = _reduce


def dumps(obj) -> bytes:
    """Pickle with CPU tensors sent as raw storage bytes + strides (7x cheaper than torch's
    own pickling, and exact for every view)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()
