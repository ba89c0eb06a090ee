#!/usr/bin/env bash
# The project's test command (the same one README.md gives): lint, format and type checks,
# the tests, then the CLI's CI profile on the embedded default target with JUnit output.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
# lint, format and types of ropecheck/, properties/ and reference/ (pyproject.toml)
.venv/bin/ruff check
.venv/bin/ruff format --check
.venv/bin/mypy
# --dist worksteal: a worker that runs out of tests takes the other's queued ones (the slowest
# tests are 15 to 40 s: with "load" one worker could finish while the other had several left)
.venv/bin/python -m pytest -q -n 2 --dist worksteal --durations=20 --junitxml=out/selftest.xml  # the 20 slowest tests listed
.venv/bin/ropecheck check --profile ci --json out/ropecheck.json --junit out/ropecheck.xml
