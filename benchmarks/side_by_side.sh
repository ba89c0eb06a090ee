#!/usr/bin/env bash
# benchmarks/side_by_side.sh OLD_TREE NEW_TREE [ROUNDS]
#
# Whole-process verdict times of two checkouts of ropecheck (e.g. `git worktree add
# /tmp/old main`), alternating old and new run by run so that a busy machine slows both
# alike: wall and CPU (user + system of the process and the children it reaped) from
# /usr/bin/time, and the median of each. The runs: the ci float32 verdict of a rotate-half
# kernel in a file through its worker and --in-process (ROUNDS, default 5), README's
# default run and the same ci verdict in eager + compile modes (3 each), a target that hangs
# (20 s call limit) and `identify` on one that aborts (once each). Both trees run with this
# checkout's interpreter (.venv/bin/python), each on its own PYTHONPATH.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); rounds=${3:-5}
py=${PYTHON:-$here/../.venv/bin/python}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
cp "$here/rotate_half_kernel.py" "$work/rh.py"
cat > "$work/kern.py" <<'KERNELS'
import os, time
def hang(x, positions):
    time.sleep(10**6)
def abort(x, positions):
    os.abort()
KERNELS
cd "$work"
run() {  # label tree args...
    local label=$1 tree=$2; shift 2
    /usr/bin/time -f "%e %U %S" -o time.txt env PYTHONPATH="$tree" "$py" -m ropecheck "$@" > out.txt 2>&1
    local rc=$? e u s
    read -r e u s < <(tail -1 time.txt)
    echo "$label rc=$rc wall=$e cpu=$(python3 -c "print(round($u + $s, 2))")"
}
CI=(check rh.py:rope --layout half --base 10000 --profile ci --dtype float32)
{
    for _ in $(seq "$rounds"); do for side in old new; do tree=${!side}
        run "$side ci-worker" "$tree" "${CI[@]}"
        run "$side ci-in-process" "$tree" "${CI[@]}" --in-process
    done; done
    for _ in 1 2 3; do for side in old new; do tree=${!side}
        run "$side default-run" "$tree" check
        run "$side eager+compile" "$tree" "${CI[@]}" --mode eager --mode compile
    done; done
    for side in old new; do tree=${!side}
        run "$side hang" "$tree" check kern.py:hang --layout half --profile ci --dtype float32
        run "$side identify-abort" "$tree" identify kern.py:abort
    done
} | tee runs.txt
echo "medians:"
python3 - runs.txt <<'SUMMARY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    label, wall, cpu = re.match(r"(.+) rc=\S+ wall=(\S+) cpu=(\S+)", line).groups()
    runs.setdefault(label, []).append((float(wall), float(cpu)))
for label, values in runs.items():
    walls, cpus = zip(*values)
    print(f"  {label}: wall {statistics.median(walls):.2f} s, cpu {statistics.median(cpus):.2f} s ({len(values)} runs)")
SUMMARY
