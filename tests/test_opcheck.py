"""--opcheck (issue 45, item 3): torch.library.opcheck on the custom ops a target is or calls,
with the arguments the checks' calls pass them. The kernels (tests/custom_op_kernels.py) are
correct RoPEs whose registration alone is broken, or not: every broken one is caught, as
one finding per op and test with the input that showed it, and the correct ones pass with
no finding; under --mode compile, a graph break in a fullgraph compile is a finding naming
the op (or the target's code) and dynamo's reason."""

from __future__ import annotations

import pytest
import torch

import ropecheck
from ropecheck.calling import modes, opcheck
from ropecheck.calling.caller import Caller
from ropecheck.calling.execution import Outcome, Request
from ropecheck.calling.forms import Form
from ropecheck.properties.core.contract import TargetHung
from ropecheck.properties.runner import Result
from ropecheck.session import opcheck_row
from ropecheck.session.options import parse
from ropecheck.session.prepare import prepare
from tests import custom_op_kernels as kernels
from tests.test_cli import check as cli_check

KERNELS = "tests.custom_op_kernels"  # one module name: its ops are registered once per process


def run(name: str, properties=("contract",), **options):
    options.setdefault("layout", "half")
    return ropecheck.check(f"{KERNELS}:{name}", opcheck=True, dtypes="float32", properties=list(properties), **options)


def row(report, mode: str = "eager") -> Result:
    return next(r for r in report.results if r.property == opcheck_row.NAME and r.mode == mode)


def found(report, mode: str = "eager") -> dict:
    """(op, test) -> the finding's record, of the opcheck row of ``mode``."""
    return {(f["op"], f["test"]): f for f in row(report, mode).input.get("findings", [])}


def only_opcheck_failed(report) -> None:
    assert report.exit_status == 1
    others = [(r.property, r.mode, r.message) for r in report.failures if r.property != opcheck_row.NAME]
    assert others == [], "the math is right: only the registration may fail"


# --- broken registrations are caught ------------------------------------------------------


@pytest.mark.parametrize("name", ["rope_strided_fake", "rope_strided_packet"], ids=["OpOverload", "OpOverloadPacket"])
def test_a_fake_whose_strides_differ_from_the_kernels_fails_on_a_strided_input(name):
    report = run(name)  # the op itself is the target
    only_opcheck_failed(report)
    findings = found(report)
    assert list(findings) == [("ropecheck_test::rope_strided", "test_faketensor")]
    finding = findings[("ropecheck_test::rope_strided", "test_faketensor")]
    assert "Stride mismatch" in finding["message"] and len(finding["message"]) <= opcheck.MESSAGE_WIDTH
    assert "strides (" in finding["args"], "the input that showed it is a strided one"
    assert 0 < finding["inputs"] < finding["tried"], "contiguous inputs pass: only the drawn layouts show it"
    r = row(report)
    assert not r.shrunk and r.counterexample.startswith("ropecheck_test::rope_strided(x (")
    assert "opcheck=True" in r.reproduce and "properties=['contract']" in r.reproduce  # the API's reproduce line


def test_an_in_place_op_without_its_mutation_annotation_is_caught_through_vllms_interface():
    report = run("vllm_unannotated", api="vllm")
    only_opcheck_failed(report)
    finding = found(report)[("ropecheck_test::vllm_rope_unannotated", "test_schema")]
    assert "is not defined as mutable but was mutated" in finding["message"]
    assert "query (" in finding["args"] and "head_size=" in finding["args"]  # named as the schema names them
    assert "interface classes" in finding["call"]  # the call's argument classes


def test_an_output_that_aliases_its_input_unannounced_is_caught():
    report = run("rope_aliasing", inplace=True, backward=False)
    only_opcheck_failed(report)
    findings = found(report)
    assert "not defined to alias output" in findings[("ropecheck_test::rope_aliasing", "test_schema")]["message"]
    assert "alias" in findings[("ropecheck_test::rope_aliasing", "test_faketensor")]["message"]
    assert row(report).message.startswith("2 findings, one per op and test")


def test_a_wrapper_calling_a_broken_op_is_caught_through_the_wrapper():
    report = run("strided_wrapper")  # a Python function calling the op's packet
    only_opcheck_failed(report)
    assert list(found(report)) == [("ropecheck_test::rope_strided", "test_faketensor")]


def test_an_opcheck_run_that_ends_the_process_is_a_finding_not_a_crash_of_ropecheck():
    report = run("rope_fake_exits", backward=False)
    only_opcheck_failed(report)
    finding = found(report)[("(the target's ops)", "opcheck")]
    assert "opcheck's run failed" in finding["message"] and "exit status 3" in finding["message"]
    assert finding["tried"] == 1 and "no later call followed" in finding["message"], "one process lost, not one a call"


def test_an_opcheck_run_that_hangs_is_a_finding_with_the_call():
    class Hangs:  # an executor whose opcheck runs never return
        state_changes: list = []

        def run(self, request):
            if request.op == "opcheck":
                raise TargetHung(1.0, "the target did not return within 1 s")
            return Outcome(outputs=request.args[0].clone())

    caller = Caller(Hangs(), opcheck=True)
    caller(torch.randn(1, 2, 1, 8), torch.zeros(1, 2, dtype=torch.int64))
    ((checked,),) = [c.checked for c in caller.opchecks]
    assert checked.test == "opcheck" and "did not finish" in checked.message and caller.opchecks[0].call


# --- correct ones pass --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, options, properties",
    [
        ("rope_op", {}, ("contract", "backward")),  # a custom_op function, its autograd used
        ("vllm_op", {"api": "vllm"}, ("contract",)),  # an OpOverload, in place with mutates_args
    ],
    ids=["custom-op", "vllm-in-place"],
)
def test_a_correctly_registered_op_passes_with_no_finding(name, options, properties):
    report = run(name, properties, **options)
    assert report.passed, [(r.property, r.message) for r in report.failures]
    r = row(report)
    assert r.status == "passed" and "every opcheck test passed on" in r.message, r.message


def test_a_target_with_no_custom_op_gets_a_note_not_a_failure():
    report = run("plain_rope")
    assert report.passed
    r = row(report)
    assert r.status == "skipped" and "called no custom op" in r.message
    assert "opcheck: the target called no custom op" in report.summary()


# --- under --mode compile -----------------------------------------------------------------


def test_a_graph_break_is_counted_and_under_fullgraph_a_finding_at_the_targets_code():
    report = run("rope_jit_loaded", modes=["compile"])
    only_opcheck_failed(report)
    ((op, test), finding), *others = found(report, "compile").items()
    assert others == [], "the op itself is correct"
    assert test == opcheck.FULLGRAPH and "_load_extension" in op and "import_module" in finding["message"]
    assert any(m.startswith(modes.GRAPH_BREAK) for m, _ in report.session.compile_notes)
    assert "torch.compile broke the graph" in report.summary()


def test_an_op_without_a_fake_breaks_the_graph_at_the_op():
    report = run("rope_no_fake", modes=["compile"], backward=False)
    only_opcheck_failed(report)
    findings = found(report, "compile")
    fullgraph = findings[("ropecheck_test::rope_no_fake", opcheck.FULLGRAPH)]
    assert "Operator does not support running with fake tensors" in fullgraph["message"]
    assert ("ropecheck_test::rope_no_fake", "test_faketensor") in findings


def test_a_correct_op_compiles_whole_with_no_finding():
    report = run("rope_op", modes=["compile"])
    assert report.passed, [(r.property, r.message) for r in report.failures]
    assert "traced the" in row(report, "compile").message


# --- the front doors ----------------------------------------------------------------------


def test_the_command_line_prints_the_finding_and_exits_1():
    result = cli_check(
        f"{KERNELS}:strided_wrapper", "--layout", "half", "--opcheck", "--dtype", "float32", "--profile", "ci",
        "--property", "contract",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    text = result.output
    assert "FAILED opcheck (float32)" in text and "test_faketensor failed on" in text
    assert "first input: ropecheck_test::rope_strided(" in text and "reproduce: ropecheck check" in text
    assert max(len(line) for line in text.splitlines()) < 1200, "no line carries a screen of numbers"


def test_opcheck_does_not_apply_to_a_family_whose_targets_rotate_nothing():
    result = cli_check("hf-rope-init", "--opcheck")  # a table builder: positions in, cos and sin out
    assert result.exit_code == 2 and "--opcheck does not apply" in result.output, result.output


def test_a_pytest_process_makes_the_row_of_the_checks_it_did_not_run():
    options = parse(
        "check",
        {"target": f"{KERNELS}:rope_strided_fake", "layout": "half", "opcheck": True, "dtypes": ["float32"],
         "properties": ["contract"], "profile": "ci"},
        door="pytest",
    )  # fmt: skip
    session = prepare(options)
    try:
        assert session.rows[-1] == opcheck_row.NAME
        result = session.run_one(opcheck_row.NAME, "float32")  # contract never ran in this session
    finally:
        session.close()
    assert result.status == "failed" and "test_faketensor" in result.message
    assert "-k 'opcheck and float32'" in result.reproduce


# --- the pieces ---------------------------------------------------------------------------


def test_the_recorder_keeps_custom_op_calls_with_their_arguments_as_they_were_before():
    q = torch.randn(3, 2, 16).transpose(0, 1)[:2]  # a strided view
    k = torch.randn(2, 16)
    cache = torch.randn(8, 8)
    positions = torch.tensor([1, 2])
    before = q.clone()
    with opcheck.Recorder() as recorder:
        kernels.vllm_op(positions, q, k, 8, cache, True)  # in place
        torch.ops.ropecheck_test.rope_strided(torch.randn(1, 2, 1, 8), positions[None])  # a packet
        torch.add(q, 1)  # aten: not a custom op
        with torch.profiler.record_function("rope"):  # profiler ops: a name and a handle, nothing to check
            pass
    assert [op.name() for op, _, _ in recorder.calls] == ["ropecheck_test::vllm_rope", "ropecheck_test::rope_strided"]
    _, args, _ = recorder.calls[0]
    assert torch.equal(args[1], before) and not torch.equal(q, before), "copied before the op wrote query"
    assert args[1].stride() == q.stride() and args[1].storage_offset() == q.storage_offset()


def test_a_leaf_that_requires_grad_stays_one_unless_the_schema_says_the_op_writes_it():
    x = torch.randn(1, 2, 1, 8, requires_grad=True)
    copied, _ = opcheck.fresh(torch.ops.ropecheck_test.rope_strided.default, (x * 1, torch.zeros(1, 2)), {})
    assert copied[0].requires_grad and copied[0].is_leaf
    written, _ = opcheck.fresh(torch.ops.ropecheck_test.rope_aliasing.default, (x * 1, torch.zeros(1, 2)), {})
    assert not written[0].requires_grad


def test_a_class_of_calls_is_its_layouts_not_its_sizes():
    def key(x):
        return opcheck.call_key(Request("call", (x,), torch.zeros(x.shape[:2], dtype=torch.int64), form=Form()))

    assert key(torch.randn(2, 5, 4, 8)) == key(torch.randn(2, 7, 4, 8))  # sizes of one band (a factor of 8)
    assert key(torch.randn(2, 5, 4, 8)) != key(torch.randn(2, 4, 5, 8).transpose(1, 2))
    assert key(torch.randn(2, 5, 4, 8)) != key(torch.randn(2, 1, 4, 8)), "a decode call is a class of its own"

    def qk(x, q_heads):
        form = Form("qk", q_heads)
        return opcheck.call_key(Request("call", (x,), torch.zeros(x.shape[:2], dtype=torch.int64), form=form))

    x = torch.randn(2, 5, 6, 8)
    assert qk(x, 4) != qk(x, 5) != qk(x, 6), "GQA, MQA and no key are classes of their own"
    assert qk(x, 3) == qk(x, 4)


def _called(op: str, test: str, key: int, message: str = "", call: str = "") -> opcheck.Called:
    return opcheck.Called((op,), (opcheck.Checked(op, test, message, f"x {key}", (key,)),), call or f"call {key}")


def test_a_row_groups_one_finding_per_op_and_test_with_the_first_input_and_a_count():
    first = Result("contract", "float32", "passed", "")
    first.opchecks = [_called("ns::op", "test_schema", 1), _called("ns::op", "test_faketensor", 2, "bad strides")]
    later = Result("reference", "float32", "passed", "")
    later.opchecks = [_called("ns::op", "test_faketensor", k, "bad strides") for k in (2, 3)]
    later.opchecks += [_called("ns::op", "test_faketensor", 4)]
    made = opcheck_row.row([first, later], "float32", "eager", lambda name: f"rerun {name}")
    assert made.status == "failed" and made.signature == "opcheck: ns::op test_faketensor"
    (finding,) = made.input["findings"]
    assert (finding["inputs"], finding["tried"]) == (2, 3) and finding["call"] == "call 2"
    assert finding["property"] == "contract" and made.reproduce == "rerun contract"
    none = opcheck_row.row([Result("contract", "float32", "passed", "")], "float32", "eager", str)
    assert none.status == "skipped"


def test_dynamos_messages_in_one_line_and_the_compile_events_counted():
    said = modes.reason_line(
        "Operator does not support running with fake tensors\n  Explanation: \n  Hint: see the docs\n"
        "  Developer debug context: unsupported operator: ns.op.default\n\nfrom user code:\n  File x.py, line 3"
    )
    assert said == "Operator does not support running with fake tensors (unsupported operator: ns.op.default)"
    notes = [(modes.GRAPH_BREAK + "a break", 3), (modes.RECOMPILE + "a guard", 1), ("UserWarning: w", 2)]
    line = modes.summary(notes)
    assert line.startswith("torch.compile warned 2 times") and "; broke the graph 3 times" in line
    assert "recompiled once (most often 1x: 'a guard')" in line
    assert modes.summary(notes[:1]).startswith("torch.compile broke the graph 3 times")
