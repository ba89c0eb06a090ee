"""No false alarm at the settings real models ship (issue 23): correct kernels, written as
their libraries write them (tests/real_config_kernels.py: Llama-3.1/3.2, Phi-3.5 LongRoPE,
DeepSeek-V3 and gpt-oss YaRN, Gemma 3 local and global, Qwen2-VL / Qwen2.5-VL in vLLM's and
Megatron's style, Qwen3-VL, GLM-4V, xPos), pass every check of their family in float32,
bfloat16 and float16 with the flags a user gives for each, and the spec-free checks alone
where the kernel is a plain rotation; the same checks at the same settings fail a kernel
that loses the position."""

from __future__ import annotations

from pathlib import Path

import pytest

import ropecheck
from tests.real_config_kernels import CONFIGS

KERNELS = Path(__file__).with_name("real_config_kernels.py")
DTYPES = "float32,bfloat16,float16"
FAST = dict(profile="ci", max_examples=4)

# The whole sweep is ~35 full runs at real head sizes in three dtypes (over ten minutes on
# two cores): the project's test command runs the settings whose false alarms this pins
# (Qwen2-VL's w axis at base 1e6, Gemma 3's global layers); `pytest -m slow` runs the rest,
# and the acceptance corpus (acceptance/corpus.py: hf-*, real-*) runs them all.
IN_CI = {"qwen2vl_mrope_vllm", "gemma3_global", "hf-qwen2vl-mrope-real"}


def sweep(names) -> list:
    return [name if name in IN_CI else pytest.param(name, marks=pytest.mark.slow) for name in sorted(names)]

# Plain rotations: no attention factor (Phi-3.5's and gpt-oss's scale the output, which only
# a declared convention accounts for), no switch per call (Phi-3.5's short/long factors
# depend on the call's length: batch-independence and statelessness promise nothing there).
ROTATIONS = {
    "llama31": {},
    "llama32": {},
    "deepseek_v3_yarn": {},
    "gemma3_global": {},
    "gemma3_local": {},
    "qwen2vl_mrope_vllm": dict(family="nd", axes=3, split="32,48,48"),
    "qwen2vl_mrope_megatron": dict(family="nd", axes=3, split="32,48,48"),
    "qwen3vl_mrope": dict(family="nd", axes=3, split="48,40,40"),
    "glm4v_mrope": dict(family="nd", axes=3, split="16,24,24"),
}


def _check(name: str, **flags):
    # in-process: plain torch kernels at real head sizes (256 features), whose tensors a worker
    # would be sent and send back each call; a worker is not what these tests are about
    return ropecheck.check(f"{KERNELS}:{name}", dtypes=DTYPES, in_process=True, **FAST, **flags)


@pytest.mark.parametrize("name", sweep(CONFIGS))
def test_correct_kernel_passes_at_its_real_settings(name):
    report = _check(name, **CONFIGS[name])
    assert report.passed, report.summary()


@pytest.mark.parametrize("name", sweep(ROTATIONS))
def test_spec_free_checks_pass_at_real_settings(name):
    flags = ROTATIONS[name] or dict(rotary_dim=CONFIGS[name]["rotary_dim"])
    report = _check(name, **flags)
    assert report.passed, report.summary()


@pytest.mark.parametrize(
    "name, flags",
    [
        ("qwen2vl_mrope_w_ignored", CONFIGS["qwen2vl_mrope_vllm"]),
        ("qwen2vl_mrope_w_ignored", ROTATIONS["qwen2vl_mrope_vllm"]),
        ("gemma3_global_frozen", CONFIGS["gemma3_global"]),
        ("gemma3_global_frozen", dict(rotary_dim=256)),
    ],
)
def test_invertibility_still_catches_a_lost_position_at_real_settings(name, flags):
    report = ropecheck.check(f"{KERNELS}:{name}", dtypes="bfloat16", properties="invertibility", in_process=True,
                             **FAST, **flags)
    assert report.verdict == "failed", report.summary()


HF_REAL = ["hf-llama31", "hf-llama32", "hf-phi35-longrope", "hf-deepseek-v3-yarn", "hf-gpt-oss-yarn",
           "hf-gemma3-global", "hf-gemma3-local", "hf-gemma4-global", "hf-qwen2vl-mrope-real", "hf-qwen3vl-mrope-real",
           "hf-glm4v-mrope"]


@pytest.mark.parametrize("name", sweep(HF_REAL))
def test_hf_modules_at_real_settings_pass(name):
    """HF's own rotary modules at each model's published settings (ropecheck/adapters/hf_real.py)."""
    from ropecheck.adapters import ADAPTERS

    why = ADAPTERS[name].why_unavailable()
    if why:
        pytest.skip(why)
    # in-process: a worker imported transformers' modeling code anew for each module (5 s)
    report = ropecheck.check(name, dtypes=DTYPES, in_process=True, **FAST)
    assert report.passed, report.summary()
