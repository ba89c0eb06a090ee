"""Where a target's inputs are made (``--device``): the checks draw and judge on the host,
in float64; the process that calls the target makes each input on the device with the
host tensor's sizes, strides, storage offset and storage (tensors that share a storage on
the host, q and k sliced from one fused projection, share one on the device), and sends
only values back.
"""

from __future__ import annotations

from typing import Optional

import torch

DEVICES = ("cpu", "cuda", "cuda:N")  # what --device takes


def parse(name: str) -> str:
    """A --device value, canonical ("cuda" is "cuda:0"); ValueError if it is not one."""
    text = str(name).strip().lower()
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cpu" and device.index in (None, 0):
        return "cpu"
    if device.type == "cuda":
        return f"cuda:{device.index or 0}"
    raise ValueError(f"--device must be cpu, cuda or cuda:N, got {name!r}")


def why_unavailable(device: str) -> Optional[str]:
    """Why ``device`` cannot be used in this process (None: it can)."""
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        return f"no CUDA device here (torch {torch.__version__}, {build}; torch.cuda.is_available() is False)"
    index = torch.device(device).index or 0
    count = torch.cuda.device_count()
    if index >= count:
        return f"{device} asked for, but this machine has {count} CUDA device{'s' * (count != 1)}"
    return None


def require(device: Optional[str]) -> None:
    """ValueError when ``device`` (a --device value; None: not asked for) is not a device or
    this machine does not have it (the message says which)."""
    if device is None:
        return
    name = parse(device)
    missing = why_unavailable(name)
    if missing:
        raise ValueError(f"--device {name}: {missing}")


def choose(requested: Optional[str], declared) -> str:
    """The device a target's inputs are made on: ``requested`` (--device), else cpu if the
    target runs there, else the first device type it declares. ValueError for a name that
    is not a device, or a device the target does not run on; see ``why_unavailable`` for
    whether this machine has it."""
    declared = tuple(declared or ("cpu", "cuda"))
    if requested is None:
        return "cpu" if "cpu" in declared else parse(declared[0])
    device = parse(requested)
    if torch.device(device).type not in declared:
        raise ValueError(f"the target runs on {', '.join(declared)} only (its declared devices), not on {device}")
    return device


class Placement:
    """Copies tensors to ``device`` keeping their layout: one copy of each storage, the
    tensors viewed into it with their sizes, strides and storage offset (so views of one
    storage stay views of one storage). Always a copy, on their own device too."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self.storages: dict = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        host = x.untyped_storage()
        key = host.data_ptr()
        if key not in self.storages:
            # the whole storage, as bytes, on its own device (never the ambient default device
            # a `with torch.device(...)` or torch.set_default_device may have set)
            raw = torch.empty(0, dtype=torch.uint8, device=host.device).set_(host)
            if self.device.type == "meta":  # no values there: the layout alone (plumbing tests)
                moved = torch.empty_like(raw, device=self.device)
            else:  # a copy even where the tensor already is (a private copy, not the caller's)
                moved = raw.to(self.device, copy=True)
            self.storages[key] = moved.untyped_storage()
        out = torch.empty(0, dtype=x.dtype, device=self.device)
        return out.set_(self.storages[key], x.storage_offset(), x.shape, x.stride())


def strided_copy(x: torch.Tensor) -> torch.Tensor:
    """A fresh tensor laid out exactly as x: a copy of x's whole storage viewed with x's
    sizes, strides and storage offset (clone() would compact a view and drop the offset)."""
    return Placement(str(x.device))(x)


def to_host(value):
    """Outputs as values on the host: a tensor (or a tuple of them, None allowed) copied to
    the CPU; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.cpu()
    if isinstance(value, tuple):
        return tuple(to_host(v) for v in value)
    return value
