"""Wall time of a full N-D check run, token indices against image coordinates side by side:
every N-D property (``properties.nd.checks``) against a right axial target (2 axes, half
layout, torch, in this process) in float32, ci profile (derandomized), 10 examples per
check; once on int64 token indices (the default) and once on float32 coordinates in
[-1, 1] scaled by 2 pi (``--positions float --coord-range=-1:1 --coord-scale 6.2832``:
grids or scattered draws, real shifts). The ratio of the two rows is what coordinates cost.

Run:  python -m pytest benchmarks/bench_nd.py --benchmark-only -p no:cacheprovider
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropecheck.properties.nd.checks import ND_PROPERTIES
from ropecheck.properties.nd.coordinates import Coordinates
from ropecheck.properties.runner import RunOptions, run_property
from ropecheck.reference.nd import axial
from ropecheck.targets.target import Target

OPTIONS = RunOptions(profile="ci", max_examples=10)
COORDINATES = {"token indices": None, "float coordinates": Coordinates("float", ((-1.0, 1.0),), (2 * math.pi,))}


def _rope(conv):
    """conv's rotation in float32 torch, autograd through it."""
    first, second, axis, theta = (torch.from_numpy(np.asarray(a)) for a in conv.arrays)
    scale = torch.tensor(conv.scale or (1.0,) * conv.n_axes, dtype=torch.float64)

    def rope(x, positions):
        phi = ((positions.double() * scale)[..., axis] * theta).float()[:, :, None, :]
        a, b = x.float()[..., first], x.float()[..., second]
        y = x.float().clone()
        y[..., first] = a * phi.cos() - b * phi.sin()
        y[..., second] = a * phi.sin() + b * phi.cos()
        return y.to(x.dtype)

    return rope


def full_check(target):
    return [run_property(prop, target, "float32", OPTIONS) for prop in ND_PROPERTIES.values()]


@pytest.mark.parametrize("kind", list(COORDINATES))
def test_full_nd_check(benchmark, kind):
    coords = COORDINATES[kind]
    conv = axial(16, 2, layout="half")
    if coords is not None:
        conv = conv.with_coordinates(coords.scale, coords.offset)
    target = Target("axial", _rope(conv), conv, family="axial", n_axes=2, head_dims=(16,), coordinates=coords)
    results = benchmark.pedantic(full_check, args=(target,), rounds=3, iterations=1, warmup_rounds=1)
    assert [r.property for r in results if r.status not in ("passed", "skipped")] == [], {
        r.property: (r.status, r.message) for r in results
    }
    benchmark.extra_info.update(positions=kind, examples=sum(r.examples for r in results))
