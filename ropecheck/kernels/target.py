"""The Triton kernel as built-in targets under the canonical contract rope(x, positions).

Importing this module does not import triton: the factories do, so ``ropecheck list`` and
the other built-ins work without it, and the targets say why they are unavailable."""

from __future__ import annotations

from ropecheck.kernels.triton_env import triton_missing

_WHY_NOT = triton_missing()


def description(layout: str) -> str:
    text = f"fused Triton kernel ({layout} layout), angles reduced in float64"
    return text + (f"; unavailable: {_WHY_NOT}" if _WHY_NOT else "")  # no [..]: rich markup


def factory(layout: str):
    """A BUILTINS factory (base, rotary_dim) -> rope(x, positions) for ``layout``."""

    def make(base: float = 10000.0, rotary_dim=None, scaling=None):
        if scaling is not None and scaling.rope_type != "default":
            raise ValueError("the built-in Triton kernel has no position scaling")
        if _WHY_NOT:
            raise ValueError(f"the built-in Triton target is unavailable: {_WHY_NOT}")
        from ropecheck.kernels.rope import apply_rope
        from ropecheck.kernels.triton_env import interpreted

        def rope(x, positions):
            if x.device.type == "cpu" and not interpreted():
                # compiled kernels need CUDA tensors: the suite's CPU inputs make the round trip
                y = apply_rope(x.cuda(), positions=positions.cuda(), layout=layout, base=base,
                               rotary_dim=rotary_dim)
                return y.cpu()
            return apply_rope(x, positions=positions, layout=layout, base=base,
                              rotary_dim=rotary_dim)

        return rope

    return make


# name -> (layout, factory, description), as ropecheck.builtins.BUILTINS holds them
BUILTIN_ENTRIES = {name: (layout, factory(layout), description(layout))
                   for name, layout in (("triton", "half"), ("triton-interleaved", "interleaved"))}
