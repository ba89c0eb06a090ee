"""Call forms: how one canonical call ``f(x, positions)`` becomes a call of the target in
the form its library really has, and how its outputs become the canonical ``y``.

Every property speaks the canonical form: x (batch, seq, heads, head_dim), positions
int64 (batch, seq), y like x. A target declares one of
- ``x``: ``rope(x, positions) -> y`` (the canonical form itself);
- ``qk``: ``rope(q, k, positions) -> (q_out, k_out)``: x's heads [0, q_heads) are q, the
  others k (GQA / MQA: k_heads divides q_heads), both rotated at the same positions; with
  no k heads the target gets ``k=None`` (declared ``k_optional``) and y is q_out. q and k
  are views of x's storage (slices of one fused projection) or, ``separate``, tensors of
  their own with the same strides; what a target writes into them is written back into
  x, so the contract sees an input modified in place as it is;
- ``packed``: ``rope(x, cu_seqlens, positions) -> y`` on x (total, heads, head_dim) (thd),
  cu_seqlens int32 (n + 1,) with empty sequences allowed, positions int64 (total,), each
  token's absolute position ((total, n_axes) for the N-D families: each token's own). The
  canonical x is (1, total, heads, head_dim). A call on some tokens of a packed batch (a
  prefill, one decode token) is itself a packed batch: without the case's sequence
  lengths, a sequence ends where positions stop counting up (N-D: each row is one).

A :class:`Form` travels with each call to the process that runs the target
(``ropecheck.calling.execution``); nothing here judges values.

A call in a form is staged (:func:`drive`): a generator prepares the target's arguments
and yields them as a :class:`TargetCall`, receives what the target returned, and finishes
(the outputs brought back to the canonical y, the form's checks); a form that calls the
target more than once (one call per context-parallel rank) yields once per call. ``check``
drives the stages with the target; ``bench`` (``ropecheck.calling.timed``) records the calls
once and times them again and again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional

import numpy as np
import torch

from ropecheck.calling.devices import strided_copy
from ropecheck.properties.core.contract import segment_lengths


class ReturnedWrong(Exception):
    """The target's outputs do not fit its call form (a contract finding of ``kind``)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def cu_seqlens(lengths) -> torch.Tensor:
    return torch.tensor(np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))), dtype=torch.int32, device="cpu")


# a "padded batch" call (a CUDA-graph batch padded to its captured size): padding tokens
# before and after the case's, at position 0 (the fused cache-write and QK-norm stages)
PADDING = (1, 2)


def padded_positions(positions: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """A new tensor of the positions with position 0 for ``before`` padding tokens ahead of
    the case's and ``after`` behind them, along the last axis ((T,), or M-RoPE's (3, T))."""
    tokens = positions.shape[-1]
    pad = torch.zeros((*positions.shape[:-1], before + tokens + after), dtype=positions.dtype, device=positions.device)
    pad[..., before : before + tokens] = positions
    return pad


@dataclass(frozen=True)
class TargetCall:
    """One call of the target as a stage prepared it: ``fn(*args, **kwargs)``."""

    args: tuple
    kwargs: dict


# a staged call: yields each TargetCall, is sent what the target returned, returns (y, returned)
Stages = Generator[TargetCall, Any, tuple]


def drive(stages: Stages, fn: Callable) -> tuple:
    """Run a staged call with ``fn``: each call it prepares made, its output sent back;
    what the stages return (canonical y, what the target returned). A call that raises
    closes the stages (their ``finally`` blocks run) and propagates."""
    try:
        call = next(stages)
        while True:
            call = stages.send(fn(*call.args, **call.kwargs))
    except StopIteration as done:
        return done.value
    finally:
        stages.close()


def record(stages: Stages, fn: Callable) -> tuple:
    """``drive``, keeping each call it made: ((canonical y, returned), [TargetCall, ...])."""
    made: list = []

    def recording(*args, **kwargs):
        made.append(TargetCall(args, kwargs))
        return fn(*args, **kwargs)

    return drive(stages, recording), made


@dataclass(frozen=True)
class MRope:
    """An M-RoPE run through a library interface (``--family mrope --api``): the 1-D RoPE
    its sections split (``convention``: what the interface's table and arguments are made
    from, over rotary_dim = 2 sum(sections) features), the sections (pairs per axis: t, h,
    w) and whether they interleave (Qwen3-VL). Its calls pass positions (3, T)."""

    convention: Any
    sections: tuple
    interleaved: bool = False


@dataclass(frozen=True)
class Form:
    """One canonical call in the target's form: ``call``, and for ``qk`` where q ends and
    how q and k are stored, for ``packed`` the sequence lengths (empty ones included).
    Through a library interface (``api``, a preset: ``ropecheck.calling.api_call`` makes
    the call), also the case's choices (the classes of the interface's argument values it
    is called with) and k's layout, the convention its table is made from, the table's
    rows, ``table_sign`` (-1: the table of -m) and the context-parallel ranks it is split
    across."""

    call: str = "x"
    q_heads: Optional[int] = None  # qk: heads [0, q_heads) of x are q (None: all but the last)
    separate: bool = False  # qk: q and k in storages of their own
    lengths: tuple = ()  # packed: sequence lengths; () = found from the positions
    api: str = ""  # the preset it is called through ("" none)
    choices: tuple = ()  # ((factor, class), ...): the case's choices of the interface's argument classes
    memory: str = ""  # the case's memory layout (what a call through an interface reports it had)
    k_memory: str = ""  # qk, separate: k's own memory layout ("" x's)
    convention: Any = None  # what its table is made from
    table_rows: int = 0  # rows of a table indexed by position
    table_sign: int = 1  # -1: the table of -m
    inplace: bool = False  # the target declares writing into its input (an interface's inplace argument)
    cp_size: int = 1  # context-parallel ranks the call is split across (ropecheck.calling.context_parallel)
    mrope: Optional[MRope] = None  # an M-RoPE run through the interface: positions (3, T)
    takes: tuple = ()  # the optional parameters of the interface the target's signature has

    def invoke(self, fn: Callable, x: torch.Tensor, positions: torch.Tensor):
        """(canonical y, the tensors the target returned) for fn called on x in this form."""
        return drive(self.stages(x, positions), fn)

    def stages(self, x: torch.Tensor, positions: torch.Tensor) -> Stages:
        """The staged call on x in this form (``drive``)."""
        if self.call == "qk":
            return self._qk(x, positions)
        if self.call == "packed":
            return self._packed(x, positions)
        if self.call == "diffusers":
            return self._diffusers(x, positions)
        if self.call == "builder":
            return self._builder(x, positions)
        return self._x(x, positions)

    def _x(self, x, positions) -> Stages:
        out = yield TargetCall((x, positions), {})
        if isinstance(out, torch.Tensor) and out.device != x.device:
            raise ReturnedWrong("device", f"output on {out.device}, input on {x.device}")
        return out, out

    # --- qk -----------------------------------------------------------------------------
    def split(self, heads: int) -> int:
        """q's head count for x with ``heads`` heads: the case's, else all but the last."""
        if self.q_heads is not None and self.q_heads <= heads:
            return self.q_heads
        return max(heads - 1, 1)

    def _qk(self, x, positions) -> Stages:
        heads = x.shape[2]
        hq = self.split(heads)
        if self.separate and not x.requires_grad:
            q_store, k_store = _own_storage(x), _own_storage(x)
        else:
            q_store = k_store = x
        q = q_store[:, :, :hq]
        k = k_store[:, :, hq:] if hq < heads else None
        if heads == 1 and self.q_heads is None and k is None:
            k = _own_storage(x)  # the smallest call: q and k one head each, same values
        out = yield TargetCall((q, k, positions), {})
        if self.separate and not x.requires_grad:  # what the target wrote into q, k
            with torch.no_grad():
                x[:, :, :hq].copy_(q)
                if hq < heads:
                    x[:, :, hq:].copy_(k)
        q_out, k_out = _qk_outputs(out, k is not None)
        _fits("q_out", q_out, q)
        if k is None or hq == heads:
            return q_out, out
        _fits("k_out", k_out, k)
        _both_differentiable(x, q_out, k_out)
        return torch.cat((q_out, k_out), dim=2), out

    # --- packed -------------------------------------------------------------------------
    def _packed(self, x, positions) -> Stages:
        batch, seq, heads, head_dim = x.shape
        if batch == 1 and sum(self.lengths) == seq:
            lengths = self.lengths
        elif positions.dim() > 2:  # N-D positions do not count up: each row one sequence
            lengths = (seq,) * batch
        else:
            lengths = tuple(n for row in positions.cpu().numpy() for n in segment_lengths(row))
        tokens = x.reshape(batch * seq, heads, head_dim)  # a view for batch 1
        cu = cu_seqlens(lengths).to(x.device)
        flat = positions.reshape(batch * seq, *positions.shape[2:]).contiguous()
        out = yield TargetCall((tokens, cu, flat), {})
        if not isinstance(out, torch.Tensor):
            raise ReturnedWrong(
                "type", f"the target returned {_kind(out)}, expected a torch.Tensor (total, heads, head_dim)"
            )
        _fits("y", out, tokens)
        return out.reshape(x.shape), out

    # --- diffusers: apply_rotary_emb(x, (cos, sin), use_real=True, ...) ------------------
    def _diffusers(self, x, positions) -> Stages:
        """diffusers' applier: cos and sin (S, D) float32, made from the declared rotation
        for the batch's one position row (pass-through features cos 1, sin 0), the pairs'
        layout as ``use_real_unbind_dim`` (-1 adjacent pairs, -2 pairs half a head apart)
        and x as (B, S, H, D) (``sequence_dim=1``) or (B, H, S, D) (2, the case's choice)."""
        conv = self.convention[x.shape[-1]] if isinstance(self.convention, dict) else self.convention
        row = positions[0].detach().cpu().numpy()  # the batch's one row of positions
        cos, sin = applier_tables(conv, row if row.ndim == 2 else row[:, None], x.shape[-1])
        sequence_dim = int(dict(self.choices).get("sequence_dim", "2"))
        given = x if sequence_dim == 1 else x.transpose(1, 2)
        tables = (cos.to(x.device), sin.to(x.device))
        kwargs = dict(use_real=True, use_real_unbind_dim=unbind_dim(conv), sequence_dim=sequence_dim)
        out = yield TargetCall((given, tables), kwargs)
        if not isinstance(out, torch.Tensor):
            raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected a torch.Tensor like x")
        _fits("y", out, given)
        return (out if sequence_dim == 1 else out.transpose(1, 2)), out

    # --- builder: build(positions) -> (cos, sin), applied here ----------------------------
    def _builder(self, x, positions) -> Stages:
        """An N-D rotation's table builder, called with the batch's one row of positions
        (S, n_axes): its tables (``builder_tables``) applied to x along the declared pairs
        in float64, x_i cos_i - x_j sin_i and x_j cos_j + x_i sin_j for pair (i, j), x_k cos_k
        for a feature in no pair, rounded once to x's dtype: what the checks see is the
        rotation the tables make, exactly but for that last rounding."""
        conv = self.convention[x.shape[-1]] if isinstance(self.convention, dict) else self.convention
        out = yield TargetCall((positions[0],), {})
        cos, sin = builder_tables(out, x.shape[1], conv)
        first, second, _, _ = conv.arrays
        x64 = x.to(torch.float64)
        turned = torch.zeros_like(x64)
        turned[..., first], turned[..., second] = -x64[..., second], x64[..., first]
        c, s = (t.to(x.device)[None, :, None, :] for t in (cos, sin))
        return (x64 * c + turned * s).to(x.dtype), out


def builder_tables(out, seq: int, conv) -> tuple:
    """A builder's result as float64 cos and sin (S, D): (cos, sin), each (S, D) with each
    pair's value at both its features (diffusers' ``use_real=True`` tables), or one complex
    tensor (S, D/2) whose column p is pair p's cos + i sin in the declared pairs' order
    (``use_real=False``; features in no pair: cos 1, sin 0). ReturnedWrong when it is
    neither, or not finite."""
    d, pairs = conv.head_dim, len(conv.first)
    if isinstance(out, torch.Tensor) and out.is_complex():
        if tuple(out.shape) != (seq, pairs):
            raise ReturnedWrong(
                "shape", f"the builder returned a complex {tuple(out.shape)}, expected ({seq}, {pairs})"
            )
        table = out.detach().to(torch.complex128).cpu().numpy()
        cos, sin = (torch.from_numpy(t) for t in feature_tables(conv, table.real, table.imag))
    elif isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        for name, t in zip(("cos", "sin"), out):
            if tuple(t.shape) != (seq, d) or not t.is_floating_point():
                raise ReturnedWrong(
                    "shape", f"the builder's {name} is {tuple(t.shape)} {t.dtype}, expected a float ({seq}, {d})"
                )
        cos, sin = (t.detach().to(torch.float64).cpu() for t in out)
    else:
        wanted = f"(cos, sin) each ({seq}, {d}) or a complex ({seq}, {pairs})"
        raise ReturnedWrong("type", f"the builder returned {_kind(out)}, expected {wanted}")
    if not (bool(torch.isfinite(cos).all()) and bool(torch.isfinite(sin).all())):
        raise ReturnedWrong("non-finite", "the builder's cos or sin is not finite")
    return cos, sin


def unbind_dim(conv) -> int:
    """diffusers' ``use_real_unbind_dim`` for a rotation's pairs: -1 when every pair is
    (2i, 2i + 1), -2 when every pair is (p, p + D/2); ValueError otherwise."""
    first, second = np.asarray(conv.first), np.asarray(conv.second)
    if np.all(first % 2 == 0) and np.all(second == first + 1):
        return -1
    if np.all(second == first + conv.head_dim // 2) and np.all(first < conv.head_dim // 2):
        return -2
    raise ValueError(
        f"{conv.description}: its pairs are neither adjacent features nor half a head apart, "
        "which diffusers' apply_rotary_emb cannot express (use_real_unbind_dim -1 or -2)"
    )


def applier_tables(conv, positions: np.ndarray, head_dim: int) -> tuple:
    """float32 cos and sin (S, head_dim) of a rotation at positions (S, n_axes): each pair's
    cos and sin at both its features, 1 and 0 at features in no pair (float64, rounded once)."""
    phi = conv.angles(positions)  # (S, pairs)
    cos, sin = feature_tables(conv, np.cos(phi), np.sin(phi), head_dim)
    return torch.from_numpy(cos).float(), torch.from_numpy(sin).float()


def feature_tables(conv, cos_pairs: np.ndarray, sin_pairs: np.ndarray, head_dim: Optional[int] = None) -> tuple:
    """float64 cos and sin (S, head_dim) from per-pair values (S, pairs) in the rotation's
    pair order: each pair's at both its features, 1 and 0 at features in no pair."""
    shape = (len(cos_pairs), head_dim or conv.head_dim)
    cos, sin = np.ones(shape), np.zeros(shape)
    i, j, _, _ = conv.arrays
    cos[:, i] = cos[:, j] = cos_pairs
    sin[:, i] = sin[:, j] = sin_pairs
    return cos, sin


def _own_storage(x: torch.Tensor) -> torch.Tensor:
    """A tensor laid out as x (sizes, strides, offset) in a storage of its own."""
    return strided_copy(x)


def _kind(out) -> str:
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}"
    return type(out).__name__


def _qk_outputs(out, has_k: bool):
    if isinstance(out, torch.Tensor) and not has_k:
        return out, None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ReturnedWrong("type", f"the target returned {_kind(out)}, expected (q_out, k_out)")
    q_out, k_out = out
    if has_k and k_out is None:
        raise ReturnedWrong("type", "the target returned no k_out for a k it was given")
    return q_out, k_out


def _both_differentiable(x: torch.Tensor, q_out: torch.Tensor, k_out: torch.Tensor) -> None:
    """In a VJP (x requires grad), autograd reaches both q_out and k_out or neither (the VJP
    names that): with one cut off, y = cat(q_out, k_out) still requires grad and the
    gradient for that one's input would come back silently zero."""
    if not x.requires_grad or q_out.requires_grad == k_out.requires_grad:
        return
    cut, flows = ("k_out", "q_out") if q_out.requires_grad else ("q_out", "k_out")
    raise ReturnedWrong(
        "backward",
        f"{cut} does not require grad while {flows} does: autograd does not flow through the target to {cut}",
    )


def mismatch(y, x: torch.Tensor, name: str = "output") -> Optional[tuple]:
    """(kind, message) when y is not a tensor of x's shape, dtype and device, else None."""
    if not isinstance(y, torch.Tensor):
        said = "the target returned" if name == "output" else f"{name} is"
        return "type", f"{said} {type(y).__name__}, expected a torch.Tensor"
    if tuple(y.shape) != tuple(x.shape):
        return "shape", f"{name} shape {tuple(y.shape)} differs from input shape {tuple(x.shape)}"
    if y.dtype != x.dtype:
        return "dtype", f"{name} dtype {y.dtype} differs from input dtype {x.dtype}"
    if y.device != x.device:
        return "device", f"{name} on {y.device}, input on {x.device}"
    return None


def _fits(name: str, out, given: torch.Tensor) -> None:
    problem = mismatch(out, given, name)
    if problem:
        raise ReturnedWrong(*problem)
