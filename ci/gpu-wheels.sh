#!/usr/bin/env bash
# ci/gpu-wheels.sh [DIR]: the wheels a GPU run (ci/gpu-run.sh) needs on a CUDA machine that
# cannot reach a package registry, downloaded (or built) here into DIR (default .whl/).
#
# The target machine: Python 3.12, manylinux x86_64, with torch 2.11 (CUDA 13), triton 3.6,
# transformers 5.17, hypothesis, pytest, pytest-benchmark, numpy, scipy, sympy, mpmath,
# click, rich and matplotlib already there (the device README's package list), so every
# wheel is fetched with --no-deps and each missing dependency is named here:
#   ropecheck        built from this checkout (its dependencies are all on the machine)
#   covertable       3.2.0, pure Python, no dependencies: ropecheck's pairwise plans of an
#                    interface's argument classes (properties/interfaces/space.py)
#   liger-kernel     0.8.5, pure Python (needs torch and triton: there)
#   flash-attn       2.8.3.post2: PyPI has only an sdist (the CUDA extension is built at
#                    install time); built here with FLASH_ATTENTION_SKIP_CUDA_BUILD, a wheel
#                    of its Python files: ropecheck's adapters load its Triton rotary kernel
#                    from that file, the CUDA extension is not needed
# Not brought (said again at the end of the run):
#   flashinfer-python 0.7.2.post1: its wheel alone is 62 MB (420 MB unpacked; JIT sources,
#                    CUTLASS and CCCL headers), and it needs apache-tvm-ffi, cuda-python,
#                    cuda-tile, nccl-extensions, nccl4py, nvidia-cudnn-frontend and
#                    nvidia-cutlass-dsl besides: more than the 64 MiB a device call carries
#   vllm, sgl-kernel, transformer-engine: large CUDA builds; not tried
#
# DIR gets a .gitignore of '*', so git (and the device tool) ignore it; name it in the
# device call's `carry`. Prints what is in DIR and its size. Needs .venv (ci/install.sh)
# for the flash-attn build, and network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
py=${PYTHON:-.venv/bin/python}
limit_mib=64
mkdir -p "$dir"
printf '*\n' >"$dir/.gitignore"
log="$dir/gpu-wheels.log"
: >"$log"

platform=(--python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any)
declare -a missing=()

step() {  # step WHAT COMMAND...
    local what=$1 start=$SECONDS
    shift
    printf 'gpu-wheels: %s ... ' "$what"
    if "$@" >>"$log" 2>&1; then
        echo "done ($((SECONDS - start)) s)"
    else
        echo "FAILED (see $log)"
        missing+=("$what: failed here (see $log)")
    fi
}

rm -f "$dir"/*.whl
step "covertable 3.2.0" "$py" -m pip download --disable-pip-version-check --no-deps \
    --only-binary=:all: "${platform[@]}" -d "$dir" covertable==3.2.0
step "liger-kernel 0.8.5" "$py" -m pip download --disable-pip-version-check --no-deps \
    --only-binary=:all: "${platform[@]}" -d "$dir" liger-kernel==0.8.5
src=$(mktemp -d)  # built from a copy: a build in the checkout leaves build/ and *.egg-info
cp -r pyproject.toml README.md ropecheck properties reference "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
step "ropecheck (this checkout)" "$py" -m pip wheel --disable-pip-version-check --no-deps -w "$dir" "$src"
rm -rf "$src"
step "flash-attn 2.8.3.post2 (Python files only, no CUDA build)" \
    env FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE \
    "$py" -m pip wheel --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$dir" flash-attn==2.8.3.post2

missing+=("flashinfer-python: its wheel alone is 62 MB (420 MB unpacked) and it needs apache-tvm-ffi, cuda-python, cuda-tile, nccl-extensions, nccl4py, nvidia-cudnn-frontend and nvidia-cutlass-dsl: over the 64 MiB a device call carries")
missing+=("vllm, sgl-kernel, transformer-engine: large CUDA builds, not tried")

echo "gpu-wheels: in $dir:"
for wheel in "$dir"/*.whl; do
    [ -e "$wheel" ] && printf '  %8s  %s\n' "$(du -k "$wheel" | cut -f1) KiB" "$(basename "$wheel")"
done
size_kib=$(du -sk "$dir" | cut -f1)
tree_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n 1 | cut -f1)
echo "gpu-wheels: $dir holds $size_kib KiB; the tracked tree $tree_kib KiB; together $(( (size_kib + tree_kib) / 1024 )) MiB of the $limit_mib MiB a device call carries"
if (( size_kib + tree_kib > limit_mib * 1024 )); then
    echo "gpu-wheels: WARNING: over $limit_mib MiB"
fi
echo "gpu-wheels: not brought:"
printf '  - %s\n' "${missing[@]}"
