"""The option table: every option of every front door, declared once (each an ``Option``,
``ropecheck.session.option``; the table is formatted as a table, a row or a few per option).

Each ``Option`` says its name (the ``ropecheck.check`` keyword), how the command line writes
it (``--rotary-dim``; pytest ``--rope-rotary-dim`` and the ini option ``rope_rotary_dim``),
its type and default, its help and ``--help`` group, the families and call forms it
applies to, and how its value is checked. From the table come:

- the options of ``ropecheck check``, ``identify``, ``report`` and ``list`` (``ropecheck.cli``);
- the keywords of ``ropecheck.check`` (``ropecheck.api``);
- the pytest flags ``--rope-*`` and ini options ``rope_*`` (``ropecheck.pytest_plugin``);
- the reproduce line of a failure (``Options.words``, ``Options.keywords``) and the echo
  of a run's options in its JSON record (``Options.echo``).

``parse`` turns what a front door received (text from the command line or an ini file,
Python values from the API) into ``Options``: converted, checked, defaults filled in;
a bad value is a ``UsageError`` naming the option the way that front door spells it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Mapping

from ropecheck.calling.caller import DEFAULT_TIMEOUT
from ropecheck.calling.presets import PRESETS
from ropecheck.calling.sanitizer import TOOLS
from ropecheck.properties.core.contract import APPLIER_FORMS, CALL_FORMS
from ropecheck.properties.families import FAMILIES
from ropecheck.properties.nd.coordinates import FLOAT_RANGE, KINDS
from ropecheck.properties.nd.families import ND_FAMILY_NAMES
from ropecheck.properties.runner import DEFAULT_PROFILE, PROFILES
from ropecheck.reference import LAYOUTS
from ropecheck.reference.nd import PAIR_SPANS
from ropecheck.session.converters import (
    at_least,
    base_value,
    coordinate_ranges,
    device_name,
    dtype_names,
    fraction,
    hf_config_value,
    integer,
    integers,
    mode_names,
    number,
    numbers,
    position_range,
    scaling_value,
    sizes_value,
    target_value,
)
from ropecheck.session.hf_config import HFConfig
from ropecheck.session.option import LIST, SWITCH, Option, UsageError, as_given, complaint, spelled, text_and_parsed

REGRESSION_FACTOR = 2.0  # --regression-factor: the default threshold of a baseline comparison
SANITIZE_EXAMPLES = 3  # examples per check under --sanitize (unless --max-examples says otherwise)


TARGET, CONVENTION, FAMILY, RUN, OUTPUT, BASELINE, BENCH = (
    "Target",
    "Convention (what the target computes)",
    "Family (N-D, multimodal, position builders, xPos)",
    "Run",
    "Output",
    "Baseline (accuracy regressions)",
    "Bench (ropecheck bench: throughput)",
)
BENCH_SHAPES = ("decode", "prefill", "models")  # --shapes (ropecheck.bench.shapes)
BENCH_TIMERS = ("auto", "cpu", "host", "cuda-cold", "cuda-graph")
# the options of ``check`` that ``bench`` takes too: what the target is and how it is called
BENCH_TAKES = ("dtypes", "modes", "timeout", "json", "debug")
ROTATION_FAMILIES = ND_FAMILY_NAMES
TENSOR_FAMILIES = ("rope", "axial", "mrope", "nd", "pairs", "xpos")
# the position builders (--axes); the table builders (TABLE_BUILDERS) take the 1-D convention
BUILDERS = tuple(name for name, family in FAMILIES.items() if "segments" in family.calls)
TABLE_BUILDERS = tuple(name for name, family in FAMILIES.items() if {"table", "cache"} & set(family.calls))
HF_CONFIG_FAMILIES = ("rope", "mrope", *TABLE_BUILDERS)  # what a model config's convention declares

# fmt: off
OPTIONS: tuple[Option, ...] = (
    # --- what is checked -------------------------------------------------------------------
    Option("target",
        "path/to/file.py:func, package.module:attr or a built-in name (default: the built-in "
        "rotate-half); set in the ini file, it adds the property suite to a plain `pytest` run",
        TARGET, target_value, commands=("check", "identify"), reproduce=False),
    Option("call",
        "The target's call form: x = rope(x, positions) -> y; qk = rope(q, k, positions) -> "
        "(q_out, k_out) with k_heads dividing q_heads; packed = rope(x, cu_seqlens, positions) -> y on "
        "(total, heads, head_dim); N-D (--family axial, mrope, pairs): builder = build(positions (S, n_axes)) -> "
        "(cos, sin) each (S, D), or complex (S, D/2): an N-D table builder whose tables ropecheck applies along the "
        "declared pairs (also --family table-builder with N-D options). Default: what the target declares, else "
        "its family's first.",
        TARGET, choices=tuple(CALL_FORMS)),
    Option("api",
        "The library interface the target has, called as that library's callers call it (no wrapper; "
        "ropecheck makes its table): "
        + "; ".join(f"{name} = {preset.signature()}" for name, preset in PRESETS.items())
        + ". --layout, --rotary-dim, --base and --scaling become its arguments and its table. See docs/presets.md. "
        "N-D (--family axial, mrope, pairs): diffusers = " + CALL_FORMS["diffusers"] + ", its cos/sin made from "
        "the declared rotation (docs/families.md).",
        TARGET, choices=(*PRESETS, *APPLIER_FORMS), families=("rope", "axial", "mrope", "pairs"), metavar="NAME"),
    Option("cp_size",
        "Context parallelism across N ranks, for an interface that takes it (--api te, megatron): each sequence "
        "padded to a multiple of 2N and cut into 2N chunks, rank r holding chunks r and 2N-1-r; every rank is "
        "called with its local tensor, its rank and the global tables, and every token must get its global "
        "position (default 1: no split). See docs/presets.md.",
        TARGET, at_least(1), families=("rope",), metavar="N"),
    Option("in_process",
        "Call the target in ropecheck's own process, not in a worker process (for a target "
        "that cannot be imported twice; a crash then ends ropecheck).",
        TARGET, default=False, kind=SWITCH, commands=("check", "identify")),
    Option("max_position",
        "Declared position range: positions 0 .. N are drawn, shifted into and swept "
        "(default 2^24 = 16777216; at least 255).",
        TARGET, position_range, metavar="N"),
    Option("device",
        "Where the target's inputs are made: cpu, cuda or cuda:N, with their strides and storage; "
        "the float64 reference stays on the host (default: cpu, or the device the target declares). Exit 2 "
        "on a machine without it.",
        TARGET, device_name),
    Option("backward", "The target has no backward: skip gradient checks.", TARGET, default=True, kind=SWITCH,
        flag="no-backward", inverted=True, families=TENSOR_FAMILIES),
    Option("inplace", "The target writes its output into x and returns it.", TARGET, default=False, kind=SWITCH,
        families=("rope",)),
    # --- the convention ------------------------------------------------------------------------
    Option("layout",
        "Pairing layout. Without it only spec-free checks run (a table builder: how a table of rotary_dim "
        "columns holds each frequency twice, half cat(f, f) or interleaved repeat_interleave(f, 2)).",
        CONVENTION, choices=LAYOUTS, families=("rope", "axial", "mrope", "xpos", *TABLE_BUILDERS)),
    Option("base", "Frequency base (default 10000); with --family axial one per axis, e.g. 10000,100.", CONVENTION,
        base_value, families=("rope", "axial", "mrope", "xpos", *TABLE_BUILDERS), joined=True),
    Option("rotary_dim",
        "Rotated features (default: all of head_dim); --family mrope: 2 * sum(sections), the head has more "
        "(passed through); a table builder (--family table-builder, cache-builder): required, its tables' width.",
        CONVENTION, at_least(2), families=("rope", "mrope", *TABLE_BUILDERS)),
    Option("scaling",
        "Position scaling: KIND[:key=value,...] (linear, ntk, dynamic, yarn, llama3, longrope), "
        "a JSON object of HF rope_parameters, or @file.json.",
        CONVENTION, scaling_value, families=("rope", *TABLE_BUILDERS)),
    Option("rotated_fraction",
        "p-RoPE (transformers' rope_type proportional): pairs span the rotary dimension r as usual, "
        "theta_i = base^(-2i/r) for the first floor(p r / 2) pairs and zero for the rest, which do not turn "
        "(0 < p <= 1; default 1). Not --rotary-dim p r, whose pairs and frequencies lie inside p r features.",
        CONVENTION, fraction, families=("rope",), metavar="P"),
    Option("hf_config",
        "A Hugging Face model's config.json (or its folder), read locally: the convention transformers reads "
        "of it (rope_parameters / rope_scaling, rope_theta, head_dim, partial_rotary_factor, mrope_section, ...) "
        "as the flags above, printed in the run's header; a flag given beside it must agree with it. "
        "See docs/user-guide.md.",
        CONVENTION, hf_config_value, families=HF_CONFIG_FAMILIES, metavar="PATH"),
    Option("layer_type",
        "With --hf-config: the layer type whose rope parameters are checked (Gemma 3: full_attention or "
        "sliding_attention); required when the config has several.",
        CONVENTION, families=HF_CONFIG_FAMILIES, metavar="NAME"),
    # --- families ------------------------------------------------------------------------------------
    Option("family",
        "N-D / multimodal target: axial, mrope, nd, pairs (any convention as a --pair-table), or a position "
        "builder (rope-tie-builder, rope-tv-builder, mrope-builder); xpos: xpos(q, k, positions) -> (q_out, k_out); "
        "table-builder: build(positions) -> (cos, sin); cache-builder: build(max_position) -> cos_sin_cache; "
        "rope: 1-D RoPE (the default). See docs/families.md.",
        FAMILY, choices=tuple(FAMILIES), commands=("check", "identify")),
    Option("axes", "Number of position axes (--family axial, nd: default 2; rope-tv-builder: 2 or 3).", FAMILY,
        at_least(1), families=("axial", "nd", *BUILDERS), commands=("check", "identify")),
    Option("sections", "Rotated pairs per axis, e.g. 16,24,24 (--family mrope).", FAMILY, integers, kind=LIST,
        joined=True, families=("mrope",)),
    Option("mrope_interleaved", "Sections interleaved over the pairs (Qwen3-VL), not in chunks (--family mrope).",
        FAMILY, default=False, kind=SWITCH, families=("mrope",)),
    Option("split", "Features per axis, e.g. 32,32 (--family axial, nd; default equal).", FAMILY, integers, kind=LIST,
        joined=True, families=("axial", "nd")),
    Option("nd_base", "One frequency base per axis, e.g. 10000,100 (--family axial).", FAMILY, numbers, kind=LIST,
        joined=True, families=("axial",)),
    Option("head_dim",
        "Features per head when the head has more than --split's blocks, the rest passed through (--family axial), "
        "e.g. V-JEPA 2 ViT-L: --split 20,20,20 --head-dim 64. Default: the split's sum.",
        FAMILY, at_least(2), families=("axial",)),
    Option("pair_span",
        "Where --layout half pairs lie (--family axial): axis (default: pairs inside each axis' block) or head "
        "(pair p is features (p, p + r/2) of the rotated head, dealt to the axes in consecutive blocks: "
        "Qwen2.5-VL's vision tower, DINOv3, Cosmos).",
        FAMILY, choices=PAIR_SPANS, families=("axial",)),
    Option("pair_table",
        "A JSON file of the rotated pairs (--family pairs): {\"heads\": null or H, \"head_dim\": D, \"n_axes\": N, "
        "\"pairs\": [[first, second, axis, theta, phase], ...]}: pair (first, second) turns by theta x_axis + phase, "
        "features in no pair pass through; heads H: indices into a token's H x D features (a rotation before the "
        "head split). See docs/families.md.",
        FAMILY, families=("pairs",), metavar="FILE.json"),
    Option("positions",
        "What the target's positions are (--family axial, mrope, nd, pairs): int (default; int64 token indices from 0, "
        "or integers in --coord-range) or float (float32 coordinates of image and video models, default range "
        f"{FLOAT_RANGE[0]:g}:{FLOAT_RANGE[1]:g}). See docs/families.md.",
        FAMILY, choices=KINDS, families=ROTATION_FAMILIES, commands=("check", "identify")),
    Option("coord_range",
        "The positions drawn, LO:HI per axis or one for all, negative allowed, e.g. --coord-range=-32:32 "
        "(written with '=' when it starts with '-'; --family axial, mrope, nd, pairs).",
        FAMILY, coordinate_ranges, kind=LIST, joined=True, families=ROTATION_FAMILIES, metavar="LO:HI[,LO:HI...]"),
    Option("coord_scale",
        "The rotation turns pair p by theta_p (S_a x_a + O_a): S per axis or one for all (e.g. 6.2832 for "
        "DINOv3's 2 pi / period; default 1).",
        FAMILY, numbers, kind=LIST, joined=True, families=ROTATION_FAMILIES, metavar="S[,S...]"),
    Option("coord_offset",
        "O per axis or one for all in theta_p (S_a x_a + O_a) (default 0; with an offset f(x, 0) != x, so identity "
        "and commutation give way to the reference). Written --coord-offset=-8 when negative.",
        FAMILY, numbers, kind=LIST, joined=True, families=ROTATION_FAMILIES, metavar="O[,O...]"),
    Option("scale_base", "The scale base s of zeta^(m/s) (--family xpos; default 512).", FAMILY, at_least(0.0, number),
        families=("xpos",)),
    Option("gamma", "zeta_i = (2i/d + gamma)/(1 + gamma) (--family xpos; default 0.4).", FAMILY, at_least(0.0, number),
        families=("xpos",)),
    # --- the run ------------------------------------------------------------------------------------
    Option("profile",
        "Example budget: ci (derandomized), dev, thorough; production (derandomized, at production sizes).", RUN,
        default=DEFAULT_PROFILE, choices=tuple(PROFILES), commands=("check", "report"),
        defaults={"api": "ci", "report": "ci"}, reproduce=False),
    Option("sizes",
        "Input sizes: toy (every profile but production) or production (head sizes 64..512, seq up "
        "to 8192, q/k head ratios 1/4/8/32, and on a CUDA device with the memory one input past 2^31 "
        "elements), then key=value overrides, e.g. production,head_dims=192/256,max_seq=4096.",
        RUN, sizes_value),
    Option("seed", "Hypothesis seed (default: random, printed; none for the derandomized profiles).", RUN, integer,
        commands=("check", "report"), reproduce=False),
    Option("dtypes",
        "dtype to check (float32, bfloat16, float16, float64); repeat or comma-separate (default: the target's).", RUN,
        dtype_names, kind=LIST, flag="dtype", commands=("check", "report"), reproduce=False),
    Option("modes",
        "How the target is run (repeatable): eager (default), compile (torch.compile, inductor), "
        "autocast / autocast-fp16 (under torch.autocast with bf16 / fp16), cudagraph (captured and replayed "
        "in a CUDA graph; --device cuda only). Each mode gets its own columns.",
        RUN, mode_names, default=("eager",), kind=LIST, flag="mode", reproduce=False),
    Option("properties", "Run only these properties.", RUN, kind=LIST, convert=list, flag="property", pytest=False,
        reproduce=False),
    Option("max_examples", "Override the profile's examples per check.", RUN, at_least(1)),
    Option("timeout", "Seconds one call of the target may take.", RUN, at_least(0.0, number), default=DEFAULT_TIMEOUT,
        commands=("check", "identify", "report")),
    Option("sanitize",
        "Run the target's worker under NVIDIA compute-sanitizer: memcheck (the flag alone), racecheck, initcheck or "
        "synccheck; a report is a finding of the check being run, with its input. At most "
        f"{SANITIZE_EXAMPLES} examples per check (the sanitizer slows calls 10 to 100 times). Needs a CUDA device "
        "(--device cuda) and compute-sanitizer; exit 2 without them.",
        RUN, choices=TOOLS, flag_value="memcheck", families=TENSOR_FAMILIES, metavar="[TOOL]"),
    Option("opcheck",
        "Run torch.library.opcheck (test_schema, test_autograd_registration, test_faketensor, "
        "test_aot_dispatch_dynamic) on each custom op the target is or calls (torch.library ops; not aten, prim, "
        "prims), with the arguments the checks' calls pass it: every drawn layout, call form and interface class. "
        "With --mode compile each call is also compiled with fullgraph=True: a graph break is a finding. Findings "
        "fail the opcheck row (one per op and test). See docs/user-guide.md.",
        RUN, default=False, kind=SWITCH, families=TENSOR_FAMILIES),
    Option("jobs",
        "Processes the checks are shared among, each with its target's own worker; the verdicts are the same. "
        "Default: 2 where the run can share (two cores or more; a worker, eager, on the CPU, not --sanitize), "
        "else 1.",
        RUN, at_least(1), api=False, pytest=False, reproduce=False, metavar="N"),
    Option("strict_layouts",
        "A refusal of an exotic memory layout (the layouts probe) fails instead of being a support note.", RUN,
        default=False, kind=SWITCH),
    Option("known_failures", "TOML file of known failures (repeatable); they show as 'known', not failed.", RUN,
        kind=LIST, convert=list, reproduce=False, metavar="FILE"),
    Option("shipped_known_failures", "Ignore the known failures shipped with ropecheck for its adapters.", RUN,
        default=True, kind=SWITCH, flag="no-known-failures", inverted=True, reproduce=False),
    # --- output ------------------------------------------------------------------------------------
    Option("json", "Write results as JSON.", OUTPUT, commands=("check", "identify"), api=False, pytest=False,
        reproduce=False, metavar="PATH"),
    Option("junit", "Write results as JUnit XML.", OUTPUT, api=False, pytest=False, reproduce=False, metavar="PATH"),
    Option("debug", "Show tracebacks, and what the target's imports and calls print or warn (captured otherwise).",
        OUTPUT, default=False, kind=SWITCH, commands=("check", "identify"), api=False, pytest=False, reproduce=False),
    # --- the baseline -------------------------------------------------------------------------------
    Option("baseline",
        "Compare with this earlier run's JSON record (a --json file, or a report.json with `ropecheck report`), "
        "per property x dtype x mode x call form: verdict, largest error, accuracy horizon, error against "
        "position. A regression fails (exit 1); improvements are reported. See docs/ci.md.",
        BASELINE, commands=("check", "report"), reproduce=False, metavar="PATH"),
    Option("regression_factor",
        "With --baseline: an error (largest, or at a swept position) that grew by more than this factor "
        "is a regression, one that shrank by as much an improvement (a horizon: when halved or doubled).",
        BASELINE, at_least(1.0, number), default=REGRESSION_FACTOR, commands=("check", "report"), reproduce=False),
    Option("update_baseline",
        "With --baseline PATH: show the comparison without failing on it, and write this run's record to PATH "
        "(created if absent): the deliberate update of a baseline.",
        BASELINE, default=False, kind=SWITCH, pytest=False, reproduce=False),
    Option("bench",
        "pytest: also time the target at the bench shapes (ropecheck bench), one benchmark per shape and dtype through "
        "pytest-benchmark's benchmark fixture (--benchmark-save, --benchmark-compare work as usual; its "
        "--benchmark-disable leaves only the check of each shape's output). See docs/benchmarks.md.",
        BENCH, default=False, kind=SWITCH, commands=("pytest",), api=False),
    # --- bench --------------------------------------------------------------------------------------
    Option("shapes",
        "Which shapes to time: decode (1 .. 512 tokens, one per sequence, at scattered positions), prefill "
        "(4k .. 128k tokens in sequences of 4096, cut to the device's memory), models (each model's heads at one "
        "decode and one prefill size: 32/8, 64/8 and 28/4 heads of 128, heads of 64 and 256, partial rotary, MLA's "
        "128/1 of 64); for an N-D rotation (image and video RoPE) image: one image's patch grid of 1k .. 16k "
        "patches, 24 heads of its head size. Default: decode,prefill (N-D: image). See docs/benchmarks.md.",
        BENCH, kind=LIST, convert=list, commands=("bench",), api=False, metavar="NAME"),
    Option("bench_sizes",
        "The shapes' sizes: gpu (as above) or cpu (smaller: decode 1 .. 64 tokens, prefill 512 and 2048). Default: "
        "cpu on the CPU, gpu on a CUDA device.",
        BENCH, choices=("cpu", "gpu"), flag="sizes", pytest_word="bench-sizes", commands=("bench",), api=False),
    Option("shape",
        "Override fields of every shape: tokens=N, sequences=N (of the tokens), heads=Q/K, head_dim=D, rotary_dim=R, "
        "comma-separated, e.g. tokens=8192,heads=32/8.",
        BENCH, commands=("bench",), api=False, metavar="K=V,..."),
    Option("timer",
        "How a call is timed: auto (cpu on the CPU; on CUDA cuda-graph below 32 MiB moved, where launch overhead "
        "dominates, else cuda-cold), cpu (perf_counter_ns, fixed threads, last-level cache flushed), cuda-cold "
        "(events around one call after an L2 flush), cuda-graph (calls replayed from a CUDA graph, inputs rotated "
        "through more than the L2), host (wall time per eager call: what a model pays).",
        BENCH, choices=BENCH_TIMERS, default="auto", commands=("bench",), api=False),
    Option("threads", "CPU timer: torch's thread count while timing (default: the target process's).", BENCH,
        at_least(1), commands=("bench",), api=False, metavar="N"),
    Option("budget", "Seconds of sampling per shape at most (it stops earlier once the median has settled).", BENCH,
        at_least(0.1, number), default=10.0, commands=("bench",), api=False),
    Option("bench_baseline",
        "Compare with an earlier bench run's --json on the same device (relative to the same-run copy; a one-sided "
        "rank test over block medians): fails (exit 1) when a shape is significantly slower by more than "
        "--fail-slower, says inconclusive (exit 0) when the samples cannot tell.",
        BENCH, flag="baseline", pytest_word="bench-baseline", commands=("bench",), api=False, metavar="PATH"),
    Option("fail_slower",
        "The slowdown a speed gate fails on, as a fraction (default 0.05 on a GPU, 0.10 on the CPU).", BENCH,
        at_least(0.0, number), commands=("bench",), api=False, metavar="FRACTION"),
    Option("against",
        "Another target (same flags) timed in the same run, interleaved with TARGET: TARGET is gated against it "
        "as against a baseline.",
        BENCH, commands=("bench",), api=False, pytest=False, metavar="TARGET"),
    # --- the other commands -----------------------------------------------------------------------
    Option("probe_max_position", "Largest position a probe may use.", TARGET, at_least(1), default=2**24,
        flag="max-position", commands=("identify",)),
    Option("write_table",
        "identify --family nd: write the probed pairs as a --pair-table JSON file (what --family pairs reads).",
        OUTPUT, commands=("identify",), api=False, pytest=False, metavar="PATH"),
    Option("out", "Folder for report.md, report.json and the plots.", OUTPUT, default="docs/report",
        commands=("report",), api=False, pytest=False),
    Option("report_targets", "Only these targets (repeatable).", TARGET, kind=LIST, convert=list, flag="target",
        commands=("report",), api=False, pytest=False),
    Option("available", "Only the targets that can run here.", TARGET, default=False, kind=SWITCH, commands=("list",),
        api=False, pytest=False),
)
# fmt: on
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
FAMILY_PARAMETERS = (
    "axes",
    "sections",
    "split",
    "head_dim",
    "layout",
    "base",
    "nd_base",
    "rotary_dim",
    "scaling",
    "rotated_fraction",
    "scale_base",
    "gamma",
    "mrope_interleaved",
    "pair_span",
    "pair_table",
    "positions",
    "coord_range",
    "coord_scale",
    "coord_offset",
)  # (in the order a header shows them)


def for_command(command: str) -> list[Option]:
    """The options of a command; ``bench`` takes the target's (its target, convention and
    family groups), a few of the run's (BENCH_TAKES) and its own."""
    if command == "bench":
        shared = [
            o
            for o in OPTIONS
            if "check" in o.commands and (o.group in (TARGET, CONVENTION, FAMILY) or o.name in BENCH_TAKES)
        ]
        return [o for o in OPTIONS if o in shared or "bench" in o.commands]
    return [o for o in OPTIONS if command in o.commands]


# --- the values ----------------------------------------------------------------------------------


class Options(Mapping):
    """One run's option values (every option of its command: given, or its default), read as
    ``options.rotary_dim`` or ``options["rotary_dim"]``; ``given`` names those given."""

    def __init__(self, command: str, values: dict, given: Iterable[str], door: str = "cli"):
        self.command, self.door = command, door
        self._values = values
        self.given = frozenset(given)

    def __getitem__(self, name: str):
        return self._values[name]

    def __getattr__(self, name: str):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def replace(self, **changes) -> "Options":
        return Options(self.command, {**self._values, **changes}, self.given | set(changes), self.door)

    @property
    def derived(self) -> frozenset:
        """The options --hf-config gave (``_from_hf_config``): a reproduce line has --hf-config instead."""
        config = self._values.get("hf_config")
        return frozenset(getattr(config, "flags", ()))

    @property
    def scaling_parsed(self):
        return None if self.scaling is None else self.scaling[1]

    def parameters(self) -> dict:
        """The family parameters given, parsed (what ``Family.declare`` reads)."""
        out = {name: self._values[name] for name in FAMILY_PARAMETERS if name in self.given}
        if "scaling" in out:
            out["scaling"] = out["scaling"][1]
        return out

    def check_applies(self, family: str, call: str) -> None:
        """UsageError for a given option that does not apply to the run's family or call form."""
        for name in sorted(self.given, key=list(BY_NAME).index):
            option = BY_NAME[name]
            if option.families and family not in option.families:
                raise UsageError(
                    f"{spelled(option, self.door)} does not apply to --family {family} (it applies to "
                    f"--family {', '.join(option.families)})"
                )
            if option.calls and call not in option.calls:
                raise UsageError(
                    f"{spelled(option, self.door)} does not apply to --call {call} (it applies to "
                    f"--call {', '.join(option.calls)})"
                )

    def words(self) -> list:
        """The command-line words of the options given that a reproduce line carries."""
        out: list = []
        for option in OPTIONS:
            if option.name in self.given - self.derived and option.reproduce and self.command in option.commands:
                value = self._values[option.name]
                if value is not None and value != option.default_for("cli", self.command) or option.kind == SWITCH:
                    out += option.shown(value)
        return out

    def keywords(self) -> dict:
        """The keywords of the options given that a reproduce line carries (a Python call)."""
        out = {}
        for option in OPTIONS:
            if option.name in self.given - self.derived and option.reproduce and option.api:
                value = as_given(self._values[option.name])
                if value is not None and value != option.default_for(self.door, self.command):
                    out[option.name] = value
        return out

    def echo(self) -> dict:
        """The options given, as JSON takes them (a run's record)."""
        out = {}
        for name in sorted(self.given, key=list(BY_NAME).index):
            value = as_given(self._values[name])
            if name == "target" and not isinstance(value, str):  # a Python object (the API's)
                value = getattr(value, "name", None) or getattr(value, "__name__", type(value).__name__)
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


def parse(command: str, raw: Mapping[str, Any], door: str = "cli", sources: Mapping[str, str] = {}) -> Options:
    """``raw`` (option name -> what the front door received; None or absent: not given) as
    Options for ``command``; UsageError for an unknown option or a value it cannot use,
    spelled as ``door`` (or ``sources``: the door a value came from, an ini file's) spells it."""
    table = {o.name: o for o in for_command(command) if door not in ("api",) or o.api}
    unknown = [name for name in raw if name not in table]
    if unknown:
        raise UsageError(f"unknown option{'s' * (len(unknown) > 1)} {', '.join(unknown)}; known: {', '.join(table)}")
    values, given = {}, []
    for name, option in table.items():
        received = raw.get(name)
        absent_flag = option.kind == SWITCH and door != "api" and received is False  # a flag left off
        if (
            received is None
            or absent_flag
            or (option.kind == LIST and isinstance(received, (list, tuple)) and not received)
        ):
            default = option.default_for(door, command)
            values[name] = list(default) if isinstance(default, tuple) and option.kind == LIST else default
            continue
        came = sources.get(name, door)
        try:
            values[name] = option.value(received, came)
        except (ValueError, TypeError, OSError) as exc:
            raise UsageError(complaint(option, came, exc)) from None
        given.append(name)
    _from_hf_config(values, given, door)
    _n_d_table_builder(values, given)
    return Options(command, values, given, door)


def _from_hf_config(values: dict, given: list, door: str) -> None:
    """--hf-config: the options of the convention its config gives (``session.hf_config``),
    set as if given; one given beside it that says otherwise is a UsageError (unless the
    config left that value to transformers' default), as is --layer-type without it."""
    config = values.get("hf_config")
    if config is None:
        if "layer_type" in given:
            raise UsageError(
                f"{spelled(BY_NAME['layer_type'], door)} chooses a layer type of the model config that "
                f"{spelled(BY_NAME['hf_config'], door)} reads: give that too"
            )
        return
    source = BY_NAME["hf_config"]
    try:
        resolved = config.resolve(values.get("layer_type")) if isinstance(config, HFConfig) else config
    except ValueError as exc:
        raise UsageError(complaint(source, door, exc)) from None
    stated = f"{spelled(source, door)} {resolved.path}"
    family = values.get("family")
    if "family" in given and resolved.family == "rope" and family not in ("rope", *TABLE_BUILDERS):
        raise UsageError(f"{_stating(BY_NAME['family'], family, door)} contradicts {stated}, a 1-D RoPE convention")
    flags = dict(resolved.flags)
    for name, raw in resolved.flags.items():
        option = BY_NAME[name]
        value = option.value(raw, "api")
        if name in given and name in resolved.defaults:  # the config left it to transformers: the flag gives it
            del flags[name]
            continue
        if name in given and _parsed(values[name]) != _parsed(value):
            raise UsageError(
                f"{_stating(option, values[name], door)} contradicts {stated}, which gives "
                f"{_stating(option, value, door)}"
            )
        values[name] = value
        if name not in given:
            given.append(name)
    for name, said in resolved.unset.items():
        option = BY_NAME[name]
        if name in given and _parsed(values[name]) != said:
            gives = f"no {spelled(option, door)}" if said is None else _stating(option, said, door)
            raise UsageError(f"{_stating(option, values[name], door)} contradicts {stated}, which gives {gives}")
    values["hf_config"] = replace(resolved, flags=flags)


def _parsed(value):
    """An option's value as compared: a (text, parsed) pair's parsed value (--scaling)."""
    return value[1] if text_and_parsed(value) else value


def _stating(option: Option, value, door: str) -> str:
    """``--base 10000`` (``base=10000.0`` through the API)."""
    if door == "api":
        text = value[0] if text_and_parsed(value) else value
        return f"{option.name}={text!r}"
    words = option.shown(value) or [f"no {option.cli}"]
    return " ".join(words).replace(option.cli, spelled(option, door), 1)


# the options only N-D rotations (and position builders) take: with --family table-builder,
# they make it an N-D rotation's table builder
N_D_OPTIONS = tuple(o.name for o in OPTIONS if o.families and set(o.families) <= {*ROTATION_FAMILIES, *BUILDERS})


def _n_d_table_builder(values: dict, given: list) -> None:
    """--family table-builder with an N-D option is the table builder of an N-D rotation:
    the family its options name (--pair-table: pairs, --sections: mrope, else axial) called
    as --call builder (``properties.core.contract.BUILDER_FORMS``)."""
    if values.get("family") != "table-builder" or not any(name in given for name in N_D_OPTIONS):
        return
    values["family"] = "pairs" if "pair_table" in given else "mrope" if "sections" in given else "axial"
    if values.get("call") in (None, "table"):
        values["call"] = "builder"
        given.append("call")
