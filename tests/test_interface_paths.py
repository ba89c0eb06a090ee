"""Every path of a real interface (issue 41): bugs that live in one combination of argument
values, in a library's own convention or past a size switch fail at the default profile,
in float32 and bfloat16, with a finding that names the argument or the size; the correct
kernels beside them, written as production code is (flattened token-heads, per-sequence
loops, raw storage, gathers), pass. Every --api run says which pairs of argument classes
it called (the table's last line, the JSON), and prints no list longer than a line.

The kernels are tests/path_kernels.py; the reference property carries the interface's plan
and the size switches, so these runs check it alone."""

from __future__ import annotations

import json
import re

import pytest

from ropecheck.properties import size_switches
from ropecheck.properties.assertions import CheckFailure
from ropecheck.properties.inputs.cases import Case
from tests.test_cli import check as cli_check

KERNELS = "tests/path_kernels.py"
# --in-process: plain torch kernels, whose tensors a worker would be sent and send back each call
DEFAULT = ["--layout", "half", "--dtype", "float32,bfloat16", "--property", "reference", "--seed", "7", "--in-process"]

CORRECT = [
    ("flash_varlen_correct", ["--api", "flash-attn"]),
    ("hf_rows_correct", ["--api", "hf"]),
    ("vllm_rows_correct", ["--api", "vllm", "--rotary-dim", "32"]),
    ("sglang_kv_slot0_correct", ["--api", "sglang-kvcache"]),
    ("te_rows_correct", ["--api", "te"]),
]


@pytest.mark.parametrize("name, flags", CORRECT, ids=[c[0] for c in CORRECT])
def test_a_correct_kernel_written_as_production_code_passes(name, flags):
    result = cli_check(f"{KERNELS}:{name}", *flags, *DEFAULT)
    assert result.exit_code == 0, result.output
    assert re.search(r"interface paths: (\d+)/\1 pairs of argument classes in every column", result.output), (
        result.output
    )


# (kernel, flags, words the failure must hold: the argument, the class or the size at fault)
BROKEN = [
    # per-sequence offsets collapsed to the first with cu_seqlens (TransformerEngine PR #536, Megatron-LM PR #412)
    ("flash_varlen_first_offset", ["--api", "flash-attn"], ["seqlen_offsets", "cu_seqlens"]),
    # the single-token fast path rotates batch row 0 only (MLX #3494)
    ("hf_decode_batch0", ["--api", "hf"], ["tokens=decode"]),
    # a fused path above 10240 token-heads, wrong only with partial rotary (vLLM #51049)
    (
        "vllm_warp_chunk_partial",
        ["--api", "vllm", "--rotary-dim", "32"],
        ["size switch: fails from 1280 tokens x 8 heads (10240 token-heads), passes at 1279"],
    ),
    ("flash_inplace_ignored", ["--api", "flash-attn"], ["inplace=True was passed, but x does not hold"]),
    ("hf_cos_per_row", ["--api", "hf"], ["cos rows=(1, s, D)"]),
    ("te_thd_first_start", ["--api", "te"], ["start_positions", "tensor_format=thd"]),
]


@pytest.mark.parametrize("name, flags, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_bug_in_one_path_of_an_interface_fails_and_is_named(name, flags, words, tmp_path):
    record = tmp_path / "run.json"
    result = cli_check(f"{KERNELS}:{name}", *flags, *DEFAULT, "--json", str(record))
    assert result.exit_code == 1, result.output
    data = json.loads(record.read_text())
    failed = {r["dtype"] for r in data["results"] if r["status"] == "failed"}
    assert failed == {"float32", "bfloat16"}, result.output
    text = " ".join(result.output.split())
    for word in words:
        assert word in text, text
    for line in result.output.splitlines():  # a line carries no list of more than a few numbers
        assert len(re.findall(r"-?\d+(?:\.\d+)?", line)) <= 80, line


def test_the_te_buffer_of_start_positions_is_not_the_batch():
    """TransformerEngine's inference passes an int32 buffer of max_batch_size start
    positions, longer than the batch: a kernel that takes its length for the batch fails."""
    result = cli_check("tests/preset_kernels.py:te_buffer_as_batch", "--api", "te", *DEFAULT)
    assert result.exit_code == 1, result.output
    assert "start_positions=longer buffer" in " ".join(result.output.split())


def test_every_api_run_records_the_pairs_it_called(tmp_path):
    record = tmp_path / "run.json"
    result = cli_check(f"{KERNELS}:hf_rows_correct", "--api", "hf", *DEFAULT, "--json", str(record))
    assert result.exit_code == 0, result.output
    assert "│ interface paths" in result.output
    paths = json.loads(record.read_text())["interface_paths"]
    assert set(paths) == {"float32", "bfloat16"}
    for column in paths.values():
        assert column["covered"] == column["pairs"] == len(column["covered_pairs"]) > 100
        assert not column["missing"]
        assert all(len(pair) == 2 for pair in column["covered_pairs"])


def test_a_class_the_run_cannot_reach_is_named():
    result = cli_check(f"{KERNELS}:te_rows_correct", "--api", "te", "--call", "x", *DEFAULT)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "not reached: tensor_format=thd (--call x was asked for)" in text, text
    assert "fused=True (the target has no fused parameter" in text, text
    assert "context parallel=N ranks (--cp-size N checks context parallelism)" in text, text


def test_a_context_parallel_run_calls_every_pair_of_its_own_classes():
    result = cli_check("tests/cp_kernels.py:te_cp_correct", "--api", "te", "--cp-size", "2", *DEFAULT)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert re.search(r"interface paths: (\d+)/\1 pairs of argument classes in every column", text), text
    assert "context parallel=1 rank (--cp-size 2 splits every call)" in text, text


# --- the boundary of a size switch -----------------------------------------------------


def _size(count: int) -> size_switches.SizeInput:
    make = size_switches.partial(size_switches._sequences, "float32", "x", heads=8, head_dim=8, seed=1)
    return size_switches.SizeInput(make(count), f"{count * 8} token-heads", make, count, 8, "x token-heads")


def _check_failing(rule):
    def check(case: Case, **extras):
        tokens = case.seq
        wrong = rule(tokens)
        if wrong is not None:
            raise CheckFailure("wrong", 5.0, {"batch": 0, "seq": wrong, "head": 0})

    return check


def test_a_switch_is_searched_down_to_its_boundary():
    found = size_switches.boundary(_size(2048), _check_failing(lambda n: 0 if n >= 1280 else None), 1024)
    assert found is not None
    assert found.sentence == "size switch: fails from 1280 tokens x 8 heads (10240 token-heads), passes at 1279 (10232 token-heads)"
    assert found.case.seq == 1280


def test_a_single_wrong_token_is_not_a_switch():
    """Only the token the boundary input adds is wrong: a position's bug, not the path's."""
    assert size_switches.boundary(_size(2048), _check_failing(lambda n: n - 1 if n >= 1300 else None), 1024) is None


def test_a_failure_from_one_token_is_not_a_switch():
    assert size_switches.boundary(_size(64), _check_failing(lambda n: 0), 0) is None


def test_the_switch_inputs_cross_the_usual_points_in_every_call_form():
    sizes = size_switches.inputs("float32", None, ("x", "packed"), 2**24)
    crossed = {(s.case.call, s.crosses) for s in sizes}
    for call in ("x", "packed"):
        assert (call, "10240 token-heads") in crossed and (call, "a sequence of 65537 tokens") in crossed
    assert all(s.case.shape[2] * s.count in (s.heads * s.count,) for s in sizes)
    assert size_switches.untried(65535).startswith("size switches: a sequence past 65535 tokens not tried")


def test_a_large_failing_input_is_searched_for_its_switch():
    """A drawn input past a switch (a production run's) is cut token by token: the failure
    becomes the switch's boundary, not an input hypothesis cannot shrink below it."""
    case = Case("float32", 3, 2048, 8, 8, tuple(tuple(range(2048)) for _ in range(3)), call="qk", k_heads=1)
    size = size_switches.from_case(case)
    assert size is not None and size.count == 2048 and size.heads == 9 and size.rows == 3
    found = size_switches.boundary(size, _check_failing(lambda n: 0 if 3 * n * 9 >= 10240 else None), 0)
    assert found is not None and found.case.seq == 380 and found.case.positions[2][-1] == 379
    assert found.sentence == (
        "size switch: fails from 3 rows of 380 tokens x 9 heads (10260 token-heads), passes at 379 (10233 token-heads)"
    )
    assert size_switches.from_case(Case("float32", 1, 64, 2, 8, (tuple(range(64)),))) is None  # too small


def test_a_size_switch_input_is_tried_and_timed_by_the_target_s_speed():
    """The first inputs are tried whatever the budget, but not where one call would take
    an eighth of --timeout (the Triton interpreter: flash-attn's kernel took about 25 s at 2^14
    token-heads, and under load hung at its limit); a tried input's limit is at least 4
    times its predicted time."""
    from ropecheck.properties.runner import SLACK, call_time_limit, size_tried

    assert size_tried(True, predicted=0.5, spent=10.0, budget=3.0, timeout=20.0)  # over the budget: still tried
    assert not size_tried(True, predicted=3.5, spent=0.0, budget=3.0, timeout=20.0)  # a call too slow
    assert size_tried(True, predicted=25.0, spent=0.0, budget=3.0, timeout=0)  # no time limit
    assert not size_tried(False, predicted=2.0, spent=2.0, budget=3.0, timeout=20.0)
    assert size_tried(False, predicted=1.0, spent=2.0, budget=3.0, timeout=20.0)
    small = Case("float32", 1, 4, 1, 8, ((0, 1, 2, 3),))
    assert call_time_limit(20.0, small) == 20.0
    assert call_time_limit(20.0, small, predicted=8.0) == SLACK * 8.0
    assert call_time_limit(None, small, predicted=8.0) is None


def test_a_large_input_s_limit_follows_the_speed_the_checks_measured():
    """flash-attn's kernel under the interpreter: the backward of 2048 tokens x 8 heads of
    8 took past its 40 s limit on a 2-core machine and the run said "hung" on a right
    kernel; the checks before it had measured its speed per head vector. A large input's
    limit is SLACK times that speed per row of its own, within SPEED_ALLOWANCE times the
    size-scaled limit; a fast target's limit is the size-scaled one."""
    from ropecheck.properties.runner import MEASURED_ROWS, SLACK, SPEED_ALLOWANCE, Seen, call_time_limit

    large = Case("bfloat16", 1, 2048, 8, 8, (tuple(range(2048)),))  # 16384 rows, 131072 elements
    scaled = call_time_limit(20.0, large)
    assert scaled == 40.0
    assert call_time_limit(20.0, large, rate=1e-5) == scaled  # fast: 0.16 s predicted
    assert call_time_limit(20.0, large, rate=1e-3) == SLACK * 1e-3 * 16384  # slow: 65.5 s
    assert call_time_limit(20.0, large, rate=1.0) == SPEED_ALLOWANCE * scaled  # a bound even so
    assert call_time_limit(None, large, rate=1e-3) is None
    seen = Seen()
    seen.measured(5.0, MEASURED_ROWS - 1)  # too few rows: the call's fixed costs, not its speed
    assert seen.rate == 0.0
    seen.measured(0.36, 72)
    seen.measured(0.1, 72)  # the slowest so far stays
    assert seen.rate == 0.005
