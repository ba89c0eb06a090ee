"""Converters of the option table (``ropecheck.session.options``): what a front door
received (text from a command line or an ini file, a Python value from the API) as an
option's value; each raises ValueError with what it expected."""

from __future__ import annotations

import json
import math
from typing import Callable

from ropecheck.calling import devices, modes
from ropecheck.properties.core.dtypes import canonical
from ropecheck.properties.core.sizes import parse as parse_sizes
from ropecheck.reference.scaling import parse as parse_scaling
from ropecheck.session.hf_config import HFConfig, HFConvention, read

MAX_POSITION_RANGE = (255, 2**24)  # --max-position: the declared position range 0 .. N


def words(value) -> list:
    """A list given as a list, or as text: comma- (or space-) separated."""
    if isinstance(value, str):
        return [w for w in value.replace(",", " ").split() if w]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def integer(value) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def number(value) -> float:
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"expected a finite number, got {value!r}")
    return result


def integers(value) -> list:
    """``16,24,24`` or [16, 24, 24]."""
    values = [integer(v) for v in words(value)]
    if not values:
        raise ValueError("expected comma-separated integers, got nothing")
    return values


def numbers(value) -> list:
    values = [number(v) for v in words(value)]
    if not values:
        raise ValueError("expected comma-separated numbers, got nothing")
    return values


def coordinate_ranges(value) -> list:
    """``-32:32,0:1`` (LO:HI per axis, or one for all) as [(lo, hi), ...]."""
    from ropecheck.properties.nd.coordinates import parse_range

    values = [parse_range(v) for v in words(value)]
    if not values:
        raise ValueError("expected LO:HI ranges, comma-separated, got nothing")
    return values


def base_value(value):
    """One frequency base, or one per axis (the N-D families): a number or a list."""
    values = numbers(value)
    return values[0] if len(values) == 1 else values


def switch(value) -> bool:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"expected true or false, got {value!r}")
    return bool(value)


def scaling_value(value):
    """A ``--scaling`` value (text, or a dict of HF rope_parameters), parsed: (text, Scaling)."""
    text = json.dumps(value) if isinstance(value, dict) else str(value)
    return text, parse_scaling(text)


def dtype_names(value) -> list:
    return list(dict.fromkeys(canonical(n) for n in words(value)))


def mode_names(value) -> list:
    return modes.parse(words(value))


def device_name(value) -> str:
    devices.parse(value)  # ValueError with the message
    return str(value)


def position_range(value) -> int:
    n = integer(value)
    low, high = MAX_POSITION_RANGE
    if not low <= n <= high:
        raise ValueError(f"must be in {low} .. 2^24, got {n}")
    return n


def at_least(low: float, kind: Callable = integer) -> Callable:
    def convert(value):
        v = kind(value)
        if v < low:
            raise ValueError(f"must be at least {low:g}, got {v}")
        return v

    convert.__name__ = kind.__name__
    return convert


def fraction(value) -> float:
    """A number in (0, 1]."""
    result = number(value)
    if not 0.0 < result <= 1.0:
        raise ValueError(f"must be in (0, 1], got {value!r}")
    return result


def hf_config_value(value):
    """A model's config.json (or a folder holding one), read (``session.hf_config``)."""
    return value if isinstance(value, (HFConfig, HFConvention)) else read(value)


def sizes_value(value):
    return parse_sizes(str(value)) if not hasattr(value, "head_dims") else value


def target_value(value):
    """A target: a name as text, or (from the API) the Python object itself."""
    return value
