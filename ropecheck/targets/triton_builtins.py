"""The Triton kernel as built-in targets: ``triton`` and ``triton-interleaved`` under the
canonical contract rope(x, positions), ``triton-qk`` (q and k in one launch) and
``triton-packed`` (varlen sequences with cu_seqlens) in the call forms of its users.

Importing this module does not import triton: the factories do, so ``ropecheck list`` and
the other built-ins work without it, and the targets say why they are unavailable."""

from __future__ import annotations

from ropecheck.kernels.triton_env import triton_missing

_WHY_NOT = triton_missing()


def description(layout: str, call: str = "x") -> str:
    text = f"fused Triton kernel ({layout} layout), angles reduced in float64"
    text += {"x": "", "qk": "; q and k in one launch", "packed": "; packed varlen (cu_seqlens)"}[call]
    return text + (f"; unavailable: {_WHY_NOT}" if _WHY_NOT else "")  # no [..]: rich markup


def factory(layout: str, call: str = "x"):
    """A BUILTINS factory (base, rotary_dim) -> the kernel's callable in ``call`` form:
    "x" rope(x, positions); "qk" rope(q, k, positions), q and k in one launch (k may be
    None); "packed" rope(x, cu_seqlens, positions) on varlen sequences, each token at its
    own absolute position (apply_rope reads ``positions`` per token when they are given)."""

    def make(base: float = 10000.0, rotary_dim=None, scaling=None):
        if scaling is not None and scaling.rope_type != "default":
            raise ValueError("the built-in Triton kernel has no position scaling")
        if _WHY_NOT:
            raise ValueError(f"the built-in Triton target is unavailable: {_WHY_NOT}")
        from ropecheck.kernels.rope import apply_rope
        from ropecheck.kernels.triton_env import interpreted

        def launch(**tensors):
            if not interpreted() and any(t is not None and t.device.type == "cpu" for t in tensors.values()):
                # compiled kernels need CUDA tensors: the suite's CPU inputs make the round trip
                out = apply_rope(
                    **{name: None if t is None else t.cuda() for name, t in tensors.items()},
                    layout=layout,
                    base=base,
                    rotary_dim=rotary_dim,
                )
                return tuple(o.cpu() for o in out) if isinstance(out, tuple) else out.cpu()
            return apply_rope(**tensors, layout=layout, base=base, rotary_dim=rotary_dim)

        def rope(x, positions):
            return launch(q=x, positions=positions)

        def rope_qk(q, k, positions):
            return launch(q=q, k=k, positions=positions)

        def rope_packed(x, cu_seqlens, positions):
            return launch(q=x, positions=positions, cu_seqlens=cu_seqlens)

        return {"x": rope, "qk": rope_qk, "packed": rope_packed}[call]

    return make


# name -> (layout, factory, description), as ropecheck.builtins.BUILTINS holds them
BUILTIN_ENTRIES = {
    name: (layout, factory(layout, call), description(layout, call))
    for name, layout, call in (
        ("triton", "half", "x"),
        ("triton-interleaved", "interleaved", "x"),
        ("triton-qk", "half", "qk"),
        ("triton-packed", "half", "packed"),
    )
}
# name -> the Target fields of a built-in not in the canonical call form
BUILTIN_FORMS: dict[str, dict] = {"triton-qk": {"call": "qk", "k_optional": True}, "triton-packed": {"call": "packed"}}
