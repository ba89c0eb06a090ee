"""A Case: the small, printable description of one input; tensors are made from it.

Hypothesis draws Cases (and shrinks them: fewer rows, smaller positions, simpler memory
layout), a failure prints the Case, and ``Case.tensors()`` rebuilds the exact input.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ropecheck.properties.core.dtypes import torch_dtype


@dataclass(frozen=True)
class Layout:
    """How a (batch, seq, heads, head_dim) tensor sits in its storage. ``what`` names the
    views in a support note ("raises on views with an odd row stride"); an ``exotic``
    layout is one no model hands RoPE, probed separately from the drawn inputs; an
    ``interface`` layout is drawn only for the library interfaces whose argument space has
    it (MLA's slices for a serving engine's kernel)."""

    name: str
    what: str
    exotic: bool
    make: Callable  # contiguous v -> a view with v's values in this layout
    interface: bool = False


def _wider(v: torch.Tensor, axis: int, width: int, index) -> torch.Tensor:
    """v placed at ``index`` of a zero tensor whose ``axis`` is ``width`` long."""
    shape = list(v.shape)
    shape[axis] = width
    wide = torch.zeros(shape, dtype=v.dtype, device=v.device)
    wide[(slice(None),) * axis + (index,)] = v
    return wide[(slice(None),) * axis + (index,)]


def _stored_as(order: tuple) -> Callable:
    """Storage in another axis order (a permutation of (b, s, h, d)), viewed back."""
    inverse = tuple(order.index(i) for i in range(4))
    return lambda v: v.permute(order).contiguous().permute(inverse)


def _qkv_slice(v: torch.Tensor) -> torch.Tensor:
    b, s, h, d = v.shape
    qkv = torch.zeros(b, s, 3, h, d, dtype=v.dtype, device=v.device)
    qkv[:, :, 1] = v
    return qkv[:, :, 1]  # the k of qkv.view(b, s, 3, h, d): row stride 3hd, offset hd


def _latent_slice(v: torch.Tensor) -> torch.Tensor:
    """The heads at the end of a wide per-token row, as MLA's k_pe is the last rope
    features of its latent row (kv_lora_rank + rope, kv_lora_rank = 8 rope here)."""
    b, s, h, d = v.shape
    row = torch.zeros(b, s, 8 * d + h * d, dtype=v.dtype, device=v.device)
    row[..., 8 * d :] = v.reshape(b, s, h * d)
    return row[..., 8 * d :].view(b, s, h, d)


def _odd_offset(v: torch.Tensor) -> torch.Tensor:
    flat = torch.zeros(v.numel() + 1, dtype=v.dtype, device=v.device)
    flat[1:] = v.reshape(-1)
    return flat[1:].view(v.shape)


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("contiguous", "contiguous tensors", False, lambda v: v.contiguous()),
        Layout(
            "transposed",
            "(batch, heads, seq, head_dim) storage viewed transposed (HF)",
            False,
            _stored_as((0, 2, 1, 3)),
        ),
        Layout("qkv-slice", "the k slice of a fused qkv projection", False, _qkv_slice),
        Layout(
            "strided-heads",
            "every other head of a wider tensor",
            False,
            lambda v: _wider(v, 2, 2 * v.shape[2], slice(None, None, 2)),
        ),
        Layout("sbhd", "(seq, batch, heads, head_dim) storage (Megatron)", False, _stored_as((1, 0, 2, 3))),
        Layout(
            "padded", "rows padded to head_dim + 8", False, lambda v: _wider(v, 3, v.shape[3] + 8, slice(0, v.shape[3]))
        ),
        Layout(
            "padded-64",
            "rows padded to head_dim + 64 (a padded head stride, as vLLM's)",
            False,
            lambda v: _wider(v, 3, v.shape[3] + 64, slice(0, v.shape[3])),
        ),
        # drawn for the interfaces that take them (a serving engine's MLA tensors)
        Layout(
            "mla-slice",
            "the rope part of wider heads (MLA's q_pe: features nope .. nope + rope of each head, nope = 2 rope)",
            False,
            lambda v: _wider(v, 3, 3 * v.shape[3], slice(2 * v.shape[3], 3 * v.shape[3])),
            interface=True,
        ),
        Layout(
            "latent-slice",
            "the last features of a wide per-token row (MLA's k_pe in its latent row)",
            False,
            _latent_slice,
            interface=True,
        ),
        # exotic: probed, a refusal is a support note
        Layout(
            "odd-padded",
            "views with an odd row stride (rows of head_dim + 3)",
            True,
            lambda v: _wider(v, 3, v.shape[3] + 3, slice(0, v.shape[3])),
        ),
        Layout("odd-offset", "views with an odd storage offset", True, _odd_offset),
        Layout(
            "inner-strided",
            "views whose last dimension has stride 2",
            True,
            lambda v: _wider(v, 3, 2 * v.shape[3], slice(None, None, 2)),
        ),
    )
}
# What models hand RoPE: drawn in every run.
MEMORY_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if not layout.exotic and not layout.interface)
# What a serving engine's kernels take on top: drawn for the interfaces that list them.
INTERFACE_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.interface)
EXOTIC_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.exotic)


def _expanded(kept: tuple) -> Callable:
    """v's values along the axes in ``kept`` (index 0 along the others), broadcast back to
    v's shape: a stride-0 view of a smaller tensor, as autograd hands the backward of a
    reduction (the gradient of a sum is the incoming one ``expand``-ed)."""

    def make(v: torch.Tensor) -> torch.Tensor:
        index = tuple(slice(None) if axis in kept else slice(0, 1) for axis in range(v.dim()))
        return v[index].clone(memory_format=torch.contiguous_format).expand(v.shape)  # own, small storage

    return make


# Gradients only: their values are not v's (a broadcast repeats one slice of it).
EXPANDED_GRADS = {
    layout.name: layout
    for layout in (
        Layout(
            "expanded-head",
            "a (1, 1, 1, head_dim) gradient expanded to the whole shape (strides 0, 0, 0, 1: "
            "the backward of (y * w).sum() for a weight w over head_dim)",
            False,
            _expanded((3,)),
        ),
        Layout(
            "expanded-feature",
            "a (batch, seq, heads, 1) gradient expanded over head_dim (stride 0 in the last "
            "dimension: the backward of y.sum(-1) weighted per head)",
            False,
            _expanded((0, 1, 2)),
        ),
    )
}
# What autograd hands a backward: a dense gradient in the layout of the op that consumed y,
# or a broadcast (stride-0) one from a reduction.
GRAD_LAYOUTS = ("contiguous", "transposed", "sbhd") + tuple(EXPANDED_GRADS)


# Elements past which a case's values are drawn chunk by chunk (production inputs hold up
# to 2^24; the huge one 2^31 and more).
VALUES_CHUNK = 2**24

# A check makes the same input's values several times (its call, the float64 copies it
# compares, a repeat): the latest ones are kept, read-only, up to this many elements
# (256 MB); at production sizes drawing them again was a seventh of a run.
VALUES_KEPT = 2**25
_kept: OrderedDict = OrderedDict()


def _standard_normal(seed: int, salt: int, shape: tuple, scale: float) -> np.ndarray:
    key = (seed, salt, shape, scale)
    if key in _kept:
        _kept.move_to_end(key)
        return _kept[key]
    out = np.random.default_rng([seed, salt]).standard_normal(shape) * scale
    out.flags.writeable = False
    _kept[key] = out
    while sum(v.size for v in _kept.values()) > VALUES_KEPT and len(_kept) > 1:
        _kept.popitem(last=False)
    return out


@dataclass(frozen=True)
class Case:
    """One input in the canonical form (x, positions), and the call form it is handed to
    the target in (``ropecheck.call_forms``): for ``qk``, x's ``heads`` are q's and
    ``k_heads`` more follow (k; none: k=None), ``separate`` puts q and k in storages of
    their own (for an interface whose q and k come in layouts of their own, k in
    ``k_memory``); for ``packed``, batch is 1 and ``lengths`` are the sequences' lengths.
    ``choices``: the classes of the interface's argument values it is handed in, one per
    factor of its space (a tensor format, a positions dtype: ``interfaces.space``), as
    (factor, class) pairs."""

    dtype: str
    batch: int
    seq: int
    heads: int
    head_dim: int
    positions: tuple  # (batch, seq) nested tuple of ints (of float32 values: ``position_dtype``)
    memory: str = "contiguous"
    scale: float = 1.0
    seed: int = 0
    call: str = "x"
    k_heads: int = 0  # qk: k's heads
    separate: bool = False  # qk: q and k in storages of their own
    lengths: tuple = ()  # packed: sequence lengths, empty ones included
    # position axes: 1-D RoPE is the N-D case with one axis, and its positions are (batch,
    # seq) as 1-D targets take them; N-D targets take (batch, seq, n_axes)
    n_axes: int = 1
    k_memory: str = ""  # qk, separate, own k layout: k's memory layout ("" q's)
    choices: tuple = ()  # ((factor, class), ...): how the interface is called ("" none)
    position_dtype: str = "int64"  # float32: the coordinates of an image or video model (N-D)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The canonical x's shape: q's and k's heads together for qk."""
        return (self.batch, self.seq, self.heads + self.k_heads, self.head_dim)

    def positions_array(self) -> np.ndarray:
        """The positions as the target takes them: (batch, seq), or (batch, seq, n_axes) for
        more than one axis."""
        shape = (self.batch, self.seq) + ((self.n_axes,) if self.n_axes > 1 else ())
        return np.asarray(self.positions, dtype=self.position_dtype).reshape(shape)

    def axes_array(self) -> np.ndarray:
        """The positions with their axes: (batch, seq, n_axes), one axis included."""
        return np.asarray(self.positions, dtype=self.position_dtype).reshape(self.batch, self.seq, self.n_axes)

    def positions_tensor(self) -> torch.Tensor:
        return torch.from_numpy(self.positions_array())

    def values(self, salt: int = 0) -> np.ndarray:
        """float64 values, standard normal times scale (read-only: shared with the next
        call for the same input); ``salt`` gives an independent draw.
        Past VALUES_CHUNK elements each chunk of head vectors has a stream of its own
        (``_chunks``), so ``tensor`` makes a huge input without it ever being float64."""
        if int(np.prod(self.shape)) <= VALUES_CHUNK:
            return _standard_normal(self.seed, salt, self.shape, self.scale)  # read-only
        out = np.empty(self.shape).reshape(-1, self.head_dim)
        for rows, chunk in self._chunks(salt):
            out[rows] = chunk
        return out.reshape(self.shape)

    def _chunks(self, salt: int):
        """(rows, float64 values) of the head vectors, VALUES_CHUNK elements at a time, in
        order. Each chunk has a stream of its own, so they are drawn on every core at once
        (numpy's generators release the GIL): the values do not depend on the threads, and
        the input past 2^31 elements (128 chunks) is drawn in a fraction of the time."""
        count, step = int(np.prod(self.shape[:-1])), max(1, VALUES_CHUNK // self.head_dim)
        starts = list(range(0, count, step))

        def draw(number: int) -> tuple:
            rows = slice(starts[number], min(starts[number] + step, count))
            rng = np.random.default_rng([self.seed, salt, number])
            return rows, rng.standard_normal((rows.stop - rows.start, self.head_dim)) * self.scale

        threads = max(1, min(len(starts), os.cpu_count() or 1))
        if threads == 1:
            yield from map(draw, range(len(starts)))
            return
        with ThreadPoolExecutor(threads) as pool:  # a few chunks ahead of the one taken
            pending = [pool.submit(draw, n) for n in range(min(len(starts), 2 * threads))]
            for number in range(len(starts)):
                rows, values = pending[number].result()
                pending[number] = None  # type: ignore[call-overload]  # taken: its memory goes
                ahead = number + 2 * threads
                if ahead < len(starts):
                    pending.append(pool.submit(draw, ahead))
                yield rows, values

    def tensor(self, salt: int = 0, values: np.ndarray | None = None, memory: str | None = None) -> torch.Tensor:
        """x in the case's dtype and memory layout (or ``memory``: an ``EXPANDED_GRADS``
        layout gives a broadcast gradient, which repeats one slice of the values)."""
        if values is None and int(np.prod(self.shape)) > VALUES_CHUNK:
            v = torch.empty(self.shape, dtype=torch_dtype(self.dtype))
            flat = v.view(-1, self.head_dim)
            for rows, chunk in self._chunks(salt):
                flat[rows] = torch.from_numpy(chunk)
            return self._laid_out(v, memory)
        drawn = self.values(salt) if values is None else np.asarray(values, np.float64)
        own = torch.tensor(drawn, dtype=torch_dtype(self.dtype), device="cpu")  # a copy of its own
        return self._laid_out(own, memory)

    def _laid_out(self, v: torch.Tensor, memory: str | None) -> torch.Tensor:
        layout = memory or self.memory
        known = LAYOUTS.get(layout) or EXPANDED_GRADS.get(layout)
        if known is None:
            raise ValueError(f"unknown memory layout {layout!r}")
        return known.make(v)

    def choice(self, factor: str, default: str = "") -> str:
        """The class of ``factor`` this input is handed in (``default`` where it has none)."""
        return dict(self.choices).get(factor, default)

    def with_choices(self, **changes) -> "Case":
        from dataclasses import replace

        return replace(self, choices=tuple({**dict(self.choices), **changes}.items()))

    def with_positions(self, positions: np.ndarray) -> "Case":
        from dataclasses import replace

        return replace(self, positions=nested(positions, self.position_dtype))

    def describe(self) -> str:
        p = self.positions_array()
        if self.position_dtype != "int64" or self.n_axes > 1:
            classes = "".join(f", {factor}={value}" for factor, value in self.choices)
        if self.position_dtype != "int64":  # float32 coordinates, each as its shortest decimal
            shown = abridged(np.vectorize(lambda v: str(np.float32(v)), otypes=[object])(p))
            where = f"float32 positions {shown} ({self.n_axes} axes){classes}"
            return f"{self._form()} {self.dtype}, seed {self.seed}; {where}"
        if self.n_axes > 1:  # abridged: a long input's positions would fill screens
            return (
                f"{self._form()} {self.dtype}, seed {self.seed}; positions {abridged(p)} ({self.n_axes} axes){classes}"
            )
        rows = abridged(p).strip("[]")
        classes = ", ".join(f"{factor}={value}" for factor, value in self.choices)
        called = f"; interface classes {classes}" if classes else ""
        return (
            f"{self._form()} {self.dtype}, {self.memory}, scale {self.scale:g}, seed {self.seed}; "
            f"positions [{rows}]{called}"
        )

    def _form(self) -> str:
        b, s, h, d = self.batch, self.seq, self.heads, self.head_dim
        if self.call == "qk":
            k = f"k {(b, s, self.k_heads, d)}" if self.k_heads else "k None"
            where = (
                ("separate tensors" + (f", k {self.k_memory}" if self.k_memory and self.k_heads else ""))
                if self.separate
                else f"heads 0..{h - 1} and {h}..{h + self.k_heads - 1} of one tensor"
            )
            return f"call qk: q {(b, s, h, d)}, {k} ({where})"
        if self.call == "packed":
            cu = np.concatenate(([0], np.cumsum(self.lengths))).tolist()
            return f"call packed: x {(s, h, d)}, cu_seqlens [{_short(np.asarray(cu))}]"
        return f"x: shape {self.shape}"


def nested(positions, dtype=np.int64) -> tuple:
    """Positions as nested tuples (a Case is hashable and printable); ``dtype`` float32 for
    coordinates (exact in the tuple's Python floats)."""
    p = np.asarray(positions, dtype=dtype)
    return tuple(nested(row, dtype) for row in p) if p.ndim > 1 else tuple(p.tolist())


SHOWN = 10  # values of a list a printed line shows (the first and last halves)
SHOWN_ROWS = 4  # rows of nested lists (a batch's positions) likewise


def _short(row, limit: int = SHOWN) -> str:
    values = np.asarray(row).tolist()
    if len(values) <= limit:
        return ", ".join(map(str, values))
    head = ", ".join(map(str, values[: limit // 2]))
    tail = ", ".join(map(str, values[-limit // 2 :]))
    return f"{head}, ... ({len(values) - limit} more), {tail}"


def abridged(value, limit: int = SHOWN) -> str:
    """A value as a printed line shows it: a list (or array) of more than ``limit`` items as
    its first and last ones and how many are left out; nested lists (rows) likewise, at
    most SHOWN_ROWS rows; anything else as it is."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return value.describe() if hasattr(value, "describe") else repr(value)
    if value and isinstance(value[0], (list, tuple, np.ndarray)):
        rows = [abridged(row, limit) for row in value]
        if len(rows) > SHOWN_ROWS:
            more = f"... ({len(rows) - SHOWN_ROWS} more rows)"
            rows = rows[: SHOWN_ROWS // 2] + [more] + rows[-SHOWN_ROWS // 2 :]
        return "[" + "; ".join(r.strip("[]") for r in rows) + "]"
    return f"[{_short(value, limit)}]"


def as_float64(t: torch.Tensor) -> np.ndarray:
    """A snapshot of a tensor's exact values in float64 numpy (a copy, never a view: a
    target may later overwrite the tensor it returned)."""
    return t.detach().cpu().to(torch.float64).numpy().copy()
