"""The N-D families (``axial``, ``mrope``, ``nd``): what their parameters declare. They
share the N-D checks (``properties.nd.checks``) and differ in the convention they declare:
per-axis blocks, M-RoPE sections, or none (the spec-free checks only)."""

from __future__ import annotations

import json
from dataclasses import replace

from ropecheck.properties.nd import coordinates
from ropecheck.properties.nd.checks import ND
from ropecheck.properties.property import Declaration, FamilyError
from ropecheck.reference import nd as ndref

# --- the N-D families: what their parameters declare ---------------------------------

ND_DTYPES = ("float32", "bfloat16")  # the dtypes an N-D run checks unless told otherwise


def _bases(parameters: dict):
    """One frequency base, or one per axis (``nd_base``, or a list ``base``); default 10000."""
    value = parameters.get("nd_base") or parameters.get("base")
    if value is None:
        return 10000.0
    values = [float(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if any(not v > 1 for v in values):
        raise FamilyError(f"--base must be > 1, got {','.join(f'{v:g}' for v in values)}")
    return values[0] if len(values) == 1 else values


def _axes(parameters: dict) -> int:
    n_axes = parameters.get("axes") or 2
    if not 1 <= n_axes <= 8:
        raise FamilyError(f"--axes must be 1 .. 8, got {n_axes}")
    return n_axes


def _head_dims(parameters: dict, n_axes: int) -> tuple:
    """The head sizes drawn: the declared one (--head-dim, the features past the split's
    blocks passed through), else the split's sum, else 4 and 32 features per axis."""
    split, head_dim = parameters.get("split"), parameters.get("head_dim")
    if head_dim:
        if split and sum(split) > head_dim:
            raise FamilyError(
                f"--split {','.join(map(str, split))} has {sum(split)} features, more than --head-dim {head_dim}"
            )
        return (head_dim,)
    return (sum(split),) if split else (4 * n_axes, 32 * n_axes)


def _coordinates(parameters: dict, n_axes: int):
    """The declared coordinates (None: token indices), a usage error said as one."""
    try:
        return coordinates.declared(parameters, n_axes)
    except ValueError as exc:
        raise FamilyError(str(exc)) from None


def _declaration(conventions, parameters: dict, n_axes: int, **fields) -> Declaration:
    """An N-D declaration: the rotation of each head size applied to the declared
    coordinates (S_a x_a + O_a), and the coordinates the checks draw."""
    coords = _coordinates(parameters, n_axes)
    if coords is not None and conventions is not None:
        conventions = {d: c.with_coordinates(coords.scale, coords.offset) for d, c in conventions.items()}
    return Declaration(conventions, n_axes=n_axes, dtypes=ND_DTYPES, coordinates=coords, **fields)


def _declare_axial(parameters: dict, own) -> Declaration:
    n_axes = _axes(parameters)
    head_dims = _head_dims(parameters, n_axes)
    if parameters.get("layout") is None:
        raise FamilyError(
            "--family axial needs --layout (half or interleaved); --family nd runs the spec-free checks only"
        )
    try:
        conventions = {
            d: ndref.axial(
                d,
                n_axes,
                layout=parameters["layout"],
                base=_bases(parameters),
                split=parameters.get("split"),
                pair_span=parameters.get("pair_span") or "axis",
            )
            for d in head_dims
        }
    except (ValueError, TypeError) as exc:
        raise FamilyError(str(exc)) from None
    return _declaration(conventions, parameters, n_axes, head_dims=head_dims)


def _declare_mrope(parameters: dict, own) -> Declaration:
    """M-RoPE over 2 * sum(sections) features; ``rotary_dim`` (which must equal that) says
    the head has more, passed through (GLM-4V: partial_rotary_factor 0.5 of head 128):
    heads of rotary_dim, rotary_dim + 48 and 2 rotary_dim features are drawn, as for 1-D."""
    sections = parameters.get("sections")
    if not sections:
        raise FamilyError("--family mrope needs --sections (pairs per axis, e.g. 16,24,24)")
    base = _bases(parameters)
    if isinstance(base, list):
        raise FamilyError("--family mrope takes one --base")
    rotated, rotary_dim = 2 * sum(int(s) for s in sections), parameters.get("rotary_dim")
    if rotary_dim is not None and rotary_dim != rotated:
        raise FamilyError(
            f"--rotary-dim {rotary_dim} does not match --sections: they rotate 2 * sum(sections) = {rotated} features"
        )
    head_dims = (rotated,) if rotary_dim is None else (rotated, rotated + 48, 2 * rotated)
    try:
        conventions = {
            d: ndref.mrope(
                list(sections),
                layout=parameters.get("layout") or "half",
                base=base,
                head_dim=d,
                interleaved=bool(parameters.get("mrope_interleaved")),
            )
            for d in head_dims
        }
    except (ValueError, TypeError) as exc:
        raise FamilyError(str(exc)) from None
    declared = _declaration(conventions, parameters, len(sections), head_dims=head_dims, rotary_dim=rotary_dim)
    if rotary_dim is None:  # one head size: its rotation alone
        return replace(declared, convention=declared.convention[rotated])
    return declared


def _declare_pairs(parameters: dict, own) -> Declaration:
    """Any convention as its list of pairs (``--pair-table FILE.json``, ``reference.nd.from_table``),
    or the target's own PairRotation."""
    path = parameters.get("pair_table")
    if path is None and own is None:
        raise FamilyError("--family pairs needs --pair-table FILE.json (the rotated pairs; see docs/families.md)")
    if path is None:
        conv = own
    else:
        try:
            with open(path) as f:
                table = json.load(f)
        except OSError as exc:
            raise FamilyError(f"--pair-table {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise FamilyError(f"--pair-table {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
        try:
            conv = ndref.from_table(table, f"--pair-table {path}")
        except ValueError as exc:
            raise FamilyError(str(exc)) from None
    declared = _declaration({conv.head_dim: conv}, parameters, conv.n_axes, head_dims=(conv.head_dim,))
    return replace(declared, convention=declared.convention[conv.head_dim])


def _declare_nd(parameters: dict, own) -> Declaration:
    n_axes = _axes(parameters)
    return _declaration(None, parameters, n_axes, head_dims=_head_dims(parameters, n_axes))


_CONTRACT = "rope(x, positions), positions int64 (batch, seq, n_axes), or float32 coordinates (--positions float)"
ND_FAMILIES = (
    ND.variant("axial", _declare_axial, f"{_CONTRACT}: features split into per-axis blocks, a 1-D RoPE in each"),
    ND.variant(
        "mrope",
        _declare_mrope,
        f"{_CONTRACT}: one 1-D RoPE whose pairs are driven by the axis their section assigns (Qwen2-VL, Qwen3-VL)",
    ),
    ND.variant("nd", _declare_nd, f"{_CONTRACT}: the spec-free N-D checks only"),
    ND.variant(
        "pairs",
        _declare_pairs,
        f"{_CONTRACT}: any convention as its list of rotated pairs (--pair-table), across heads too",
        calls=("x", "diffusers", "builder"),
    ),
)
ND_FAMILY_NAMES = tuple(f.name for f in ND_FAMILIES)  # the N-D rotations' --family values
