"""The floating dtypes ropecheck knows, by name, with their rounding units."""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
ALIASES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp64": "float64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
}

# Unit roundoff u = 2^-p for p significand bits: |fl(v) - v| <= u |v| for normal v.
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
# Spacing of the subnormals: the absolute rounding error of a result that underflows.
SUBNORMAL_SPACING = {"float64": 2.0**-1074, "float32": 2.0**-149, "float16": 2.0**-24, "bfloat16": 2.0**-133}


def canonical(name: str) -> str:
    """'bf16' -> 'bfloat16'; raises ValueError for an unknown dtype."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(DTYPES)}")
    return key


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[canonical(name)]


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")
