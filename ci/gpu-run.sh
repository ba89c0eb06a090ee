#!/usr/bin/env bash
# ci/gpu-run.sh [--rehearse] [--quick] [--steps NAME,...] OUT_DIR
#
# The GPU campaign in one command, on a CUDA machine, within one device call of at most 9
# minutes (GPU_RUN_BUDGET seconds, default 540): the steps in the order of their worth, each
# in a time box set from the earlier GPU runs' figures (docs/gpu.md) and cut to what the
# budget has left; a step that finds no time left is recorded as skipped.
#
#   install            the wheels brought along (WHEELS, default .whl/: ci/gpu-wheels.sh)
#   envelope           the machine, its libraries, a device-to-device copy's bandwidth
#   kernel-tests       the project kernel's tests, compiled (not interpreted)
#   sanitize-*         --sanitize (compute-sanitizer memcheck) on the two planted kernels
#                      (memcheck must report them) and the project's kernel (clean)
#   bench              the throughput benchmark with its copy baseline (pytest-benchmark JSON)
#   checks-eager       `ropecheck check --device cuda --profile ci --dtype bfloat16` of every
#                      GPU target, GPU_RUN_JOBS at a time: a row check-NAME-eager each
#   check-triton-production  the project's kernel at --profile production
#   checks-compile, checks-cudagraph   the same checks under torch.compile / CUDA graphs
#   presets            every library interface (--api) called on the device
#   bench-compiled, aot  HF's code under torch.compile benchmarked; the kernel compiled
#                      ahead of time for sm_90a and sm_80
#   report             always made: OUT_DIR/docs/report-gpu/ (report.md, report.json,
#                      benchmarks.md, aot.md, commands.md), ready to be copied into the repository
#
# Every step runs under `timeout`, its output in OUT_DIR/logs/STEP.log; a failing step is
# recorded and the run goes on. The end: a summary table (step, status, seconds) on stdout
# and in OUT_DIR/summary.md, and OUT_DIR/gpu-run.tar.gz holding everything else in OUT_DIR;
# both are copied to $OUT when the device tool set it (its files come back from there).
#
# --rehearse: the same steps on CPU, producing the same files: the Triton interpreter, the
#   ci profile, --device cpu, eager mode only (compile and cudagraph need CUDA or take
#   minutes on CPU), float32; the sanitizer step parses the recorded sample reports of
#   tests/data/sanitizer/ instead of running compute-sanitizer (there is no GPU to run it on);
#   the benchmark step runs bench_gpu_rope.py (skipped without CUDA) and, for a real
#   pytest-benchmark JSON, the float64 reference benchmark.
# --quick: with --rehearse, the smallest run (tests/test_gpu_run.py): one target per kind
#   of step, its reference property only, two examples.
# --steps: run only these steps (comma-separated names or prefixes, e.g. install,checks-eager).
#
# Environment: PYTHON (the interpreter; default .venv/bin/python when rehearsing, else
# python3), WHEELS (default .whl), SITE (where wheels install; default OUT_DIR/site when
# rehearsing, /tmp/ropecheck-site otherwise), GPU_RUN_BUDGET (seconds, default 540),
# GPU_RUN_JOBS (checks run side by side: default 4 on a GPU, 2 rehearsing).
set -uo pipefail
cd "$(dirname "$0")/.."
# run from inside a pytest-xdist worker (the project's tests rehearse this script under -n 2),
# its variables would make pytest-benchmark disable every benchmark of the bench steps
unset PYTEST_XDIST_WORKER PYTEST_XDIST_WORKER_COUNT PYTEST_XDIST_TESTRUNUID
repo=$(pwd)

usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; }
rehearse=0
quick=0
only=""
internal=""
while [ $# -gt 0 ]; do
    case $1 in
        --rehearse) rehearse=1 ;;
        --quick) quick=1 ;;
        --steps) only=$2; shift ;;
        --steps=*) only=${1#--steps=} ;;
        --internal) internal=$2; shift; shift; break ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "gpu-run: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done

if [ -n "$internal" ]; then
    # --internal STEP ARGS...: a step of several commands, run under `timeout` by the parent
    case $internal in
        install)
            # install [WHEELS SITE MODE]: the wheels into SITE (--target), and ropecheck's
            # subpackages reachable from the checkout (tests and benchmarks import the
            # checkout's ropecheck/ first: properties/ and reference/ are linked into it when
            # nothing else maps them)
            wheels=$1; site=$2; py=$3; mode=$4; out=$5
            if ! compgen -G "$wheels/*.whl" >/dev/null; then
                echo "no wheels in $wheels: building ropecheck's own into $out/wheels"
                wheels=$out/wheels
                mkdir -p "$wheels"
                # from a copy: a build in the checkout would leave build/ and *.egg-info there
                src=$(mktemp -d)
                cp -r "$repo"/{pyproject.toml,README.md,ropecheck,properties,reference} "$src/"
                "$py" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation \
                    -w "$wheels" "$src" || exit 1
                rm -rf "$src"
            fi
            ls -l "$wheels"/*.whl
            mkdir -p "$site"
            "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
                --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl || exit 1
            echo "installed into $site:"
            ls "$site"
            (cd /tmp && PYTHONPATH=$site "$py" -c "
import importlib.util as u, ropecheck, ropecheck.properties, ropecheck.reference
print('ropecheck from', ropecheck.__file__)
for name in ('liger_kernel', 'flash_attn', 'flashinfer'):
    spec = u.find_spec(name)
    print(name, 'at', spec.origin if spec else None)
") || exit 1
            exit 0 ;;
        sanitize)
            # sanitize NAME EXPECT OUT PY TARGET ARGS...: TARGET's check with --sanitize (its
            # worker under compute-sanitizer memcheck): its output kept as the log, its JSON
            # record's sanitizer findings are what the record of this step says
            name=$1; expect=$2; out=$3; py=$4; shift 4
            log=$out/sanitizer/$name.memcheck.log
            "$py" -m ropecheck check "$@" --sanitize --json "$out/sanitizer/$name.check.json" 2>&1 | tee "$log"
            echo "check exit ${PIPESTATUS[0]}"
            "$py" ci/gpu_report.py sanitizer "$name" "$log" "$out/sanitizer/$name.json" --expect "$expect" \
                --check-json "$out/sanitizer/$name.check.json"
            exit $? ;;
        sanitize-sample)
            # sanitize-sample NAME EXPECT OUT PY SAMPLE: the rehearsal of the above: the parser
            # on a recorded sample report (no GPU here)
            name=$1; expect=$2; out=$3; py=$4; sample=$5
            cp "$sample" "$out/sanitizer/$name.memcheck.log"
            echo "rehearsal: no compute-sanitizer run; parsing the recorded sample $sample"
            "$py" ci/gpu_report.py sanitizer "$name" "$out/sanitizer/$name.memcheck.log" \
                "$out/sanitizer/$name.json" --expect "$expect"
            exit $? ;;
        bench)
            # bench OUT PY REHEARSE PART: the GPU benchmark, in two parts with a JSON file each
            # (main: every implementation but torch.compile of HF's; compiled: that one, which
            # compiles once per shape), so that a time box stopping one keeps the other. On
            # CPU, where bench_gpu_rope.py is skipped, the float64 reference benchmark stands
            # in, for a real pytest-benchmark JSON file.
            out=$1; py=$2; rehearse=$3; part=$4
            json=$out/bench/benchmark-$part.json
            bench_args=(--benchmark-enable -p no:cacheprovider -p no:xdist -q -rs --benchmark-json "$json")
            if [ "$part" = main ]; then
                select="test_rope_gpu and not hf-compiled"; layout=half
            else
                select="test_rope_gpu and hf-compiled"; layout=interleaved
            fi
            if [ "$rehearse" = 1 ]; then
                echo "rehearsal: bench_gpu_rope.py needs CUDA (skipped); the float64 reference benchmark stands in"
                "$py" -m pytest benchmarks/bench_gpu_rope.py benchmarks/bench_reference.py \
                    -k "($select) or (throughput and $layout)" "${bench_args[@]}"
            else
                "$py" -m pytest benchmarks/bench_gpu_rope.py -k "$select" "${bench_args[@]}"
            fi
            rc=$?
            "$py" ci/gpu_report.py bench-table "$out"/bench/benchmark-*.json "$out/bench/benchmarks.md"
            if [ ! -s "$json" ]; then echo "no benchmark ran (pytest exit $rc)"; exit 1; fi
            exit $rc ;;
        checks)
            # checks OUT PY JOBS MODE BOX ENTRY...: `ropecheck check TARGET $CHECK_ARGS --mode
            # MODE` of each ENTRY (name|target and its flags), JOBS at a time, each in a box of
            # BOX seconds (cut to what this step's own box has left: GPU_RUN_LEFT), each a row
            # check-NAME-MODE of steps.tsv, its JSON and JUnit in OUT/checks/
            out=$1; py=$2; jobs=$3; mode=$4; box=$5; shift 5
            read -ra common <<<"${CHECK_ARGS:-}"
            deadline=$(( $(date +%s) + ${GPU_RUN_LEFT:-100000} - 5 ))
            has_flashinfer=0
            "$py" -c "import flashinfer" >/dev/null 2>&1 && has_flashinfer=1
            status=0 running=0
            row() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$out/steps.tsv"
                    printf 'gpu-run: %-34s %-9s %5s s  %s\n' "$1" "$2" "$3" "$5"; }
            for entry in "$@"; do
                IFS='|' read -r name target <<<"$entry"
                step_name=check-$name-$mode
                if [ "$name" = flashinfer ] && [ $has_flashinfer = 0 ]; then
                    row "$step_name" skipped 0 - "flashinfer is not installed (its wheel is not brought: see ci/gpu-wheels.sh)"
                    continue
                fi
                left=$(( deadline - $(date +%s) ))
                if [ $left -lt 15 ]; then
                    row "$step_name" skipped 0 - "no time left in the step's box"
                    continue
                fi
                this_box=$box
                [ "$this_box" -gt "$left" ] && this_box=$left
                # shellcheck disable=SC2086  # the target's words
                cmd=("$py" -m ropecheck check $target "${common[@]}" --mode "$mode"
                     --json "$out/checks/$name-$mode.json" --junit "$out/checks/$name-$mode.xml")
                quoted=$(printf '%q ' "${cmd[@]}")
                printf '%s\t%s\n' "$step_name" "${quoted% }" >>"$out/commands.tsv"
                ( log=$out/logs/$step_name.log
                  { echo "# ${quoted% }"; echo "# time box ${this_box} s"; } >"$log"
                  begin=$SECONDS
                  timeout -k 10 "$this_box" "${cmd[@]}" >>"$log" 2>&1 </dev/null
                  rc=$?
                  took=$((SECONDS - begin))
                  case $rc in
                      0) row "$step_name" passed "$took" 0 "" ;;
                      124|137) row "$step_name" timeout "$took" "$rc" "stopped at its ${this_box} s box" ;;
                      *) row "$step_name" failed "$took" "$rc" \
                             "$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160 | tr '\t' ' ')" ;;
                  esac
                  [ $rc = 0 ] ) &
                running=$((running + 1))
                if [ $running -ge "$jobs" ]; then wait -n || status=1; running=$((running - 1)); fi
            done
            while [ $running -gt 0 ]; do wait -n || status=1; running=$((running - 1)); done
            exit $status ;;
        presets)
            # presets OUT PY JOBS CHECK_ARGS...: every library interface (--api) called with a
            # kernel in its signature (tests/path_kernels.py and the other test kernels), JOBS
            # at a time: its plan of argument classes, its KV-cache conventions and its size
            # switches made on the device. A correct kernel must pass (exit 0) and the planted
            # one fail (exit 1); each check's JSON record in OUT/checks/preset-NAME.json
            out=$1; py=$2; jobs=$3; shift 3
            k=tests/path_kernels.py; p=tests/preset_kernels.py; s=tests/serving_kernels.py
            presets=("vllm|$k:vllm_rows_correct --api vllm|0"
                     "vllm-partial-warp-chunk|$k:vllm_warp_chunk_partial --api vllm --rotary-dim 32|1"
                     "flashinfer-cos-sin-cache|$p:flashinfer_cache_correct --api flashinfer-cos-sin-cache|0"
                     "flashinfer-pos-ids|$p:pos_ids_correct --api flashinfer-pos-ids|0"
                     "flash-attn|$k:flash_varlen_correct --api flash-attn|0"
                     "hf|$k:hf_rows_correct --api hf|0"
                     "te|$k:te_rows_correct --api te|0"
                     "megatron|$p:megatron_correct --api megatron|0"
                     "vllm-kvcache|$s:vllm_kv_correct --api vllm-kvcache|0"
                     "sglang-kvcache|$k:sglang_kv_slot0_correct --api sglang-kvcache|0")
            [ "$jobs" = quick ] && { presets=("${presets[0]}"); jobs=1; }
            status=0 running=0
            for entry in "${presets[@]}"; do
                IFS='|' read -r name target expect <<<"$entry"
                # shellcheck disable=SC2086  # the target's words
                ( "$py" -m ropecheck check $target --layout half "$@" --json "$out/checks/preset-$name.json" \
                      >"$out/logs/preset-$name.log" 2>&1
                  rc=$?
                  verdict=$([ $rc = "$expect" ] && echo as-expected || echo UNEXPECTED)
                  paths=$(grep -m1 '^interface paths' "$out/logs/preset-$name.log" | cut -c1-120)
                  echo "$name: exit $rc (expected $expect) $verdict; $paths"
                  [ $rc = "$expect" ] ) &
                running=$((running + 1))
                if [ $running -ge "$jobs" ]; then wait -n || status=1; running=$((running - 1)); fi
            done
            while [ $running -gt 0 ]; do wait -n || status=1; running=$((running - 1)); done
            exit $status ;;
        *) echo "gpu-run: unknown internal step $internal" >&2; exit 2 ;;
    esac
fi

if [ $# -ne 1 ]; then usage >&2; exit 2; fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
mode=gpu
[ $rehearse = 1 ] && mode=rehearsal
if [ $quick = 1 ] && [ $rehearse = 0 ]; then echo "gpu-run: --quick goes with --rehearse" >&2; exit 2; fi
py=${PYTHON:-}
if [ -z "$py" ]; then
    if [ $rehearse = 1 ] && [ -x .venv/bin/python ]; then py=$repo/.venv/bin/python; else py=python3; fi
fi
wheels=${WHEELS:-$repo/.whl}
if [ $rehearse = 1 ]; then site=${SITE:-$out/site}; else site=${SITE:-/tmp/ropecheck-site}; fi
budget=${GPU_RUN_BUDGET:-540}
reserve=20  # kept back for the report, the summary and the tarball
mkdir -p "$out/logs" "$out/checks" "$out/sanitizer" "$out/bench" "$out/docs/report-gpu"
: >"$out/steps.tsv"
: >"$out/commands.tsv"
rm -f "$out/REHEARSAL" "$out/gpu-run.tar.gz"
[ $rehearse = 1 ] && echo "CPU rehearsal: no figure here is a GPU figure" >"$out/REHEARSAL"
started=$SECONDS
if [ $rehearse = 1 ]; then
    export TRITON_INTERPRET=1  # the kernels on CPU tensors (ropecheck sets it anyway without CUDA)
else
    unset TRITON_INTERPRET      # compiled: on a GPU nothing may interpret
fi
echo "gpu-run: $mode into $out, budget $budget s, python $py ($("$py" --version 2>&1))"

selected() {  # selected STEP: whether --steps lets STEP run
    [ -z "$only" ] && return 0
    local want
    IFS=, read -ra want <<<"$only"
    for w in "${want[@]}"; do [[ $1 == "$w"* ]] && return 0; done
    return 1
}

record() {  # record STEP STATUS SECONDS EXIT NOTE
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$out/steps.tsv"
    printf 'gpu-run: %-34s %-9s %5s s  %s\n' "$1" "$2" "$3" "$5"
}

step() {  # step NAME BOX_SECONDS COMMAND...: run it time-boxed, logged and recorded
    local name=$1 box=$2
    shift 2
    selected "$name" || return 0
    local left=$((budget - (SECONDS - started) - reserve))
    if [ $left -lt 20 ]; then
        record "$name" skipped 0 - "no time left in the $budget s budget"
        return 0
    fi
    [ "$box" -gt "$left" ] && box=$left
    local quoted
    quoted=$(printf '%q ' "$@")
    printf '%s\t%s\n' "$name" "${quoted% }" >>"$out/commands.tsv"
    local log=$out/logs/$name.log begin=$SECONDS rc rows
    rows=$(wc -l <"$out/steps.tsv")
    { echo "# ${quoted% }"; echo "# time box ${box} s"; } >"$log"
    GPU_RUN_LEFT=$box timeout -k 15 "$box" "$@" >>"$log" 2>&1 </dev/null
    rc=$?
    local took=$((SECONDS - begin))
    # the rows a step of several checks recorded itself, said here too
    tail -n +$((rows + 1)) "$out/steps.tsv" | while IFS=$'\t' read -r n st sec _ note; do
        printf 'gpu-run: %-34s %-9s %5s s  %s\n' "$n" "$st" "$sec" "$note"
    done
    case $rc in
        0) record "$name" passed "$took" 0 "" ;;
        124|137) record "$name" timeout "$took" "$rc" "stopped at its ${box} s box" ;;
        *) record "$name" failed "$took" "$rc" "$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160 | tr '\t' ' ')" ;;
    esac
    return 0
}

self=("$BASH" "$repo/ci/gpu-run.sh")

# -- 1. install (first, so that the envelope sees the libraries brought along)
step install 180 "${self[@]}" --internal install "$wheels" "$site" "$py" "$mode" "$out"
if [ $mode = gpu ] && [ -d "$site" ] && grep -q "^install	passed" "$out/steps.tsv"; then
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi

# -- 2. envelope
envelope_args=()
[ $rehearse = 1 ] && envelope_args=(--rehearse)
step envelope 120 "$py" ci/gpu_report.py envelope "$out" "${envelope_args[@]}"
if [ $mode = gpu ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi >"$out/logs/nvidia-smi.log" 2>&1
fi

# -- 3. the kernel's tests (compiled on a GPU; interpreted in the rehearsal)
kernel_tests=(-m pytest -q tests/test_triton_kernel.py -p no:cacheprovider -p no:xdist
              --junitxml "$out/kernel-tests.xml")
if [ $quick = 1 ]; then
    kernel_tests+=(-k "(matches_reference and float32 and half and None) or q_and_k_in_one_launch")
fi
step kernel-tests 110 "$py" "${kernel_tests[@]}"

# -- 4. the sanitizer: the two planted kernels (memcheck must report them) and `triton` (clean);
# the reference property alone: memcheck reports a bad access at the first call that makes one
planted=tests/gpu_kernels.py
sanitized=("past_row_read|found|$planted:past_row_read --layout half|memcheck_past_row_read"
           "past_head_store|found|$planted:past_head_store --layout half|memcheck_past_head_store"
           "triton|clean|triton|clean")
[ $quick = 1 ] && sanitized=("${sanitized[0]}" "${sanitized[2]}")
for entry in "${sanitized[@]}"; do
    IFS='|' read -r name expect target sample <<<"$entry"
    if [ $rehearse = 1 ]; then
        step "sanitize-$name" 60 "${self[@]}" --internal sanitize-sample "$name" "$expect" "$out" "$py" \
            "tests/data/sanitizer/$sample.txt"
    else
        # shellcheck disable=SC2086  # the target's words
        step "sanitize-$name" 60 "${self[@]}" --internal sanitize "$name" "$expect" "$out" "$py" \
            $target --device cuda --profile ci --dtype bfloat16 --property reference --max-examples 3 --timeout 50
    fi
done

# -- 5. the throughput benchmark, with the copy baseline
step bench 75 "${self[@]}" --internal bench "$out" "$py" "$rehearse" main

# -- 6. ropecheck check over every GPU target, GPU_RUN_JOBS side by side, one row per target
# and mode (a box that stops one keeps the others' records): eager, then the project's
# kernel at production sizes, then compile and cudagraph
if [ $rehearse = 1 ]; then
    check_args="--device cpu --profile ci --dtype float32"
    [ $quick = 1 ] && check_args+=" --max-examples 2 --property reference"
    jobs=${GPU_RUN_JOBS:-2}
else
    check_args="--device cuda --profile ci --dtype bfloat16"
    jobs=${GPU_RUN_JOBS:-4}
fi
export CHECK_ARGS=$check_args
# name|target and its flags
targets=("triton|triton"
         "triton-qk|triton-qk"
         "triton-packed|triton-packed"
         "triton-interleaved|triton-interleaved --rotary-dim 64"
         "liger-kernel|liger-kernel"
         "flash-attn-rotary|flash-attn-rotary"
         "flash-attn-rotary-offsets|flash-attn-rotary-offsets"
         "flash-attn-rotary-interleaved|flash-attn-rotary-interleaved"
         "flash-attn-rotary-inplace|flash-attn-rotary-inplace"
         "flash-attn-rotary-interleaved-offsets|flash-attn-rotary-interleaved-offsets"
         "flash-attn-rotary-interleaved-inplace|flash-attn-rotary-interleaved-inplace"
         "hf-llama|hf-llama"
         "flashinfer|$planted:flashinfer_rope --layout half")
if [ $quick = 1 ]; then
    targets=("triton|triton")
elif [ $rehearse = 1 ]; then
    # the interpreter runs the Triton libraries slowly; FlashInfer needs CUDA
    targets=("${targets[0]}" "${targets[1]}" "${targets[2]}" "${targets[4]}" "${targets[5]}"
             "${targets[11]}" "planted-past_row_read|$planted:past_row_read --layout half")
fi
# each check's own box: the first H100 run's ci checks took 47 to 67 s on their own
step checks-eager 200 "${self[@]}" --internal checks "$out" "$py" "$jobs" eager 90 "${targets[@]}"
if [ $rehearse = 0 ]; then  # the project's kernel at production sizes (the input past 2^31 included)
    step check-triton-production 150 "$py" -m ropecheck check triton --device cuda --profile production \
        --dtype bfloat16 --json "$out/checks/triton-production.json" --junit "$out/checks/triton-production.xml"
    compiled=("${targets[0]}" "${targets[1]}" "${targets[4]}" "${targets[5]}" "${targets[11]}")
    step checks-compile 120 "${self[@]}" --internal checks "$out" "$py" "$jobs" compile 110 "${compiled[@]}"
    step checks-cudagraph 90 "${self[@]}" --internal checks "$out" "$py" "$jobs" cudagraph 80 "${compiled[@]}"
fi

# -- 7. every library interface (--api) on the device: its argument classes, conventions and
# size switches made there (CUDA tensors from every draw), a planted size-switch bug among them
if [ $rehearse = 1 ]; then
    preset_args=(--device cpu --profile ci --dtype float32 --property reference --max-examples 2)
    preset_jobs=2
    [ $quick = 1 ] && preset_jobs=quick
else
    preset_args=(--device cuda --profile ci --dtype bfloat16)
    preset_jobs=5
fi
step presets 60 "${self[@]}" --internal presets "$out" "$py" "$preset_jobs" "${preset_args[@]}"

# -- 8. HF's code under torch.compile benchmarked; the kernel compiled ahead of time (sm_90a, sm_80)
step bench-compiled 60 "${self[@]}" --internal bench "$out" "$py" "$rehearse" compiled
aot_scope=ci
[ $quick = 1 ] && aot_scope=main
step aot 45 "$py" -m ropecheck.kernels.aot --scope "$aot_scope" --json "$out/aot.json" \
    --markdown "$out/docs/report-gpu/aot.md"

# -- 9. the report, the summary, the tarball (outside the budget's steps: always made)
begin=$SECONDS
printf '%s\t%s\n' report "$py ci/gpu_report.py report $out" >>"$out/commands.tsv"
if "$py" ci/gpu_report.py report "$out" >"$out/logs/report.log" 2>&1; then
    record report passed $((SECONDS - begin)) 0 ""
else
    record report failed $((SECONDS - begin)) 1 "see logs/report.log"
fi
"$py" ci/gpu_report.py summary "$out"
part=$(mktemp "${TMPDIR:-/tmp}/gpu-run.XXXXXX")
tar -czf "$part" --exclude="$(basename "$out")/site" --exclude="$(basename "$out")/wheels" \
    -C "$(dirname "$out")" "$(basename "$out")" && mv "$part" "$out/gpu-run.tar.gz"
echo "gpu-run: $(( SECONDS - started )) s in all; $out/summary.md; $out/gpu-run.tar.gz ($(du -k "$out/gpu-run.tar.gz" | cut -f1) KiB)"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$OUT" != "$out" ]; then  # the device tool brings $OUT back
    cp "$out/gpu-run.tar.gz" "$out/summary.md" "$OUT/" && echo "gpu-run: copied the tarball and summary.md to $OUT"
fi
# exit 1 when a step failed or ran out of time (everything above is written either way)
if cut -f2 "$out/steps.tsv" | grep -qxE 'failed|timeout'; then exit 1; fi
exit 0
