"""Deliberately broken RoPE implementations, one realistic bug each, and the checks that
must catch them. Every mutant starts from the same correct half-layout kernel ``rope``
and changes one thing."""

from __future__ import annotations

import torch

from ropecheck.targets.builtins import rotate_half
from ropecheck.targets.target import Convention, Target

BASE = 10000.0
HALF = Convention("half", BASE)


def inv_freq(r: int, base: float = BASE, dtype=torch.float32) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, r, 2, dtype=dtype) / r))


def rotate(x, cos, sin, sign=1.0):
    """Half-layout rotation in float32 by per-frequency cos, sin (batch, seq, 1, r/2),
    rounded once to x's dtype."""
    cos, sin = torch.cat((cos, cos), -1).float(), torch.cat((sin, sin), -1).float()
    xf = x.float()
    return (xf * cos + sign * rotate_half(xf) * sin).to(x.dtype)


def rope(x, positions, *, sign=1.0, angle_of=None, cos_dtype=None, sin_scale=1.0):
    """Correct half-layout RoPE (fp32 angles, fp32 math, one rounding at the end);
    the keyword arguments are the knobs mutants turn."""
    r = x.shape[-1]
    phi = (angle_of(positions, r) if angle_of else
           positions.to(torch.float32)[..., None] * inv_freq(r))[:, :, None, :]
    cos, sin = phi.cos(), phi.sin() * sin_scale
    if cos_dtype is not None:
        cos, sin = cos.to(cos_dtype), sin.to(cos_dtype)
    return rotate(x, cos, sin, sign)


def _angles_from(transform):
    return lambda positions, r: transform(positions)[..., None] * inv_freq(r)


def sign_flipped(x, p):
    return rope(x, p, sign=-1.0)


def interleaved_pairs(x, p):
    """An interleaved kernel declared as half."""
    r = x.shape[-1]
    phi = (p.float()[..., None] * inv_freq(r))[:, :, None, :]
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((a * phi.cos() - b * phi.sin(), a * phi.sin() + b * phi.cos()), -1)
    return out.flatten(-2).to(x.dtype)


def wrong_base(x, p):
    return rope(x, p, angle_of=lambda pos, r: pos.float()[..., None] * inv_freq(r, 1000.0))


def off_by_one(x, p):
    return rope(x, p, angle_of=_angles_from(lambda pos: pos.float() + 1))


def positions_ignored(x, p):
    seq = torch.arange(p.shape[1]).expand_as(p)
    return rope(x, p, angle_of=_angles_from(lambda pos: seq.float()))


def first_row_positions(x, p):
    return rope(x, p, angle_of=_angles_from(lambda pos: pos[:1].expand_as(pos).float()))


def angles_in_bf16(x, p):
    return rope(x, p, angle_of=lambda pos, r: (pos.to(torch.bfloat16)[..., None]
                                               * inv_freq(r).to(torch.bfloat16)).float())


def positions_in_fp16(x, p):
    return rope(x, p, angle_of=_angles_from(lambda pos: pos.to(torch.float16).float()))


def cos_sin_in_fp16(x, p):
    return rope(x, p, cos_dtype=torch.float16)


def cache_wraps(x, p):
    return rope(x, p, angle_of=_angles_from(lambda pos: (pos % 4096).float()))


def taylor_sincos(x, p):
    """sin/cos by a degree-9 Taylor series, no range reduction."""
    r = x.shape[-1]
    phi = (p.float()[..., None] * inv_freq(r))[:, :, None, :].double()
    sin = phi - phi**3 / 6 + phi**5 / 120 - phi**7 / 5040 + phi**9 / 362880
    cos = 1 - phi**2 / 2 + phi**4 / 24 - phi**6 / 720 + phi**8 / 40320
    return rotate(x, cos, sin)


def additive_sinusoid(x, p):
    """Absolute sinusoidal encoding added to x: not a rotation at all."""
    r = x.shape[-1]
    phi = (p.float()[..., None] * inv_freq(r))[:, :, None, :]
    return (x.float() + torch.cat((phi.sin(), phi.cos()), -1)).to(x.dtype)


def norm_growing(x, p):
    return rope(x, p, sin_scale=1.01)


def quadratic_angle(x, p):
    """Linear and orthogonal, but the angle grows like m^2: breaks relativity."""
    return rope(x, p, angle_of=_angles_from(lambda pos: pos.float() * (1 + pos.float() / 64)))


def constant_map(x, p):
    return x.clone()


class _FirstDtypeCache:
    """Caches cos/sin in the dtype of the first call and reuses them."""

    def __init__(self):
        self.cache = {}

    def __call__(self, x, p):
        r = x.shape[-1]
        if r not in self.cache:
            phi = torch.arange(70000, dtype=torch.float32)[:, None] * inv_freq(r)
            self.cache[r] = (phi.cos().to(x.dtype), phi.sin().to(x.dtype))
        cos, sin = (t[p.clamp(max=69999)][:, :, None, :] for t in self.cache[r])
        return rotate(x, cos, sin)


class _CacheRebuiltInCallerDtype:
    """Grows its cos/sin table when a call needs more positions, in that call's dtype;
    later calls in other dtypes reuse it (a bug that only a sequence of calls shows)."""

    def __init__(self):
        self.cos = self.sin = None

    def __call__(self, x, p):
        r = x.shape[-1]
        if self.cos is None or self.cos.shape[-1] != r // 2 or self.cos.shape[0] <= int(p.max()):
            phi = torch.arange(int(p.max()) + 1, dtype=torch.float32)[:, None] * inv_freq(r)
            self.cos, self.sin = phi.cos().to(x.dtype), phi.sin().to(x.dtype)
        cos, sin = (t[p][:, :, None, :] for t in (self.cos, self.sin))
        return rotate(x, cos, sin)


def decode_path_wrong(x, p):
    """seq == 1 takes a 'fast path' that forgets the offset."""
    return rope(x, torch.zeros_like(p) if x.shape[1] == 1 else p)


def strides_ignored(x, p):
    """Reads x's storage as if it were contiguous."""
    flat = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
    return rope(flat, p)


def mutates_input(x, p):
    y = rope(x, p)
    x.mul_(1.5)
    return y


def changes_dtype(x, p):
    return rope(x, p).float()


def nan_at_zero(x, p):
    pf = p.float()
    return rope(x, p, angle_of=_angles_from(lambda pos: pf * (pf / pf)))


def with_backward(forward, backward):
    """``forward(x, positions)`` as a custom autograd.Function whose VJP is
    ``backward(g, positions)``: a hand-written backward."""
    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, positions):
            ctx.save_for_backward(positions)
            return forward(x, positions)

        @staticmethod
        def backward(ctx, g):
            (positions,) = ctx.saved_tensors
            return backward(g, positions), None
    return Rope.apply


wrong_backward = with_backward(rope, rope)  # the gradient should rotate by -m


def _like_strided(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` written element by element into a tensor laid out with ``like``'s
    strides, as a kernel storing through those strides: where the strides overlap (a
    broadcast, stride 0) elements share memory and only one of their writes stays."""
    storage = torch.zeros(like.untyped_storage().nbytes() // like.element_size(), dtype=values.dtype)
    offsets = torch.zeros(like.shape, dtype=torch.int64) + like.storage_offset()
    for axis, (size, stride) in enumerate(zip(like.shape, like.stride())):
        shape = [1] * like.dim()
        shape[axis] = size
        offsets = offsets + torch.arange(size).reshape(shape) * stride
    storage[offsets.reshape(-1)] = values.reshape(-1)
    return storage.as_strided(like.shape, like.stride(), like.storage_offset())


# "Keep the gradient's layout": the result is allocated with g's strides
# (torch.empty_strided(g.shape, g.stride())). Right for every dense g; a broadcast g makes
# every row (expanded-head) or every feature (expanded-feature) share one memory location.
grad_strided_output = with_backward(rope, lambda g, p: _like_strided(rope(g, p, sign=-1.0), g))


def correct(name, fn, **kw) -> Target:
    return Target(name=name, fn=fn, convention=HALF, **kw)


# mutant name -> (implementation, the properties that must catch it)
MUTANTS = {
    "sign-flipped": (sign_flipped, {"reference", "backward"}),
    "interleaved-pairs": (interleaved_pairs, {"reference"}),
    "wrong-base": (wrong_base, {"reference"}),
    "off-by-one": (off_by_one, {"reference", "group-law", "identity"}),
    "positions-ignored": (positions_ignored, {"reference", "identity", "group-law", "invertibility"}),
    "first-row-positions": (first_row_positions, {"reference", "batch-independence"}),
    "angles-in-bf16": (angles_in_bf16, {"reference"}),
    "positions-in-fp16": (positions_in_fp16, {"reference"}),
    "cos-sin-in-fp16": (cos_sin_in_fp16, {"reference"}),
    "cache-wraps": (cache_wraps, {"reference", "group-law"}),
    "taylor-sincos": (taylor_sincos, {"reference", "orthogonality"}),
    "additive-sinusoid": (additive_sinusoid, {"identity", "linearity", "orthogonality", "relativity",
                                              "translation"}),
    "norm-growing": (norm_growing, {"orthogonality"}),
    "quadratic-angle": (quadratic_angle, {"relativity", "translation", "group-law"}),
    "constant-map": (constant_map, {"invertibility", "reference"}),
    "first-dtype-cache": (_FirstDtypeCache, {"reference"}),
    "cache-rebuilt-in-caller-dtype": (_CacheRebuiltInCallerDtype, {"statelessness"}),
    "decode-path-wrong": (decode_path_wrong, {"statelessness", "reference"}),
    "strides-ignored": (strides_ignored, {"contract", "reference"}),
    "mutates-input": (mutates_input, {"contract", "identity", "reference"}),
    "changes-dtype": (changes_dtype, {"contract", "reference"}),
    "nan-at-zero": (nan_at_zero, {"identity", "reference"}),
    "wrong-backward": (wrong_backward, {"backward", "inverse"}),
    "grad-strided-output": (grad_strided_output, {"backward", "inverse"}),  # only broadcast gradients show it
}


def mutant_target(name: str) -> Target:
    fn, _ = MUTANTS[name]
    if isinstance(fn, type):  # stateful mutants get a fresh instance per test
        fn = fn()
    return Target(name=name, fn=fn, convention=HALF)


class _ReturnsItsBuffer:
    """Writes every result into one internal buffer and returns it: the next call
    overwrites the previous result."""

    def __init__(self):
        self.buffer = None

    def __call__(self, x, p):
        y = rope(x, p)
        if self.buffer is None or self.buffer.shape != y.shape or self.buffer.dtype != y.dtype:
            self.buffer = torch.empty_like(y)
        return self.buffer.copy_(y)


MUTANTS["returns-its-buffer"] = (_ReturnsItsBuffer, {"statelessness"})
