#!/usr/bin/env bash
# Create .venv and install ropecheck with the CPU build of torch, triton (the project's own
# kernel and the Triton adapters run under the Triton interpreter on CPU), and the
# third-party RoPE libraries its adapters check. Every pip command pins torch==2.13.0:
# unpinned, a dependency pulls the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip=".venv/bin/pip install --quiet"
.venv/bin/pip install --quiet --upgrade pip
$pip torch==2.13.0 -e '.[libraries]'
# timm: `import timm` needs a torchvision that matches torch; its sincos module loads alone
$pip --no-deps timm==1.0.31
# flash-attn: only its Triton rotary file is used; skip building the CUDA extension
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE \
    $pip --no-build-isolation --no-deps flash-attn==2.8.3.post2
