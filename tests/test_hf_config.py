"""``--hf-config PATH`` (ropecheck/session/hf_config.py): the convention transformers reads of
a model's config.json, as ropecheck's flags. For each config of tests/data/hf_configs/
(README.md there says where each comes from):

(a) the flags it prints are the ones written here by hand (the user guide's table);
(b) a run with it gives the verdicts a run with those hand-written flags gives, on a correct
    kernel of the model and on the kernel of a neighbouring convention (the base doubled);
(c) transformers' own rotary module, built from the config object, passes under it.

And the usage errors: a missing file, bad JSON, an unknown rope_type, several layer types
and no --layer-type, flags that contradict the config (exit 2, one line, no traceback).
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import pytest
from click.testing import CliRunner

import ropecheck
from ropecheck.cli import main
from ropecheck.properties.convention import Convention
from ropecheck.reference.scaling import Scaling
from ropecheck.reference.scaling import parse as parse_scaling
from ropecheck.session.hf_config import HFConfig, read
from ropecheck.session.options import parse
from ropecheck.session.spec import hf_config_line
from tests import hf_config_kernels as kernels
from tests import p_rope_kernels
from tests import real_config_kernels as real

DATA = Path(__file__).with_name("data") / "hf_configs"
# in-process: the kernels are plain torch (a worker is not what these tests are about)
FAST = dict(profile="ci", max_examples=4, dtypes="float32", in_process=True)


@dataclass(frozen=True)
class Model:
    file: str
    line: str  # the flags --hf-config prints, after its "--hf-config PATH [--layer-type T] = "
    flags: dict  # the same convention written by hand (ropecheck.check keywords)
    correct: Callable  # a correct kernel of it
    broken: Callable  # the kernel of a neighbouring convention
    layer_type: Optional[str] = None
    module: tuple = ()  # transformers' rotary module: (model folder, rotary class, applier)
    extra: dict = field(default_factory=dict)  # the applier's way (interleaved output, layer type, positions)


def doubled_base(flags: dict) -> Callable:
    """The kernel of the hand-written 1-D convention with its base doubled."""
    scaling = flags.get("scaling")
    conv = Convention(
        flags["layout"],
        2 * float(flags["base"]),
        flags.get("rotary_dim"),
        parse_scaling(scaling if isinstance(scaling, str) else json.dumps(scaling)) if scaling else Scaling(),
        flags.get("rotated_fraction", 1.0),
    )
    return kernels.convention_kernel(conv)


PHI3_FLAGS = dict(
    layout="half",
    base="10000",
    rotary_dim=96,
    scaling={
        "rope_type": "longrope",
        "short_factor": kernels.PHI3_SCALING["short_factor"],
        "long_factor": kernels.PHI3_SCALING["long_factor"],
        "original_max_position_embeddings": 4096,
        "max_position_embeddings": 131072,
    },
)
P_ROPE_FLAGS = dict(layout="half", base="1000000", rotary_dim=512, rotated_fraction=0.25)
QWEN3_FLAGS = dict(layout="half", base="1000000", rotary_dim=128)

MODELS = {
    "llama-3.1-8b": Model(
        "llama-3.1-8b.json",
        "--layout half --base 500000 --rotary-dim 128 --scaling "
        "llama3:factor=8,low_freq_factor=1,high_freq_factor=4,original_max_position_embeddings=8192",
        real.CONFIGS["llama31"],
        real.llama31,
        doubled_base(real.CONFIGS["llama31"]),
        module=("llama", "LlamaRotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "qwen2-vl-7b-instruct": Model(
        "qwen2-vl-7b-instruct.json",
        "--family mrope --sections 16,24,24 --layout half --base 1e+06",
        real.CONFIGS["qwen2vl_mrope_vllm"],
        real.qwen2vl_mrope_vllm,
        functools.partial(real.qwen2vl_mrope_vllm, base=2000000.0),
        module=("qwen2_vl", "Qwen2VLRotaryEmbedding", "apply_rotary_pos_emb"),
        extra=dict(mrope=True),
    ),
    "qwen3-8b": Model(
        "qwen3-8b.json",
        "--layout half --base 1e+06 --rotary-dim 128",
        QWEN3_FLAGS,
        kernels.qwen3_8b,
        doubled_base(QWEN3_FLAGS),
        module=("qwen3", "Qwen3RotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "gemma-3-global": Model(
        "gemma-3-4b-it.json",
        "--layout half --base 1e+06 --rotary-dim 256 --scaling linear:factor=8",
        real.CONFIGS["gemma3_global"],
        real.gemma3_global,
        doubled_base(real.CONFIGS["gemma3_global"]),
        layer_type="full_attention",
        module=("gemma3", "Gemma3RotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "gemma-3-local": Model(
        "gemma-3-4b-it.json",
        "--layout half --base 10000 --rotary-dim 256",
        real.CONFIGS["gemma3_local"],
        real.gemma3_local,
        doubled_base(real.CONFIGS["gemma3_local"]),
        layer_type="sliding_attention",
        module=("gemma3", "Gemma3RotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "deepseek-v3": Model(
        "deepseek-v3.json",
        "--layout interleaved --base 10000 --rotary-dim 64 --scaling "
        "yarn:factor=40,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,mscale=1,mscale_all_dim=1,"
        "truncate=True",
        real.CONFIGS["deepseek_v3_yarn"],
        real.deepseek_v3_yarn,
        doubled_base(real.CONFIGS["deepseek_v3_yarn"]),
        module=("deepseek_v3", "DeepseekV3RotaryEmbedding", "apply_rotary_pos_emb_interleave"),
    ),
    "gpt-oss-20b": Model(
        "gpt-oss-20b.json",
        "--layout half --base 150000 --rotary-dim 64 --scaling "
        "yarn:factor=32,original_max_position_embeddings=4096,beta_fast=32,beta_slow=1,truncate=False",
        real.CONFIGS["gpt_oss_yarn"],
        real.gpt_oss_yarn,
        doubled_base(real.CONFIGS["gpt_oss_yarn"]),
        module=("gpt_oss", "GptOssRotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "phi-3-mini-128k": Model(
        "phi-3-mini-128k-instruct.json",
        "--layout half --base 10000 --rotary-dim 96 --scaling "
        + json.dumps(PHI3_FLAGS["scaling"], separators=(",", ":")),
        PHI3_FLAGS,
        kernels.phi3_mini_128k,
        doubled_base(PHI3_FLAGS),
        module=("phi3", "Phi3RotaryEmbedding", "apply_rotary_pos_emb"),
    ),
    "p-rope": Model(
        "gemma4-proportional.json",
        "--layout half --base 1e+06 --rotary-dim 512 --rotated-fraction 0.25",
        P_ROPE_FLAGS,
        p_rope_kernels.p_rope,
        p_rope_kernels.p_rope_as_partial_rotary,
        layer_type="full_attention",
        module=("gemma4", "Gemma4TextRotaryEmbedding", "apply_rotary_pos_emb"),
    ),
}


def hf_keywords(model: Model) -> dict:
    out: dict = {"hf_config": str(DATA / model.file)}
    return out if model.layer_type is None else {**out, "layer_type": model.layer_type}


def statuses(report) -> dict:
    return {(r.property, r.dtype, r.mode): r.status for r in report.results}


# --- (a) the flags printed ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_flags_printed_are_the_hand_written_ones(name):
    model = MODELS[name]
    options = parse("check", hf_keywords(model), door="api")
    chosen = f" --layer-type {model.layer_type}" if model.layer_type else ""
    assert hf_config_line(options) == f"--hf-config {DATA / model.file}{chosen} = {model.line}"
    # and they are the hand-written convention: the same options, parsed
    by_hand = parse("check", model.flags, door="api")
    assert given(options) == given(by_hand)


def given(options) -> dict:
    """The family parameters given (a switch left off is not given)."""
    return {k: v for k, v in options.parameters().items() if v is not False}


def test_the_header_is_one_line_with_the_flags():
    model = MODELS["llama-3.1-8b"]
    path = str(DATA / model.file)
    args = ["--hf-config", path, "--property", "reference", "--max-examples", "1"]
    args += ["--profile", "ci", "--dtype", "float32"]
    out = CliRunner().invoke(main, ["check", f"{kernels.__file__}:qwen3_8b", *args])
    assert out.exit_code == 1, out.output  # a Qwen3 kernel under Llama 3.1's convention
    assert f"Convention: --hf-config {path} = {model.line}\n" in out.output


def test_a_longrope_config_s_factor_lists_are_abridged_in_the_header():
    model = MODELS["phi-3-mini-128k"]
    args = ["--hf-config", str(DATA / model.file), "--property", "identity", "--max-examples", "1"]
    out = CliRunner().invoke(main, ["check", f"{kernels.__file__}:phi3_mini_128k", *args, "--profile", "ci",
                                    "--dtype", "float32", "--in-process"])  # fmt: skip
    assert out.exit_code == 0, out.output
    header = next(line for line in out.output.splitlines() if line.startswith("Convention: --hf-config"))
    assert header.count("(38 more)") == 2 and len(header) < 700, header  # 48 factors each: 10 shown


# --- (b) the same verdicts as the hand-written flags ---------------------------------------------


# The correct kernels of the configs whose run holds nothing the others' do not (every property
# of the 1-D family passes) run under `pytest -m slow`: the project's test command keeps the
# broken kernel of every config (the same statuses, failures included, end to end), the correct
# kernels with skipped properties (Phi-3's LongRoPE) or another family (Qwen2-VL's M-RoPE), the
# flags of every config in (a), and transformers' own module of every config passing in (c).
SAME_VERDICTS_IN_CI = {"phi-3-mini-128k", "qwen2-vl-7b-instruct"}
SAME_VERDICTS = [
    pytest.param(name, kind, marks=[pytest.mark.slow] if kind == "correct" and name not in SAME_VERDICTS_IN_CI else [])
    for name in sorted(MODELS)
    for kind in ("correct", "broken")
]


@pytest.mark.parametrize("name, kind", SAME_VERDICTS, ids=[f"{p.values[0]}-{p.values[1]}" for p in SAME_VERDICTS])
def test_the_same_verdicts_as_the_hand_written_flags(name, kind):
    model = MODELS[name]
    kernel = getattr(model, kind)
    with_config = ropecheck.check(kernel, **FAST, **hf_keywords(model))
    by_hand = ropecheck.check(kernel, **FAST, **model.flags)
    assert with_config.verdict == ("passed" if kind == "correct" else "failed"), with_config.summary()
    assert statuses(with_config) == statuses(by_hand)


# --- (c) transformers' own module passes under --hf-config --------------------------------------


def hf_module(model: Model):
    """rope(x, positions) made of transformers' rotary module and applier for the model's
    config, the config object built from the config.json (AutoConfig.for_model, no hub)."""
    transformers = pytest.importorskip("transformers")
    from ropecheck.adapters.hf_real import _rotated

    raw = json.loads((DATA / model.file).read_text())
    config = transformers.AutoConfig.for_model(**raw).get_text_config()
    folder, rotary, applier = model.module
    modeling = importlib.import_module(f"transformers.models.{folder}.modeling_{folder}")
    emb = getattr(modeling, rotary)(config)
    apply = getattr(modeling, applier)
    head = read(DATA / model.file).resolve(model.layer_type)
    width = head.flags.get("rotary_dim") or 2 * sum(head.flags["sections"])
    if folder == "gemma4":  # apply_rotary_pos_emb(x, cos, sin): one tensor
        apply = functools.partial(lambda one, q, k, cos, sin: (one(q, cos, sin), None), apply)
    if model.layer_type is not None:
        return _rotated(apply, width)(lambda q, p: emb(q, p, model.layer_type))
    if model.extra.get("mrope"):
        return _rotated(apply, width)(lambda q, p: emb(q, p.permute(2, 0, 1)))
    return _rotated(apply, width, applier.endswith("interleave"))(emb)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_own_module_passes_under_its_config(name):
    model = MODELS[name]
    report = ropecheck.check(hf_module(model), **FAST, **hf_keywords(model))
    assert report.passed, report.summary()


# --- usage errors ------------------------------------------------------------------------------


def check_cli(*args) -> tuple[int, str]:
    out = CliRunner().invoke(main, ["check", f"{kernels.__file__}:qwen3_8b", "--dtype", "float32", *args])
    return out.exit_code, out.output


def error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


def write(tmp_path, text: str, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_missing_file_is_a_usage_error(tmp_path):
    code, output = check_cli("--hf-config", str(tmp_path / "nothing.json"))
    assert code == 2 and "no such file" in error_line(output)
    code, output = check_cli("--hf-config", str(tmp_path))
    assert code == 2 and "is a folder without a config.json" in error_line(output)


def test_a_model_folder_is_read_through_its_config_json(tmp_path):
    write(tmp_path, (DATA / "qwen3-8b.json").read_text())
    options = parse("check", {"hf_config": str(tmp_path)}, door="api")
    assert options.rotary_dim == 128 and options.base == 1e6


def test_bad_json_is_a_usage_error(tmp_path):
    code, output = check_cli("--hf-config", write(tmp_path, '{"rope_theta": 10000,'))
    assert code == 2 and "is not JSON" in error_line(output)
    code, output = check_cli("--hf-config", write(tmp_path, "[1, 2]"))
    assert code == 2 and "not a model config object" in error_line(output)


def test_an_unknown_rope_type_is_a_usage_error(tmp_path):
    config = {"head_dim": 64, "rope_parameters": {"rope_type": "spiral", "rope_theta": 10000.0}}
    code, output = check_cli("--hf-config", write(tmp_path, json.dumps(config)))
    assert code == 2 and "unknown rope_type 'spiral'" in error_line(output)


def test_malformed_values_are_usage_errors(tmp_path):
    for config, said in (
        ({"head_dim": 64, "rope_theta": "big"}, "rope_theta must be a number"),
        ({"head_dim": 63}, "not a positive even number"),
        ({"rope_theta": 10000.0}, "gives no head_dim"),
        ({"head_dim": 64, "rope_scaling": {"rope_type": "llama3", "factor": 8}}, "needs low_freq_factor"),
        ({"head_dim": 128, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24]}}, "turns 2 x 40 = 80"),
    ):
        code, output = check_cli("--hf-config", write(tmp_path, json.dumps(config)))
        assert code == 2 and said in error_line(output), config


def test_several_layer_types_need_layer_type():
    code, output = check_cli("--hf-config", str(DATA / "gemma-3-4b-it.json"))
    line = error_line(output)
    assert code == 2 and "full_attention, sliding_attention" in line and "--layer-type" in line
    code, output = check_cli("--hf-config", str(DATA / "gemma-3-4b-it.json"), "--layer-type", "global")
    assert code == 2 and "has no layer type global" in error_line(output)
    code, output = check_cli("--layer-type", "full_attention")
    assert code == 2 and "--hf-config" in error_line(output)


@pytest.mark.parametrize(
    "flags, said",
    [
        (("--base", "10000"), "--base 10000 contradicts"),
        (("--layout", "interleaved"), "--layout interleaved contradicts"),
        (("--rotary-dim", "64"), "which gives --rotary-dim 128"),
        (("--scaling", "linear:factor=2"), "which gives no --scaling"),
        (("--rotated-fraction", "0.5"), "--rotated-fraction 0.5 contradicts"),
        (("--family", "xpos"), "a 1-D RoPE convention"),
    ],
)
def test_contradicting_flags_are_usage_errors(flags, said):
    code, output = check_cli("--hf-config", str(DATA / "qwen3-8b.json"), *flags)
    assert code == 2 and said in error_line(output)


def test_agreeing_flags_and_a_config_without_rope_theta(tmp_path):
    agreeing = parse("check", {"hf_config": str(DATA / "qwen3-8b.json"), "base": 1e6, "layout": "half"}, door="api")
    assert agreeing.base == 1e6
    path = write(tmp_path, json.dumps({"hidden_size": 512, "num_attention_heads": 8}))
    assert parse("check", {"hf_config": path}, door="api").base == 10000.0  # transformers' default_theta
    given = parse("check", {"hf_config": path, "base": 5e5}, door="api")  # the flag gives what the config left
    assert given.base == 5e5 and "base" in given.keywords()
    with pytest.raises(ValueError, match="contradicts"):
        ropecheck.check(kernels.qwen3_8b, hf_config=str(DATA / "qwen3-8b.json"), rotary_dim=64)


def test_the_reproduce_line_gives_hf_config_not_its_flags():
    options = parse("check", {"hf_config": str(DATA / "deepseek-v3.json")}, door="cli")
    assert options.words() == ["--hf-config", str(DATA / "deepseek-v3.json")]
    assert parse("check", options.keywords(), door="api").parameters() == options.parameters()


# --- how transformers reads what the files here do not show ------------------------------------


def resolved(config: dict, layer_type=None):
    return HFConfig("config.json", config).resolve(layer_type)


def test_gemma3_older_form_reads_as_its_layer_types():
    """Gemma-3-1B's published config: rope_theta and rope_local_base_freq, no per-layer dict."""
    config = {"model_type": "gemma3_text", "head_dim": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
              "rope_scaling": None}
    assert resolved(config, "sliding_attention").flags == {"layout": "half", "base": 10000.0, "rotary_dim": 256}
    assert resolved(config, "full_attention").flags == {"layout": "half", "base": 1e6, "rotary_dim": 256}


def test_partial_rotary_and_the_other_pairings():
    glm = {"model_type": "glm4", "head_dim": 128, "partial_rotary_factor": 0.5, "rope_theta": 10000.0}
    assert resolved(glm).flags == {"layout": "interleaved", "base": 10000.0, "rotary_dim": 64}
    half_mla = {"qk_rope_head_dim": 64, "head_dim": 192, "rope_interleave": False, "rope_theta": 10000.0}
    assert resolved(half_mla).flags["layout"] == "half" and resolved(half_mla).flags["rotary_dim"] == 64


def test_yarn_factor_and_dynamic_length_as_transformers_takes_them():
    yarn = {"head_dim": 64, "max_position_embeddings": 32768, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 4096}}
    scaling = parse_scaling(resolved(yarn).flags["scaling"])
    assert scaling.factor == 8.0 and scaling.beta_fast == 32 and scaling.truncate is True
    dynamic = {"head_dim": 64, "max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2}}
    assert parse_scaling(resolved(dynamic).flags["scaling"]).max_position_embeddings == 4096


def test_the_rope_parameters_match_transformers_own_reading():
    """Each file's rope_theta and rotary dimension as transformers' config object and rope
    init function give them (the frequencies of its module's inv_freq)."""
    transformers = pytest.importorskip("transformers")
    import numpy as np

    for name, model in sorted(MODELS.items()):
        raw = json.loads((DATA / model.file).read_text())
        text = transformers.AutoConfig.for_model(**raw).get_text_config()
        folder, rotary, _ = model.module
        emb = getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), rotary)(text)
        inv = getattr(emb, f"{model.layer_type}_inv_freq" if model.layer_type else "inv_freq").double().numpy()
        options = parse("check", hf_keywords(model), door="api")
        if options.family == "mrope":
            theta = Convention("half", options.base).theta(2 * sum(options.sections))
        else:
            conv = Convention(options.layout, options.base, options.rotary_dim,
                              options.scaling_parsed or Scaling(),
                              options.rotated_fraction or 1.0)
            theta = conv.theta(options.rotary_dim)
        assert np.allclose(inv, theta, rtol=1e-6, atol=0), name


def test_the_options_keep_the_resolved_config():
    options = parse("check", {"hf_config": str(DATA / "gemma-3-4b-it.json"), "layer_type": "full_attention"},
                    door="api")
    config = options.hf_config
    assert config.layer_type == "full_attention" and options.derived == set(config.flags)
    assert replace(config, flags={}).spec() == str(DATA / "gemma-3-4b-it.json")


# --- the pytest plugin -------------------------------------------------------------------------

pytest_plugins = ["pytester"]

QWEN3_KERNEL = '''
import torch


def rope(x, positions):
    """Qwen3-8B's rotation: rotate_half over head 128 at base 1e6, the rest passed through."""
    inv = 1.0 / (1000000.0 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
    angles = positions.float()[..., None] * inv
    emb = torch.cat((angles, angles), dim=-1)[:, :, None, :]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    r = x[..., :128]
    half = torch.cat((-r[..., 64:], r[..., :64]), dim=-1)
    return torch.cat((r * cos + half * sin, x[..., 128:]), dim=-1)
'''


def test_the_pytest_plugin_takes_it(pytester):
    pytester.makepyfile(qwen3=QWEN3_KERNEL)
    (pytester.path / "config.json").write_text((DATA / "qwen3-8b.json").read_text())
    pytester.makeini("[pytest]\nrope_hf_config = config.json\n")  # the ini option, relative to the ini file
    args = ("--pyargs", "ropecheck.properties", "--rope-target", "qwen3.py:rope", "--rope-dtype", "float32",
            "--rope-profile", "ci", "--rope-max-examples", "3", "-p", "no:cacheprovider")
    result = pytester.runpytest_subprocess(*args, "-k", "reference")
    result.assert_outcomes(passed=1)
    refused = pytester.runpytest_subprocess(*args, "--rope-hf-config", "config.json", "--rope-base", "10000")
    assert refused.ret != 0 and "--rope-base 10000 contradicts --rope-hf-config config.json" in refused.stderr.str()


# --- (d) what serving stacks got wrong of a config: each slip fails under the model's config -------

SLIPS = [  # (kernel, config, layer type, passes): the model's kernel passes, each slip of it fails
    ("phi2", "phi-2.json", None, True),
    ("phi2_partial_twice", "phi-2.json", None, False),  # partial_rotary_factor applied twice (vLLM PRs #41185, #29966)
    ("phi2_partial_over_head", "phi-2.json", None, False),  # wired to the wrong dimension (the same PRs)
    ("laguna_yarn", "laguna-yarn-attention-factor.json", None, True),
    ("laguna_yarn_default_mscale", "laguna-yarn-attention-factor.json", None, False),  # vLLM PR #46280
    ("gemma3_local_with_global_base", "gemma-3-4b-it.json", "sliding_attention", False),
    ("gemma3_global_unscaled", "gemma-3-4b-it.json", "full_attention", False),
]


@pytest.mark.parametrize("name, file, layer_type, passes", SLIPS, ids=[s[0] for s in SLIPS])
def test_a_serving_stacks_slip_of_a_config_fails_under_it(name, file, layer_type, passes):
    chosen = {"layer_type": layer_type} if layer_type else {}
    report = ropecheck.check(getattr(kernels, name), hf_config=str(DATA / file), **FAST, **chosen)
    assert report.passed == passes, report.summary()
