"""What the checks need of a target, declared here so that the laws never import the
harness that runs them (``ropecheck.targets`` and ``ropecheck.calling`` implement it).

- The *call forms*: how one canonical call f(x, positions) is made of a target's own
  signature. Every check speaks the canonical form (x (batch, seq, heads, head_dim),
  positions int64 (batch, seq), or (batch, seq, n_axes) for N-D RoPE); the calling layer
  turns it into the target's form and its outputs back.
- :class:`Subject`: what a check reads of a target (its declared convention and
  capabilities) and how it gets a :class:`Rope`, the callable that calls the target under
  the contract.
- the library interface a target is called through (``--api``) is the interfaces layer's
  (``properties.interfaces.interface``): a Subject names it, the checks read it.
- :class:`CallError` and :class:`TargetHung`: the two ways a call can end other than with
  a result; both are findings about the target.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import numpy as np

CALL_FORMS = {
    "x": "rope(x, positions) -> y",
    "qk": "rope(q, k, positions) -> (q_out, k_out)",
    "packed": "rope(x, cu_seqlens, positions) -> y",
    "segments": "build_positions(segments) -> array (tokens, n_axes)",
    "table": "build(positions) -> (cos, sin)",
    "cache": "build(max_position) -> cos_sin_cache",
    # diffusers' applier: tables ropecheck makes from the declared N-D rotation
    "diffusers": "apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1|-2, sequence_dim=1|2) -> y",
    # an N-D rotation's table builder: ropecheck applies the tables it returns
    "builder": "build(positions (S, n_axes)) -> (cos, sin) each (S, D), or complex (S, D/2)",
}
# positional arguments of each form (a loader checks a target's signature with them)
ARITY = {"x": 2, "qk": 3, "packed": 3, "segments": 1, "table": 1, "cache": 1, "diffusers": 2, "builder": 1}
# the forms that take tensors to rotate (the others: builders of positions or of tables)
TENSOR_FORMS = ("x", "qk", "packed")
# the forms fed tables made from a declared N-D rotation (the N-D families' only)
APPLIER_FORMS = ("diffusers",)
# the N-D rotation's table builders: ropecheck applies the tables they return
BUILDER_FORMS = ("builder",)
# the forms called with the batch's one row of positions (S, n_axes): tables the batch shares
ROW_FORMS = APPLIER_FORMS + BUILDER_FORMS
# the forms the rotation checks call with x (a builder through ropecheck's own applier)
ROTATING_FORMS = TENSOR_FORMS + ROW_FORMS
# the forms whose backward is the target's (a builder's tables are applied by ropecheck)
DIFFERENTIABLE_FORMS = TENSOR_FORMS + APPLIER_FORMS


def check_call(call: str) -> str:
    if call not in CALL_FORMS:
        raise ValueError(f"unknown call form {call!r}; known: {', '.join(CALL_FORMS)}")
    return call


def segment_lengths(positions) -> tuple:
    """Sequence lengths of a packed row whose sequences are not known: a new one starts
    where a position is not its predecessor + 1."""
    p = np.asarray(positions, dtype=np.int64).reshape(-1)
    if p.size == 0:
        return ()
    starts = np.flatnonzero(np.diff(p) != 1) + 1
    edges = np.concatenate(([0], starts, [p.size]))
    return tuple(int(n) for n in np.diff(edges))


class TargetHung(BaseException):
    """A call did not return within the time limit. A BaseException so that neither the
    target's own ``except Exception`` nor hypothesis' shrinking swallows it."""

    def __init__(self, seconds: float, message: str = ""):
        super().__init__(message or f"the target did not return within {seconds:g} s")
        self.seconds = seconds
        self.case = ""  # the input it hung on, described (set by the runner)


class CallError(Exception):
    """The target broke the call contract: it raised, crashed, or returned something
    unusable. ``kind`` says which (raised, crashed, exited, type, shape, dtype, ...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Rope(Protocol):
    """The target as a check calls it: in the canonical form, under the contract (a breach
    raises CallError, a hang TargetHung). ``case`` is the input being checked (its q/k
    split and sequences shape the calls on its tensors); ``timeout`` the time limit of one
    call; ``state_changes`` the process-wide state the target changed so far. For a
    table-fed interface, ``table_sign=-1`` feeds it the table of -m (R_m^T)."""

    case: Any
    timeout: Optional[float]
    state_changes: list

    def __call__(self, *args, case=None, table_sign: int = 1) -> Any: ...

    def vjp(self, x, positions, grad) -> Any: ...


class Subject(Protocol):
    """A target as the checks see it: its declared convention and capabilities."""

    name: str
    call: str  # its call form (CALL_FORMS)
    convention: Any  # its family's convention (None: spec-free checks only)
    n_axes: int  # position axes (1 for 1-D RoPE)
    coordinates: Any  # N-D: the coordinates it takes (properties.nd.coordinates; None: token indices)
    head_dims: tuple  # head sizes it accepts (() any even head size)
    rotary_dim: Optional[int]  # rotated features (the head sizes it accepts are >= it)
    dtypes: tuple
    backward: bool
    inplace: bool
    max_position: Optional[int]  # largest position (per axis) it accepts
    k_optional: bool  # qk: takes k=None
    row_offsets: bool  # takes per-row offsets: positions are offset + arange(seq) per row
    device: str  # where its inputs are made
    mode: str  # how it is run (eager, compile, ...)
    interface: Any  # its library interface (properties.interfaces.interface.Interface; None: its call form)
    cp_size: int  # context-parallel ranks its interface's calls are split across (1: none)

    def caller(self, timeout: Optional[float]) -> Rope: ...
