#!/usr/bin/env bash
# Create .venv and install ropecheck with the CPU build of torch, triton (the project's own
# kernel and the Triton adapters run under the Triton interpreter on CPU), and the
# third-party RoPE libraries its adapters check. Every pip command pins torch==2.13.0:
# unpinned, a dependency pulls the multi-GB CUDA build.
#
# Prints one line per step; pip's own output goes to out/install.log, whose last lines
# are shown when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
log=out/install.log
: >"$log"

step() {  # step DESCRIPTION COMMAND...: run COMMAND with its output in the log
    local what=$1 start=$SECONDS
    shift
    printf 'ropecheck install: %s ... ' "$what"
    if "$@" >>"$log" 2>&1; then
        echo "done ($((SECONDS - start)) s)"
    else
        echo "FAILED"
        echo "---- last 40 lines of $log ----"
        tail -n 40 "$log"
        echo "---- the whole log: $log ----"
        exit 1
    fi
}

pip=(.venv/bin/pip install --disable-pip-version-check)
step "virtual environment .venv" python3 -m venv .venv
step "pip" "${pip[@]}" --upgrade pip
step "ropecheck, torch 2.13.0 (CPU), triton, the RoPE libraries and pytest-xdist" \
    "${pip[@]}" torch==2.13.0 -e '.[libraries,test]'
# timm: `import timm` needs a torchvision that matches torch; its sincos module loads alone
step "timm (its RoPE modules only)" "${pip[@]}" --no-deps timm==1.0.31
# flash-attn: only its Triton rotary file is used; skip building the CUDA extension
step "flash-attn (its Triton rotary only, no CUDA build)" \
    env FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE \
    "${pip[@]}" --no-build-isolation --no-deps flash-attn==2.8.3.post2
echo "ropecheck install: ready: .venv/bin/ropecheck (the full log is $log)"
