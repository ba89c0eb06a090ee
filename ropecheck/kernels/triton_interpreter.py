"""bfloat16 in Triton's interpreter, computed on values as a GPU computes it.

Without CUDA, Triton kernels run under its interpreter (``TRITON_INTERPRET=1``), which
holds a bfloat16 tensor as its ``uint16`` bit patterns (numpy has no bfloat16) and runs
numpy's arithmetic on them: ``a * b`` multiplies the bit patterns as integers (a kernel
that computes in bfloat16, as liger-kernel's RoPE does, returns values near 1e30),
``-a`` and ``a < b`` are wrong for negative values (bfloat16 is sign-magnitude), ``tl.max``
orders bit patterns, and a float32 value stored as bfloat16 is truncated where a GPU
rounds to nearest even. Triton's maintainers leave it so ("we just don't support it yet",
triton-lang/triton #11584, PR #10945 closed): every verdict on such a kernel in bfloat16 on
a CPU would be a false alarm.

:func:`install` wraps the interpreter's operations that read bfloat16 values (its
builder's arithmetic, comparisons, math functions, fma, dot, clamp and casts, and the
reductions and scans) so that they convert bfloat16 operands to float32, run the
interpreter's own operation on those values, and round a bfloat16 result back to
nearest even: one rounding per operation, what a GPU's ``add.rn.bf16`` / ``mul.rn.bf16``
give (an fma and a float64 cast round through float32 first, a rare extra rounding of
half a bfloat16 unit). Loads, stores, selects and bit casts keep moving bit patterns.
Operations on other dtypes are not touched. ``install`` is idempotent, and does nothing
(returns False) when Triton's interpreter does not have the names it wraps (another
Triton): its bfloat16 arithmetic then stays as that Triton computes it.
"""

from __future__ import annotations

import functools

import numpy as np

_installed = False


def to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> their float32 values (exact)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """Float values -> bfloat16 bit patterns (uint16), rounded to nearest even (torch's
    conversion; float64 through float32); NaN stays NaN, overflow gives an infinity."""
    import torch

    f32 = np.ascontiguousarray(np.asarray(values), dtype=np.float32)
    return torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _is_bf16(handle, tl) -> bool:
    dtype = getattr(handle, "dtype", None)
    return dtype is not None and getattr(dtype, "scalar", dtype) == tl.bfloat16


def _element(type_, dtype, tl):
    """``type_`` (a block type or a scalar dtype) with ``dtype`` as its element type."""
    return tl.block_type(dtype, type_.shape) if isinstance(type_, tl.block_type) else dtype


def install() -> bool:
    """Make the interpreter compute bfloat16 on values (once per process). Returns whether
    it is in place: False when this Triton's interpreter lacks a name it wraps."""
    global _installed
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp

        builder = interp.InterpreterBuilder
        handle_cls = interp.TensorHandle
        reduce_ops = interp.ReduceOps
        scan_ops = interp.ScanOps
        wrapped = {
            name: getattr(builder, name)
            for name in (
                "binary_op",
                "unary_op",
                "ternary_op",
                "create_fma",
                "create_dot",
                "create_erf",
                "create_rsqrt",
                "cast_impl",
                "create_fp_to_fp",
            )
        }
        reduce_wrapped = {name: getattr(reduce_ops, name) for name in ("min_max", "sum")}
        scan_wrapped = {name: getattr(scan_ops, name) for name in ("cumsum", "cumprod")}
        rtne = interp._ir.ROUNDING_MODE.RTNE
    except (ImportError, AttributeError):
        return False

    def values(handle):
        """A float32 handle of a bfloat16 handle's values; any other handle as it is."""
        if _is_bf16(handle, tl):
            return handle_cls(to_float32(handle.data), tl.float32)
        return handle

    def rounded(result):
        """A float32 result handle of a bfloat16 operation, back in bfloat16 bits; a
        boolean result (a comparison) as it is."""
        data = np.asarray(result.data)
        if data.dtype == np.bool_:
            return handle_cls(data, tl.bfloat16 if result.dtype == tl.float32 else result.dtype)
        return handle_cls(to_bfloat16(data), tl.bfloat16)

    def on_values(original):
        """``original`` (a builder operation; its arguments handles, or a numpy function
        that ``values`` leaves as it is) on the values of its bfloat16 operands."""

        @functools.wraps(original)
        def op(self, *args, **kwargs):
            if not any(_is_bf16(a, tl) for a in args):
                return original(self, *args, **kwargs)
            return rounded(original(self, *(values(a) for a in args), **kwargs))

        return op

    def ternary_op(self, lhs, rhs, other, op):
        # a select (np.where) moves bit patterns; a clamp (np.clip) compares values
        if op is np.where or not any(_is_bf16(h, tl) for h in (lhs, rhs, other)):
            return wrapped["ternary_op"](self, lhs, rhs, other, op)
        return rounded(wrapped["ternary_op"](self, values(lhs), values(rhs), values(other), op))

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        result = wrapped["create_dot"](self, values(a), values(b), values(d), input_precision, max_num_imprecise_acc)
        return rounded(result) if _is_bf16(d, tl) else result

    def cast_impl(self, src, dst_type):
        src_bf16, dst_bf16 = _is_bf16(src, tl), dst_type.scalar == tl.bfloat16
        if not (src_bf16 or dst_bf16) or (src_bf16 and dst_bf16):
            return wrapped["cast_impl"](self, src, dst_type)
        if dst_bf16:
            return handle_cls(to_bfloat16(src.data), tl.bfloat16)
        return wrapped["cast_impl"](self, values(src), dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        bf16 = _is_bf16(src, tl) or dst_type.scalar == tl.bfloat16
        wide = (tl.float16, tl.float32, tl.float64)
        other = dst_type.scalar if _is_bf16(src, tl) else src.dtype.scalar
        if bf16 and other in wide and (rounding_mode is None or rounding_mode == rtne):
            return cast_impl(self, src, dst_type)
        return wrapped["create_fp_to_fp"](self, src, dst_type, rounding_mode)

    def reduced(original):
        @functools.wraps(original)
        def op(self, input, *args, **kwargs):
            tensor = input[0] if isinstance(input, tuple) else input
            if not _is_bf16(tensor.handle, tl):
                return original(self, input, *args, **kwargs)
            as_values = tl.core.tensor(values(tensor.handle), _element(tensor.type, tl.float32, tl))
            out = original(self, as_values, *args, **kwargs)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            back = [
                tl.core.tensor(rounded(o.handle), _element(o.type, tl.bfloat16, tl))
                if o.handle.dtype == tl.float32
                else o
                for o in outs
            ]
            return type(out)(back) if isinstance(out, (tuple, list)) else back[0]

        return op

    for name in ("binary_op", "unary_op", "create_fma", "create_erf", "create_rsqrt"):
        setattr(builder, name, on_values(wrapped[name]))
    builder.ternary_op = ternary_op
    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    builder.create_fp_to_fp = create_fp_to_fp
    for name, original in reduce_wrapped.items():
        setattr(reduce_ops, name, reduced(original))
    for name, original in scan_wrapped.items():
        setattr(scan_ops, name, reduced(original))
    _installed = True
    return True
