"""Context parallelism (``--cp-size N``, issue 26): a kernel written to TransformerEngine's
or Megatron-Core's signature is called on every rank with its local tensor, as those
libraries split a sequence (each padded to a multiple of 2N, in 2N chunks, rank r holding
chunks r and 2N - 1 - r); every correct kernel passes and every defect of the split fails,
in float32 and bfloat16, with the rank and the chunk named."""

from __future__ import annotations

import numpy as np
import pytest

import ropecheck
from ropecheck.properties.interfaces.context_parallel import Split
from tests import cp_kernels
from tests.test_cli import check as cli_check
from tests.test_presets import CORRECT_DRAWS

KERNELS = "tests/cp_kernels.py"
DTYPES = "float32,bfloat16"
QUICK = ["contract", "reference", "table-inverse"]


def run(name, api: str, properties=QUICK, **options):
    options.setdefault("layout", "half")
    options.setdefault("dtypes", DTYPES)
    options.setdefault("cp_size", 2)
    target = f"{KERNELS}:{name}" if isinstance(name, str) else name
    return ropecheck.check(target, api=api, properties=properties, in_process=True, **options)


def test_the_split_is_the_load_balanced_one_transformer_engine_uses():
    split = Split(2, (5, 8, 0))
    assert split.padded == (8, 8, 0)
    assert split.local_tokens(0).tolist() == [0, 1, 6, 7, 8, 9, 14, 15]
    assert split.local_tokens(1).tolist() == [2, 3, 4, 5, 10, 11, 12, 13]
    assert split.real_tokens().tolist() == [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15]
    assert [(i, k, r) for i, k, r, _, _ in split.pieces()][:4] == [(0, 0, 0), (0, 1, 1), (0, 2, 1), (1, 0, 0)]


CORRECT = [
    ("te_cp_correct", "te", {}),
    ("te_cp_correct", "te", {"call": "packed"}),
    ("te_cp_correct", "te", {"call": "packed", "cp_size": 3, "layout": "interleaved"}),
    ("te_cp_correct", "te", {"cp_size": 4, "rotary_dim": 8}),
    ("megatron_cp_correct", "megatron", {"call": "packed"}),
    ("megatron_cp_correct", "megatron", {}),
]


@pytest.mark.parametrize("name, api, options", CORRECT, ids=[f"{a}-{n}-{o}" for n, a, o in CORRECT])
def test_a_correct_kernel_under_context_parallelism_passes(name, api, options):
    report = run(name, api, max_examples=CORRECT_DRAWS, **options)  # (tests/test_presets.py says why)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]


def test_its_backward_runs_under_context_parallelism_too():
    report = run("te_cp_correct", "te", properties=["backward"], call="packed")
    assert report.passed and report.results, [(r.property, r.dtype, r.message) for r in report.failures]


@pytest.mark.parametrize("call, formats", [("x", {"sbhd", "bshd"}), ("packed", {"thd"})])
def test_every_rank_is_called_with_its_local_tensor_in_every_format(call, formats):
    seen = []

    def kernel(
        t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False, cu_seqlens=None, cp_size=1, cp_rank=0
    ):
        seen.append((tensor_format, cp_size, cp_rank, start_positions))
        if tensor_format == "thd":  # global padded cu_seqlens, the local tensor cu_seqlens[-1] / N tokens
            lengths = np.diff(cu_seqlens.tolist())
            assert t.shape[0] == int(cu_seqlens[-1]) // cp_size and not (lengths % (2 * cp_size)).any()
        else:
            assert t.shape[0 if tensor_format == "sbhd" else 1] % 2 == 0
        return cp_kernels.te_cp_correct(
            t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank
        )

    report = run(kernel, "te", properties=["reference"], call=call, dtypes="float32")
    assert report.passed, [(r.property, r.message) for r in report.failures]
    assert {f for f, _, _, _ in seen} == formats
    assert {(n, r) for _, n, r, _ in seen} == {(2, 0), (2, 1)}
    assert all(s is None for _, _, _, s in seen)  # TransformerEngine refuses start_positions under cp


# (kernel, preset, options, words the diagnosis must hold)
BROKEN = [
    ("te_cp_second_chunk_as_first", "te", {}, "rank 0, chunk 3 (tokens 12..15 of batch rows 0, 1) rotated as positions 0..3"),
    ("te_cp_second_chunk_as_first", "te", {"call": "packed"}, "rank 0, chunk 3 (tokens 12..15 of sequence 0) rotated as positions 0..3"),
    ("te_cp_second_chunk_as_first", "te", {"call": "packed", "cp_size": 3}, "rank 0, chunk 5 (tokens 20..23 of sequence 0) rotated as positions 0..3"),
    ("te_cp_thd_sequence0_offsets", "te", {"call": "packed"}, "rank 0, chunk 3 (tokens 6..7 of sequence 1) rotated as positions 12..13"),
    ("te_cp_ignored", "te", {}, "rank 1, chunk 1 (tokens 4..7 of batch rows 0, 1) rotated as positions 0..3"),
    ("te_cp_ignored", "te", {"call": "packed"}, "rank 1, chunk 1 (tokens 4..7 of sequence 0) rotated as positions 0..3"),
    ("megatron_cp_sequence0_rows", "megatron", {"call": "packed"}, "rank 0, chunk 0 (tokens 0..1 of sequence 1) rotated as positions 0..1 (its positions are 100..101)"),
]  # fmt: skip


@pytest.mark.parametrize("name, api, options, words", BROKEN, ids=[f"{b[0]}-{b[2]}" for b in BROKEN])
def test_a_defect_of_the_split_fails_with_its_rank_and_chunk_named(name, api, options, words):
    report = run(name, api, properties=["reference"], **options)
    failed = {r.dtype for r in report.failures if r.property == "reference"}
    assert failed == {"float32", "bfloat16"}, [(r.property, r.dtype, r.status) for r in report.results]
    for failure in report.failures:
        assert words in failure.diagnosis, failure.diagnosis
        assert f"cp_size={options.get('cp_size', 2)}" in failure.reproduce  # (the API's reproduce line)


def test_a_kernel_writing_into_its_local_tensor_modifies_the_callers_input():
    report = run("te_cp_writes_input", "te", properties=["contract"], dtypes="float32")
    assert [r.property for r in report.failures] == ["contract"]
    assert "modified its input x in place" in report.failures[0].message


@pytest.mark.parametrize("name", ["megatron-core-apply-rotary-pos-emb-packed", "megatron-core-apply-rotary-pos-emb"])
def test_megatron_cores_own_apply_rotary_pos_emb_passes_on_two_ranks(name):
    pytest.importorskip("megatron.core")
    report = ropecheck.check(name, cp_size=2, dtypes=DTYPES, properties=["reference"], in_process=True)
    assert report.passed, [(r.property, r.dtype, r.message) for r in report.failures]


@pytest.mark.parametrize(
    "flags, words",
    [
        (["tests/preset_kernels.py:vllm_correct", "--api", "vllm"], "--api vllm's signature fn(positions"),
        ([], "the target is called with no --api"),
    ],
)
def test_cp_size_is_exit_2_where_no_interface_takes_it(flags, words):
    result = cli_check(*flags, "--layout", "half", "--cp-size", "2")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "(--api te, megatron)" in text and words in text, text
