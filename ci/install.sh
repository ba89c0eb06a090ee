#!/usr/bin/env bash
# Create .venv (if missing) and install ropecheck with the CPU build of torch, and triton
# for the project's own kernel (run under the Triton interpreter on CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet torch==2.13.0 -e '.[triton]'
