#!/usr/bin/env bash
# The project's test command (the same one README.md gives), plus the CLI's CI profile on
# the embedded default target with JUnit output.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
.venv/bin/python -m pytest -q --junitxml=out/selftest.xml
.venv/bin/ropecheck check --profile ci --json out/ropecheck.json --junit out/ropecheck.xml
