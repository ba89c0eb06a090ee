"""One canonical (q, k) call through a fused QK-RMSNorm + RoPE interface (``Interface.norm``:
vLLM's ``fused_qk_norm_rope``, SGLang's), and its results brought back to the canonical y.

Such a kernel takes the packed projection of a layer, ``qkv`` (T, (Hq + Hk + Hv) * D), and
in place RMS-normalises each q and k head over its D features with its weights, rotates
its first rotary_dim features and leaves v alone. The checks read the rotation of the
normalised heads (``properties.core.normalization``): for each call ropecheck

- draws the weights ``q_weight`` and ``k_weight`` (D,) in the input's dtype, eps, and the
  scale s of the call's ``qkv values`` class (a model's activations, or heads near eps);
- makes a qkv buffer of its own: q's and k's heads hold the raw heads u = z / w * s (z the
  canonical q and k, rounded once to the dtype), v's heads values of their own, and in a
  ``padded batch`` (a CUDA-graph batch) all-zero tokens before and after the case's, at
  position 0;
- after the call checks what the interface promises, each a finding that names the token
  and head: v's heads as given; a padding token's q and k finite and zero (the norm of a
  zero head is zero: eps keeps it from 0 / 0); the q and k heads finite;
- reads back y * rms(u) / s into the canonical q and k (rms of the raw heads as the kernel
  got them, in float64): the rotation of z, which every property then judges.
"""

from __future__ import annotations

import numpy as np
import torch

from ropecheck.calling.forms import PADDING, ReturnedWrong, TargetCall, padded_positions
from ropecheck.properties.core import normalization
from ropecheck.properties.core.dtypes import dtype_name

SENTINEL = 8192.0  # what a row-strided qkv's buffer holds past each row (exact in every float dtype)


def _rng(*sizes: int) -> np.random.Generator:
    """A generator of the call's own (torch's global one is the target's state)."""
    return np.random.default_rng([19, *sizes])


def _host64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float64).numpy()


class QKNormCall:
    """The packed qkv of one call around the canonical q (b, s, hq, D) and k (b, s, hk, D),
    and the reading of what the kernel wrote into it. ``call``: the ``api_call._Call``
    (the case's choices, positions, the names of the interface's arguments)."""

    def __init__(self, call, q: torch.Tensor, k: torch.Tensor):
        self.call, self.q, self.k = call, q, k
        b, s, self.hq, self.head_dim = q.shape
        self.hk = self.hv = k.shape[2]
        self.tokens = b * s
        self.dtype, self.device = q.dtype, q.device
        values = call.choice("qkv values") or "model scale"
        padded = call.choice("padding") == "padded batch"
        self.before, self.after = PADDING if padded else (0, 0)
        call.passed["qkv values"], call.passed["padding"] = values, "padded batch" if padded else "none"
        positions = call.token_positions()
        rng = _rng(self.tokens, self.hq, self.hk, self.head_dim, int(positions.sum().item()) % 2**31)
        name = dtype_name(self.dtype)
        self.scale = normalization.scale(values, name)
        self.eps = normalization.epsilon(values, int(rng.integers(0, 2**16)))
        self.weights = {  # rounded once to the dtype; the float64 values of the rounded ones
            which: torch.from_numpy(normalization.weights(rng, self.head_dim)).to(self.dtype) for which in ("q", "k")
        }
        n, d = self.before + self.tokens + self.after, self.head_dim
        self.raw = {  # the raw heads u = z / w * s in the dtype, (T, heads, D)
            which: torch.from_numpy(
                _host64(z).reshape(self.tokens, -1, d) / _host64(self.weights[which]) * self.scale
            ).to(self.dtype)
            for which, z in (("q", q), ("k", k))
        }
        v = rng.standard_normal((n, self.hv, d)).astype(np.float32)
        self.v = torch.from_numpy(v).to(self.dtype)
        width = (self.hq + self.hk + self.hv) * d
        # a row-strided qkv (a probe): a view of a wider buffer, each row followed by a sentinel
        self.pad = (
            normalization.ROW_PAD if call.choice(normalization.STRIDED_QKV[0]) == normalization.STRIDED_QKV[1] else 0
        )
        buffer = torch.full((n, width + self.pad), SENTINEL, dtype=self.dtype)
        qkv = buffer[:, :width]
        qkv.zero_()
        self.rows = rows = slice(self.before, self.before + self.tokens)  # the case's tokens in qkv
        qkv[rows, : self.hq * d] = self.raw["q"].reshape(self.tokens, -1)
        qkv[rows, self.hq * d : (self.hq + self.hk) * d] = self.raw["k"].reshape(self.tokens, -1)
        qkv[:, (self.hq + self.hk) * d :] = self.v.reshape(n, -1)
        self.buffer = buffer.to(self.device)  # its qkv view, on the device
        self.qkv = self.buffer[:, :width]
        self.weights = {which: w.to(self.device) for which, w in self.weights.items()}
        self.positions = padded_positions(positions, self.before, self.after) if padded else positions

    def arguments(self) -> dict:
        """The values of the norm stage's roles (the positions, padding included)."""
        return {
            "qkv": self.qkv,
            "num_heads_q": self.hq,
            "num_heads_k": self.hk,
            "num_heads_v": self.hv,
            "head_size": self.head_dim,
            "eps": self.eps,
            "q_weight": self.weights["q"],
            "k_weight": self.weights["k"],
            "positions": self.positions,
        }

    # --- after the call --------------------------------------------------------------
    def _name(self, role: str) -> str:
        return next((p.name for p in self.call.preset.params if p.role == role), role)

    def _token(self, i: int) -> str:
        if not self._padding(i):
            return f"token {i - self.before}"
        return f"the padding token at row {i} of {self._name('qkv')} (all zero, position 0)"

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], -1, self.head_dim)

    def finish(self, q_view: torch.Tensor, k_view: torch.Tensor) -> None:
        """Check what the kernel wrote, then write the rotation of the normalised heads into
        the canonical q and k views (``q_view``, ``k_view``)."""
        qkv, d = self.qkv.detach().cpu(), self.head_dim
        if self.pad and not bool((self.buffer[:, qkv.shape[1] :] == SENTINEL).all()):
            row = int((self.buffer[:, qkv.shape[1] :] != SENTINEL).any(-1).nonzero()[0])
            raise ReturnedWrong(
                "qkv",
                f"the target wrote past the end of {self._name('qkv')}'s row {row} (into the buffer it is a view "
                "of): is its row stride read?",
            )
        v = self._heads(qkv[:, (self.hq + self.hk) * d :])
        changed = (v != self.v).reshape(v.shape[0], self.hv, -1).any(-1)
        if bool(changed.any()):
            token, head = (int(i) for i in changed.nonzero()[0])
            raise ReturnedWrong(
                "qkv",
                f"the target wrote into v's heads of {self._name('qkv')} ({self._token(token)}, v head {head}): "
                "the norm and the rotation are q's and k's",
            )
        qk = self._heads(qkv[:, : (self.hq + self.hk) * d]).to(torch.float64)
        bad = ~torch.isfinite(qk).reshape(qk.shape[0], qk.shape[1], -1).all(-1)
        if bool(bad.any()):
            token, head = (int(i) for i in bad.nonzero()[0])
            which = f"q head {head}" if head < self.hq else f"k head {head - self.hq}"
            zero = (
                " (an all-zero head: is eps added before the reciprocal square root?)" if self._padding(token) else ""
            )
            raise ReturnedWrong(
                "non-finite",
                f"{self._name('qkv')} holds a non-finite value at {self._token(token)}, {which} for finite input{zero}",
            )
        for row in [*range(self.before), *range(self.before + self.tokens, qk.shape[0])]:  # the padding tokens
            if bool((qk[row] != 0).any()):
                head = int((qk[row] != 0).reshape(qk.shape[1], -1).any(-1).nonzero()[0])
                raise ReturnedWrong(
                    "qkv",
                    f"{self._name('qkv')} holds nonzero q or k values at {self._token(row)} (head {head}): the norm "
                    "of an all-zero head is zero",
                )
        with torch.no_grad():
            for which, out, view in (
                ("q", qk[self.rows, : self.hq], q_view),
                ("k", qk[self.rows, self.hq :], k_view),
            ):
                u = _host64(self.raw[which])
                y = out.numpy() * normalization.rms(u, self.eps) / self.scale
                view.copy_(torch.from_numpy(y).reshape(view.shape).to(device=view.device, dtype=view.dtype))

    def _padding(self, row: int) -> bool:
        return not self.rows.start <= row < self.rows.stop


def stages(call, hq: int, q: torch.Tensor, k: torch.Tensor):
    """The staged call (``forms.drive``) of a fused QK-norm interface on the canonical q
    and k (views of call.x): the result lands in them."""
    if k is None:
        raise ValueError(f"--api {call.preset.name} takes q and k heads in every call")
    norm = QKNormCall(call, q, k)
    args, kwargs = call.arguments(norm.arguments())
    out = yield TargetCall(args, kwargs)
    norm.finish(q, k)  # first: q and k may be copies of the canonical views, written back next
    call._after()
    whole = hq < call.x.shape[2]
    return (call.x if whole else call.x[:, :, :hq]), out
