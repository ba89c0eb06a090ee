"""--device: inputs made on the device with their host layout (sizes, strides, storage
offset, shared storages), only values back, and a clear exit 2 where the device is missing.
CI has no GPU: the plumbing is tested on cpu and, for layouts, on the meta device; on a
machine with CUDA the tests marked for it run the same paths there."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ropecheck
from ropecheck.calling import devices

ROOT = Path(__file__).resolve().parents[1]
from ropecheck.kernels.triton_env import triton_missing
from ropecheck.calling.execution import Execution, Request
from tests.test_cli import FP32, check

pytest_plugins = ["pytester"]

HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")


@pytest.mark.parametrize("device", ["meta", "cpu"] + (["cuda"] if HAS_CUDA else []))
def test_placement_keeps_the_host_layout_and_shared_storage(device):
    qkv = torch.randn(2, 5, 8, 16)
    q, k = qkv[:, :, :4], qkv[:, :, 4:6].transpose(1, 2)  # q and k: views of one fused storage
    place = devices.Placement(device)
    on_q, on_k = place(q), place(k)
    assert on_q.device.type == device and on_k.device.type == device
    for here, there in ((q, on_q), (k, on_k)):
        assert (there.shape, there.stride(), there.storage_offset()) == (here.shape, here.stride(),
                                                                          here.storage_offset())
    assert on_q.untyped_storage().nbytes() == qkv.untyped_storage().nbytes()
    if device != "meta":
        assert on_q.untyped_storage().data_ptr() == on_k.untyped_storage().data_ptr()  # still one storage
        assert torch.equal(on_q.cpu(), q) and torch.equal(on_k.cpu(), k)
        on_q.zero_()  # a private copy: the host tensor is untouched
        assert qkv.abs().sum() > 0


@pytest.mark.parametrize("given, canonical", [("cpu", "cpu"), ("CPU", "cpu"), ("cuda", "cuda:0"),
                                              ("cuda:1", "cuda:1")])
def test_device_names(given, canonical):
    assert devices.parse(given) == canonical


@pytest.mark.parametrize("given", ["tpu", "meta", "cuda:x", ""])
def test_bad_device_names(given):
    with pytest.raises(ValueError, match="--device must be cpu, cuda or cuda:N"):
        devices.parse(given)


def test_the_device_a_target_runs_on():
    assert devices.choose(None, ("cpu", "cuda")) == "cpu"
    assert devices.choose(None, ("cuda",)) == "cuda:0"  # a CUDA-only kernel: its own device
    assert devices.choose("cuda:1", ("cpu", "cuda")) == "cuda:1"
    with pytest.raises(ValueError, match="runs on cuda only"):
        devices.choose("cpu", ("cuda",))


def test_the_call_sees_the_device_tensor_and_values_come_back():
    seen = {}

    def rope(x, positions):
        seen.update(device=x.device, stride=x.stride(), positions=positions.device)
        return x * 2

    x = torch.randn(2, 6, 3, 8).transpose(1, 2)  # a transposed view
    outcome = Execution(rope).run(Request("call", (x,), torch.zeros(2, 3, dtype=torch.int64), device="cpu"))
    assert seen == {"device": torch.device("cpu"), "stride": x.stride(), "positions": torch.device("cpu")}
    assert outcome.error is None and torch.equal(outcome.outputs, x * 2)


def test_an_output_on_another_device_is_a_contract_finding():
    outcome = Execution(lambda x, positions: x.to("meta")).run(
        Request("call", (torch.randn(1, 2, 1, 8),), torch.zeros(1, 2, dtype=torch.int64)))
    assert outcome.error == ("device", "output on meta, input on cpu")


@no_cuda
def test_a_missing_device_is_exit_2_with_the_reason(tmp_path):
    record = tmp_path / "r.json"
    result = check("rotate-half", "--device", "cuda", *FP32, "--json", str(record))
    assert result.exit_code == 2, result.output
    assert "--device cuda:0: no CUDA device here" in result.output
    assert "torch.cuda.is_available() is False" in json.loads(record.read_text())["reason"]
    report = ropecheck.check("rotate-half", device="cuda", dtypes=["float32"])
    assert report.verdict == "unusable" and "no CUDA device here" in report.summary()
    family = check("llama-complex", "--family", "axial", "--axes", "1", "--layout", "interleaved",
                   "--device", "cuda:0", *FP32)
    assert family.exit_code == 2 and "no CUDA device here" in family.output


def test_a_target_declaring_cuda_only(tmp_path):
    kernel = tmp_path / "cuda_kernel.py"
    kernel.write_text(textwrap.dedent('''
        from ropecheck.targets.builtins import make_rotate_half
        from ropecheck.targets.target import Convention, Target

        rope = Target("cuda-kernel", make_rotate_half(), Convention("half"), devices=("cuda",))
    '''))
    result = check(f"{kernel}:rope", "--device", "cpu", *FP32)
    assert result.exit_code == 2
    assert "runs on cuda only" in result.output
    if not HAS_CUDA:  # its own device, which this machine lacks
        result = check(f"{kernel}:rope", *FP32)
        assert result.exit_code == 2 and "no CUDA device here" in result.output


def test_cpu_by_name_gives_the_default_verdict(tmp_path):
    record = tmp_path / "r.json"
    result = check("rotate-half", "--device", "cpu", *FP32, "--property", "reference", "--json", str(record))
    assert result.exit_code == 0, result.output
    assert json.loads(record.read_text())["device"] == "cpu"


@cuda_only
@pytest.mark.parametrize("name", ["rotate-half", "llama-complex", "matrix", "cached"])
def test_builtins_pass_on_cuda(name):
    result = check(name, "--device", "cuda", *FP32, "--profile", "ci")
    assert result.exit_code == 0, result.output
    assert "inputs on cuda:0" in result.output


@no_cuda
def test_pytest_without_the_device_is_a_usage_error(pytester):
    pytester.makefile(".toml", pyproject='[tool.pytest.ini_options]\nrope_target = "rotate-half"\n'
                                         'rope_device = "cuda"\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--device cuda:0: no CUDA device here" in result.stderr.str()


@pytest.mark.parametrize("device", ["meta"] + (["cuda"] if HAS_CUDA else []))
def test_placement_copies_a_tensor_already_on_the_device(device):
    """A q/k split made on the device (the qk form's separate tensors) is copied there:
    the storage is viewed on its own device (found on an H100: CUDA inputs failed every
    qk check with 'Attempted to set the storage of a tensor on device cpu to a storage on
    cuda:0'; meta stands in for it on CPU)."""
    x = torch.randn(2, 5, 8, 16, device=device).transpose(1, 2)
    copy = devices.strided_copy(x)
    assert copy.device == x.device
    assert (copy.shape, copy.stride(), copy.storage_offset()) == (x.shape, x.stride(), x.storage_offset())


def test_placement_ignores_the_ambient_default_device():
    """Code run under `with torch.device(...)` (or torch.set_default_device) still gets
    copies on the device asked for (found on an H100 under `with torch.device('cuda')`)."""
    x = torch.randn(2, 3, 4)
    with torch.device("meta"):
        copy = devices.Placement("cpu")(x)
    assert copy.device.type == "cpu" and torch.equal(copy, x)


@pytest.mark.parametrize("name", ["rotate-half", "llama-complex", "matrix"])
def test_builtins_keep_to_the_input_s_device(name):
    """The torch built-ins run wherever their input is (meta stands in for CUDA here; on an
    H100 llama-complex failed every call: its amplitude, a CPU tensor, met CUDA angles in
    torch.polar; matrix built its matrix on the CPU). `cached` reads its largest position,
    which meta tensors do not hold: its tables are made per device, tested on CUDA."""
    from ropecheck.targets.builtins import builtin

    x = torch.empty(1, 4, 2, 8, device="meta")
    y = builtin(name).fn(x, torch.zeros(1, 4, dtype=torch.int64, device="meta"))
    assert y.device.type == "meta" and y.shape == x.shape


def test_a_library_module_an_adapter_keeps_lives_on_its_inputs_device():
    """``per_head_dim``: one module per head size and device, moved there as a model moves
    its modules (``module.to(device)``)."""
    from ropecheck.adapters.registry import per_head_dim

    made = []

    def make(head_dim):
        module = torch.nn.Module()
        module.register_buffer("inv_freq", torch.ones(head_dim // 2))
        made.append(module)
        return module

    get = per_head_dim(make)
    assert get(8).inv_freq.device.type == "cpu" and get(8) is get(8)
    on_meta = get(8, torch.device("meta"))
    assert on_meta.inv_freq.device.type == "meta" and on_meta is get(8, "meta")
    assert len(made) == 2


FLASH_ATTN_MODULES = ["flash-attn-rotary", "flash-attn-rotary-offsets"]


@pytest.mark.parametrize("name", FLASH_ATTN_MODULES)
def test_flash_attn_s_rotary_module_is_asked_for_on_its_inputs_device(name, monkeypatch):
    """On an H200 every flash-attn-rotary* check failed its first call: the adapters kept
    RotaryEmbedding on the CPU (its inv_freq buffer) and flash-attn built its table on the
    input's device from it ("Expected all tensors to be on the same device"). Here the
    modules are asked for with the device of the inputs (CPU tensors, the interpreter)."""
    from ropecheck.adapters import ADAPTERS, registry, triton_kernels

    adapter = ADAPTERS[name]
    if adapter.why_unavailable():
        pytest.skip(adapter.why_unavailable())
    asked = []

    def spy(make):
        get = registry.per_head_dim(make)

        def asking(head_dim, device=None):
            asked.append(device)
            return get(head_dim, device)

        return asking

    monkeypatch.setattr(triton_kernels, "per_head_dim", spy)
    rope = adapter.build()
    if name == "flash-attn-rotary":  # packed: x (total, heads, head_dim), cu_seqlens, positions
        rope(torch.randn(6, 2, 8), torch.tensor([0, 2, 6], dtype=torch.int32), torch.tensor([0, 1, 0, 1, 2, 3]))
    else:  # q, k (batch, seq, heads, head_dim), positions: offset + arange per row
        rope(torch.randn(2, 3, 2, 8), torch.randn(2, 3, 1, 8), torch.arange(3).repeat(2, 1))
    assert asked and all(device is not None and torch.device(device).type == "cpu" for device in asked), asked


FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.arange, torch.tensor, torch.randn,
             torch.rand, torch.randint, torch.linspace, torch.eye, torch.empty_strided, torch.as_tensor}


# the correct kernels of ci/gpu-run.sh's presets step (one per library interface)
GPU_RUN_PRESETS = [("tests/path_kernels.py:vllm_rows_correct", "vllm"),
                   ("tests/preset_kernels.py:flashinfer_cache_correct", "flashinfer-cos-sin-cache"),
                   ("tests/preset_kernels.py:pos_ids_correct", "flashinfer-pos-ids"),
                   ("tests/path_kernels.py:flash_varlen_correct", "flash-attn"),
                   ("tests/path_kernels.py:hf_rows_correct", "hf"),
                   ("tests/path_kernels.py:te_rows_correct", "te"),
                   ("tests/preset_kernels.py:megatron_correct", "megatron"),
                   ("tests/serving_kernels.py:vllm_kv_correct", "vllm-kvcache"),
                   ("tests/path_kernels.py:sglang_kv_slot0_correct", "sglang-kvcache")]


def test_the_harness_names_the_device_of_every_tensor_it_makes():
    """ropecheck's own tensors do not depend on the default device: run in-process under
    `with torch.device("cuda")` (a user's test, torch.set_default_device), tensors made
    without a device landed on CUDA beside CPU ones and every check errored (found on an
    H100). A TorchFunctionMode lists factory calls without a device made by the harness
    (properties/, reference/, ropecheck/calling, session; not a target's own code)."""
    from torch.overrides import TorchFunctionMode

    from ropecheck.properties.checks import PROPERTIES
    from ropecheck.properties.runner import RunOptions, run_property
    from ropecheck.targets.builtins import builtin

    harness = [str(p) for p in (Path(ropecheck.__file__).parent / d for d in
                                ("properties", "reference", "calling", "session"))]
    harness += [str(Path(p).resolve()) for p in harness]
    implicit: set = set()

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in FACTORIES and kwargs.get("device") is None:
                frame = sys._getframe(1)
                while frame is not None and f"{os.sep}torch{os.sep}" in frame.f_code.co_filename:
                    frame = frame.f_back
                if frame is not None and frame.f_code.co_filename.startswith(tuple(harness)):
                    implicit.add(f"{frame.f_code.co_filename}:{frame.f_lineno} torch.{func.__name__}")
            return func(*args, **kwargs)

    runs = [("rotate-half", list(PROPERTIES))]  # every property in the x form; qk and packed: their plumbing
    runs += [] if triton_missing() else [("triton-qk", ["contract"]), ("triton-packed", ["contract"])]
    for name, properties in runs:
        target = builtin(name)
        for prop in map(PROPERTIES.get, properties):
            if prop.applies_to(target)[0]:
                with Spy():
                    run_property(prop, target, "float32", RunOptions(profile="ci", max_examples=2, timeout=60))
    # every preset's plan rows, KV-cache checks and size switches (the reference property
    # carries them), with the kernels ci/gpu-run.sh's presets step calls on a GPU: theirs too
    # must make every tensor on their input's device
    harness += [str(ROOT / "tests" / name) for name in ("path_kernels.py", "preset_kernels.py", "serving_kernels.py")]
    for kernel, api in GPU_RUN_PRESETS:
        with Spy():
            report = ropecheck.check(kernel, api=api, layout="half", in_process=True,
                                     dtypes="float32", properties="reference", max_examples=2, timeout=60)
        assert report.exit_status == 0, report
    assert not implicit, sorted(implicit)


@pytest.mark.parametrize("kernel, verdict", [("hf_rows_correct", 0), ("hf_writes_around", 1)])
def test_the_storage_around_a_view_is_read_where_the_target_wrote_it(monkeypatch, kernel, verdict):
    """A preset's tensors are views into wider storage (padded rows, fused qkv), and what the
    target wrote around them is read from its storage. Copied off a device, a view is its
    elements alone: on an H200 every padded or qkv-slice call through hf, flash-attn,
    megatron and te ended the worker (storages of two sizes compared). Here the host copy
    is made as a device's is (a clone: the view's elements, compact)."""
    from ropecheck.calling import execution

    def as_off_a_device(value):
        return value.clone() if isinstance(value, torch.Tensor) else devices.to_host(value)

    monkeypatch.setattr(execution, "to_host", as_off_a_device)
    report = ropecheck.check(f"tests/path_kernels.py:{kernel}", api="hf", layout="half", in_process=True,
                             dtypes="float32", properties="contract", timeout=60)
    assert report.exit_status == verdict, report
    if verdict:
        (failed,) = [r for r in report.results if r.status == "failed"]
        assert "wrote outside the tensors it was given" in failed.message, failed.message


def test_an_error_of_ropecheck_s_own_in_the_worker_is_an_internal_error(tmp_path):
    """ropecheck's code around a call failing in the worker (the storage comparison above,
    on an H200) is ropecheck's error (exit status 2, "internal error"), as in-process,
    not a crash of the target's. Planted by a target module that breaks that code in the
    process that imports it: the worker."""
    from tests.test_cli import check

    planted = tmp_path / "breaks_ropecheck.py"
    planted.write_text(
        "import ropecheck.calling.execution as execution\n"
        "from tests.path_kernels import hf_rows_correct as rope  # noqa: F401\n\n\n"
        "def _broken(original, copy):\n"
        "    raise RuntimeError('storages of two sizes compared')\n\n\n"
        "execution._written_outside = _broken\n"
    )
    result = check(f"{planted}:rope", "--api", "hf", "--layout", "half", "--dtype", "float32",
                   "--property", "contract", "--max-examples", "2")
    assert result.exit_code == 2, result.output
    assert "internal error" in result.output and "storages of two sizes compared" in result.output, result.output
    assert "the target ended the process" not in result.output
