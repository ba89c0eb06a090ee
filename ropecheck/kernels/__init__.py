"""ropecheck's own kernels: a fused Triton RoPE (``apply_rope``), verified by the suite.

Importing this package does not import triton; ``apply_rope`` does, on first use, through
``triton_env.import_triton`` (which picks the interpreter on machines without CUDA).
"""


def __getattr__(name):
    if name == "apply_rope":
        from ropecheck.kernels.rope import apply_rope

        return apply_rope
    raise AttributeError(name)
