"""The project's Triton kernel compiled for real GPUs, without one (ropecheck.kernels.aot).

The Triton interpreter that runs the kernel in the other tests accepts code the compiler
rejects, and says nothing of registers or access widths. Here every specialization of
the ``ci`` scope (each dtype, layout, head size, call form and direction at least once,
with the alignment hints a real launch gets) is compiled for sm_90a, and the main path
for sm_80 too; a compile error fails the test. The main bf16 path must have no spills
and 128-bit global loads and stores (LDG.E.128 / STG.E.128 in the SASS); the
specializations that cannot are named with the reason.

Cost (2-core machine, measured): about 15 s with an empty Triton cache, 3 s with it
filled (``~/.triton/cache``; the cuobjdump readings are kept beside it)."""

from __future__ import annotations

import textwrap

import pytest

from ropecheck.kernels.triton_env import triton_missing

pytestmark = pytest.mark.skipif(triton_missing() is not None, reason=str(triton_missing()))

# Specializations whose rotated features cannot have 128-bit accesses, and why (checked
# below: each must still compile with no spills, and must really have scalar stores, or
# the reason is stale).
NARROW = {
    "interleaved": "pairs (2i, 2i+1) are read and written as two stride-2 gathers: "
                   "one element per access (16 bits in bf16/fp16, 32 in fp32)",
    "80": "head_dim 80: the second half starts at n_pairs = 40 elements, not a multiple "
          "of 16, and the toy shape's strides give no alignment",
}


def _why_narrow(name: str):
    for word, why in NARROW.items():
        if word in name.split():
            return why
    return None


@pytest.fixture(scope="module")
def aot():
    from ropecheck.kernels import aot

    return aot


@pytest.fixture(scope="module")
def results(aot):
    done = [r for case in aot.cases("ci") for r in aot.compile_case(case, "sm_90a")]
    done += aot.compile_case(aot.cases("main")[0], "sm_80")
    return done


def test_every_specialization_compiles(results, aot):
    failed = [f"{r.arch} {r.case}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    names = {r.case for r in results}
    assert len(names) == len(aot.cases("ci")), "one kernel per case (one launch each)"
    print("\n" + aot.table(results))


def test_main_path_has_wide_accesses_and_no_spills(results, aot):
    main = [r for r in results if r.case == aot.MAIN]
    assert {r.arch for r in main} == {"sm_90a", "sm_80"}
    for r in main:
        assert (r.spill_bytes, r.local_instructions) == (0, 0), r
        assert (r.widest_load, r.widest_store) == (128, 128), r
        # q, k, outputs 128-bit; int64 positions and float64 angle tables 64-bit; the k
        # tile (8 heads x 64 pairs over 128 threads) stores 4 bf16 per thread: 64-bit
        assert min(r.loads) >= 64 and min(r.stores) >= 64, r
        assert r.loads[128] >= 8, r
        assert {"q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "pos_ptr"} <= set(r.aligned), r.aligned
        assert r.constexprs["sqd"] == 1 and r.constexprs["BLOCK_P"] == 64


def test_every_specialization_has_no_spills_and_its_widths(results):
    for r in results:
        assert (r.spill_bytes, r.local_instructions) == (0, 0), r
        why = _why_narrow(r.case)
        if why is None:
            assert (r.widest_load, r.widest_store) == (128, 128), r
            assert min(r.stores) >= 64, r
        else:  # scalar stores there (a partial rotary's pass-through copy may still be wide)
            assert min(r.stores) <= 32, f"{r.case}: recorded as narrow ({why}) but is not: {r}"


def test_without_alignment_hints_the_loads_are_narrow(aot):
    """What the hints are worth (and that the width check can fail): the main path compiled
    as if no pointer were known to be 16-byte aligned and no integer divisible by 16."""
    case = aot.cases("main")[0]
    kernel = aot.compiled_kernel()
    (call,) = aot.record(case)
    launch = aot.specialize(kernel, call, 90)
    launch.attrs = {path: [] for path in launch.attrs}
    compiled = aot.compile_launch(launch, 90, kernel)
    info = aot.inspect_cubin(compiled.asm["cubin"])
    assert max(info["loads"]) < 128 and max(info["stores"]) < 128, info


def test_a_compile_error_is_a_failed_result(aot, tmp_path):
    """A kernel the interpreter runs but the compiler rejects (tl.arange over 3
    elements: not a power of two) gives ok=False with the compiler's message."""
    source = tmp_path / "bad_kernel.py"
    source.write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def bad(x_ptr, n):
            i = tl.arange(0, 3)
            tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n), mask=i < n)
    """))
    kernel = aot.compiled_module(str(source)).bad
    launch = aot.Launch(grid=(1,), signature={"x_ptr": "*fp32", "n": "i32"}, constexprs={}, attrs={},
                        options=aot.specialize(aot.compiled_kernel(), aot.record(aot.cases("main")[0])[0],
                                               90).options)
    with pytest.raises(Exception, match="power of 2|power of two"):
        aot.compile_launch(launch, 90, kernel)


def test_sass_widths():
    from ropecheck.kernels.sass import access_width, read_sass

    assert [access_width(m) for m in (".E.128", ".E.128.CONSTANT", ".E.64", ".E", ".E.U16", ".E.S8")] == [
        128, 128, 64, 32, 16, 8]
    sass = """
        /*0090*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*00a0*/                   LDG.E.64 R8, desc[UR4][R6.64] ;
        /*00b0*/                   STG.E.U16 desc[UR4][R10.64], R12 ;
        /*00c0*/                   STL [R1], R3 ;
        /*00d0*/                   LDL R3, [R1] ;
    """
    assert read_sass(sass) == {"loads": {64: 1, 128: 1}, "stores": {16: 1}, "local_instructions": 2}


def test_the_module_imports_only_ropecheck_kernels():
    from pathlib import Path

    from ropecheck.kernels import aot
    from tests.test_layering import imported_modules

    names = [name for _, name in imported_modules(Path(aot.__file__).read_text(), "ropecheck.kernels.aot")
             if name.split(".")[0] == "ropecheck"]
    assert names and all(name.startswith("ropecheck.kernels") for name in names), names


@pytest.mark.slow
def test_every_specialization_of_the_whole_scope_compiles_for_both_archs(aot):
    """Every specialization the checks and the GPU benchmarks launch (``--scope all``: 388
    kernels over sm_90a and sm_80, about 330 s on 2 cores with an empty cache): compiled,
    no spills. Under ``pytest -m slow``; `python -m ropecheck.kernels.aot` prints the table."""
    results = aot.compile_all("all")
    failed = [f"{r.arch} {r.case}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    spilled = [f"{r.arch} {r.case}" for r in results if (r.spill_bytes, r.local_instructions) != (0, 0)]
    assert not spilled, spilled


def test_the_kernel_rounds_every_operation_once(aot):
    """No fused multiply-add in the compiled kernel (launch option enable_fp_fusion=False):
    with the compiler's default contraction, offsets and explicit positions gave outputs
    one bit apart on an H100 (tests/test_triton_kernel.py asks for equal bits), and the
    interpreter, which rounds every operation, could not see it. Turning contraction back
    on puts fma instructions in the PTX, so this test can fail."""
    import dataclasses

    kernel = aot.compiled_kernel()
    (call,) = aot.record(aot.cases("main")[0])
    launch = aot.specialize(kernel, call, 90)
    assert launch.options.enable_fp_fusion is False
    assert "fma.rn" not in aot.compile_launch(launch, 90, kernel).asm["ptx"]
    launch.options = dataclasses.replace(launch.options, enable_fp_fusion=True)
    assert "fma.rn" in aot.compile_launch(launch, 90, kernel).asm["ptx"]
