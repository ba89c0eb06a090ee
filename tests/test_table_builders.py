"""Table builders as targets (--family table-builder, cache-builder): every correct builder
of tests/table_builder_kernels.py passes in every scaling; every broken one fails, in the
property that names its defect; usage errors exit 2 with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import ropecheck
from ropecheck.adapters import ADAPTERS
from tests import table_builder_kernels as k

KERNELS = "tests/table_builder_kernels.py"
FAST = {"profile": "ci", "max_examples": 8}


def run(builder, family="table-builder", scaling="default", **keywords):
    options = {"rotary_dim": k.R, **FAST, **keywords}
    if family == "table-builder":
        options.setdefault("layout", "half")
    if scaling != "default":
        options["scaling"] = k.SCALINGS[scaling]
    if scaling in k.BASES:
        options.setdefault("base", k.BASES[scaling])
    return ropecheck.check(builder, family=family, **options)


def statuses(report) -> dict:
    return {r.property: r.status for r in report.results}


def failure(report, prop: str) -> str:
    return next(r.message for r in report.results if r.property == prop and r.status == "failed")


@pytest.mark.parametrize("scaling", list(k.SCALINGS))
def test_correct_table_builder_passes_in_every_scaling(scaling):
    report = run(k.table(scaling), scaling=scaling)
    assert report.passed, report.summary()
    assert statuses(report) == {"contract": "passed", "reference": "passed", "stateless": "passed"}


@pytest.mark.parametrize("scaling", list(k.SCALINGS))
def test_correct_cache_builder_passes_in_every_scaling(scaling):
    report = run(k.cache(scaling), "cache-builder", scaling)
    assert report.passed, report.summary()


@pytest.mark.parametrize(
    "builder, layout, scaling",
    [
        (k.table(layout="interleaved"), "interleaved", "default"),
        (k.table(per_frequency=True), "half", "default"),
        (k.table(per_frequency=True), None, "default"),  # one column per frequency: no layout needed
        (k.table("longrope", layout="interleaved", per_frequency=True), "interleaved", "longrope"),
    ],
)
def test_correct_table_builders_of_other_layouts_and_widths_pass(builder, layout, scaling):
    report = run(builder, scaling=scaling, layout=layout)
    assert report.passed, report.summary()


def test_partial_rotary_dim():
    """A partial rotary factor: the builder forms r = head_dim * factor frequencies."""
    report = run(k.table("yarn", r=32), scaling="yarn", rotary_dim=32)
    assert report.passed, report.summary()
    wrong = run(k.table("yarn", r=64), scaling="yarn", rotary_dim=32)  # the factor dropped: a whole head's
    assert "shape (" in failure(wrong, "contract")


BROKEN = {
    # name: (builder, family, scaling, the property that fails, what its message says)
    "wrong base": (k.wrong_base, "table-builder", "default", "reference", "expected"),
    "YaRN magnitude factor missing": (k.yarn_no_mscale, "table-builder", "yarn", "reference", "attention factor"),
    "Llama-3 band edges exchanged": (k.table("llama3", bug="band-edges"), "table-builder", "llama3", "reference", ""),
    "LongRoPE switched at L0": (k.table("longrope", bug="longrope-side"), "table-builder", "longrope", "reference",
                                "switched before 4096"),
    "LongRoPE cache switched at L0": (k.cache("longrope", bug="longrope-side"), "cache-builder", "longrope",
                                      "reference", "switched before 4096"),
    "angles in bfloat16": (k.angles_bf16, "table-builder", "default", "reference", ""),
    "cache angles in float16": (k.cache(bug="angles-fp16"), "cache-builder", "default", "reference", ""),
    "cos and sin swapped": (k.swapped, "table-builder", "default", "reference", "cos and sin swapped"),
    "cache row p holds p + 1": (k.cache_row_shift, "cache-builder", "default", "reference",
                                "row p holds position p + 1"),
    "interleaved duplication for --layout half": (k.duplication, "table-builder", "default", "reference",
                                                  "repeat_interleave(f, 2)"),
    "dynamic NTK state leaks": (k.dynamic_leak, "table-builder", "dynamic", "stateless", "state of the longer call"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_builder_fails_in_the_property_that_names_it(name):
    builder, family, scaling, prop, said = BROKEN[name]
    report = run(builder, family, scaling)
    assert not report.passed
    assert said in failure(report, prop), failure(report, prop)


def test_a_full_width_table_without_layout_is_a_clear_contract_failure():
    report = run(k.correct_table, layout=None)
    assert "--layout half (cat(f, f)) or --layout interleaved" in failure(report, "contract")


def test_a_builder_that_returns_one_tensor_fails_its_contract():
    report = run(lambda positions: k.correct_table(positions)[0])
    assert "expected a tuple (cos, sin)" in failure(report, "contract")


def test_a_builder_that_writes_into_its_positions_fails_its_contract():
    def build(positions):
        out = k.correct_table(positions)
        positions.add_(1)
        return out

    assert "changed its positions tensor" in failure(run(build), "contract")


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ropecheck", "check", *args], capture_output=True, text=True, timeout=300
    )


def test_usage_errors_exit_2_with_a_clear_message():
    missing = cli(f"{KERNELS}:correct_table", "--family", "table-builder", "--layout", "half")
    assert missing.returncode == 2
    assert "--family table-builder needs --rotary-dim R" in missing.stdout + missing.stderr
    # --axes makes it an N-D rotation's table builder (--family axial --call builder), whose
    # width is its split's, not a --rotary-dim
    with pytest.raises(ValueError, match="rotary_dim does not apply to --family axial"):
        run(k.correct_table, axes=2)
    factors = run(k.correct_table, scaling="longrope", rotary_dim=32)  # 32 LongRoPE factors, 16 frequencies
    assert factors.verdict == "unusable" and "LongRoPE factors have 32 entries" in factors.summary()
    assert factors.exit_status == 2


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "run.json"
    done = cli(f"{KERNELS}:cache_row_shift", "--family", "cache-builder", "--rotary-dim", "64", "--profile", "ci",
               "--max-examples", "5", "--json", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "likely: row p holds position p + 1" in done.stdout
    record = json.loads(out.read_text())
    assert {r["property"]: r["status"] for r in record["results"]} == {
        "contract": "passed", "reference": "failed", "stateless": "passed"
    }


def test_the_bound_is_tight_for_a_float32_builder():
    """A correct float32 builder uses a fair part of the bound at large positions (the bound
    is not loose by orders of magnitude), and a float64 one almost none."""
    from ropecheck.properties.builder_tables import Built, compare, expected, value_bound
    from ropecheck.properties.table_builder_checks import TableConvention

    conv = TableConvention("half", 10000.0, k.R)
    positions = torch.arange(2**20, 2**20 + 256, dtype=torch.int64)
    cos, sin = k.table(per_frequency=True)(positions)
    built = Built(cos.double().numpy(), sin.double().numpy(), "float32")
    p = positions.numpy()
    worst, _ = compare(built, *expected(conv, p, None), value_bound(conv, p, None, "float32"), p, "half")
    assert 0.01 < worst <= 1.0


ADAPTERS_HERE = sorted(n for n, a in ADAPTERS.items() if a.family in ("table-builder", "cache-builder"))


def test_every_table_builder_adapter_implies_its_flags():
    for name in ADAPTERS_HERE:
        implies = ADAPTERS[name].implies
        assert implies["rotary_dim"] and implies["base"], name
        assert ADAPTERS[name].call == ("table" if ADAPTERS[name].family == "table-builder" else "cache"), name


@pytest.mark.parametrize("name", ["hf-rotary-longrope", "hf-rope-init-yarn"])
def test_transformers_builders_pass(name):
    if ADAPTERS[name].why_unavailable():
        pytest.skip(ADAPTERS[name].why_unavailable())
    report = ropecheck.check(name, **FAST)
    assert report.passed, report.summary()


def test_transformers_dynamic_ntk_state_is_a_known_finding():
    """LlamaRotaryEmbedding (dynamic) keeps the longest call's frequencies until a call below
    max_position_embeddings: stateless fails (shipped as a known failure)."""
    if ADAPTERS["hf-rotary-dynamic"].why_unavailable():
        pytest.skip(ADAPTERS["hf-rotary-dynamic"].why_unavailable())
    report = ropecheck.check("hf-rotary-dynamic", shipped_known_failures=False, properties=["stateless"], **FAST)
    assert "state of the longer call leaks" in failure(report, "stateless")


@pytest.mark.slow
@pytest.mark.parametrize("name", ADAPTERS_HERE)
def test_every_table_builder_adapter_passes_or_is_known(name):
    if ADAPTERS[name].why_unavailable():
        pytest.skip(ADAPTERS[name].why_unavailable())
    report = ropecheck.check(name, profile="ci")
    assert report.passed, report.summary()
