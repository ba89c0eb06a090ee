"""Run the acceptance corpus (``corpus.py``) and record every verdict, or compare with the
committed record.

    .venv/bin/python acceptance/run.py                 # run all, write acceptance/verdicts.json
    .venv/bin/python acceptance/run.py --compare       # run all, diff against verdicts.json
    .venv/bin/python acceptance/run.py -k mrope --compare   # only entries whose name has "mrope"
    .venv/bin/python acceptance/run.py -k 'axial|mrope|^nd-' --compare   # a regular expression
    .venv/bin/python acceptance/run.py --compare --recorded  # only the entries verdicts.json holds

Each entry runs as a user runs it (``ropecheck check ... --profile ci --json``, a
derandomized profile) in a process of its own, two at a time. What is recorded per entry:
the exit status, the verdict, each property x dtype x mode cell's status, and the dtypes
the target does not support; for ``identify`` entries the exit status and the flags.
Messages and error sizes are not compared (a refactor may reword a message).
Outside CI's time budget: the 264 entries took 71 minutes on a 2-core machine (2026-11-28, beside other work); the 18 coordinate entries added after them 78 s, the 11 real-bug entries after those 137 s, the 6 N-D identify entries (`identify ... --family nd`) 14 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from corpus import CHECKS, IDENTIFY  # noqa: E402

RECORD = HERE / "verdicts.json"
ROPECHECK = str(ROOT / ".venv" / "bin" / "ropecheck")
LIMIT = 1800  # seconds one entry may take


def _run(args: list, json_path: str) -> tuple[int, float, str]:
    start = time.perf_counter()
    try:
        done = subprocess.run([ROPECHECK, *args, "--json", json_path], cwd=ROOT, capture_output=True,
                              text=True, timeout=LIMIT, env={**os.environ, "COLUMNS": "200"})
        code, tail = done.returncode, (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = -1, f"did not finish within {LIMIT} s"
    return code, time.perf_counter() - start, tail


def check_entry(name: str, args: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        code, seconds, tail = _run(["check", *args, "--profile", "ci"] if "--profile" not in args
                                   else ["check", *args], path)
        record = {"exit": code, "seconds": round(seconds, 1)}
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            record["verdict"] = "no record"
            record["output"] = tail
            return record
    record["verdict"] = data.get("verdict")
    if data.get("stopped"):  # a call past the time limit stopped the run (on a loaded machine: rerun it)
        record["stopped"] = data["stopped"]
    record["unsupported"] = sorted(data.get("unsupported_dtypes") or {})
    record["cells"] = {f"{r['property']} | {r['dtype']} | {r.get('mode', 'eager')}": r["status"]
                       for r in data.get("results", [])}
    if data.get("verdict") == "unusable":
        record["reason"] = data.get("reason", "")[:200]
    return record


def identify_entry(name: str) -> dict:
    """``name``: the target, and for an N-D one its identify flags after it (split as a shell would)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "out.json")
        code, seconds, tail = _run(["identify", *shlex.split(name)], path)
        record = {"exit": code, "seconds": round(seconds, 1)}
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            record["verdict"] = "no record"
            record["output"] = tail
            return record
    ident = data.get("identification", {})
    record["rotary"] = ident.get("rotary")
    record["flags"] = ident.get("flags")
    return record


def compared(record: dict) -> dict:
    """What a comparison looks at (timings and outputs aside)."""
    return {k: v for k, v in record.items() if k not in ("seconds", "output", "reason")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", action="store_true", help="diff against verdicts.json, do not write it")
    parser.add_argument("-k", dest="pattern", default="",
                        help="only entries whose name matches this regular expression (a plain name: contains it)")
    parser.add_argument("--recorded", action="store_true", help="only entries verdicts.json holds (a change's comparison)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default=str(RECORD), help="where to write the record (default verdicts.json)")
    args = parser.parse_args()

    jobs = [(f"check {n}", check_entry, (n, a)) for n, a in CHECKS.items() if re.search(args.pattern, n)]
    jobs += [(f"identify {n}", identify_entry, (n,)) for n in IDENTIFY if re.search(args.pattern, n)]
    if args.recorded:
        recorded = json.loads(RECORD.read_text())
        jobs = [job for job in jobs if job[0] in recorded]
    results: dict = {}
    start = time.perf_counter()

    def one(job):
        key, fn, fn_args = job
        record = fn(*fn_args)
        results[key] = record
        print(f"{time.perf_counter() - start:7.0f} s  {key}: exit {record['exit']}, "
              f"{record.get('verdict', record.get('flags'))} ({record['seconds']} s)", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, jobs))
    results = dict(sorted(results.items()))
    if not args.compare:
        old = json.loads(RECORD.read_text()) if RECORD.exists() and args.pattern else {}
        old.update(results)
        Path(args.out).write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n")
        print(f"wrote {args.out}: {len(results)} entries")
        return 0
    if args.out != str(RECORD):  # the compared run's own record, to look at or to adopt
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    baseline = json.loads(RECORD.read_text())
    changes = 0
    for key, record in results.items():
        before = baseline.get(key)
        if before is None:
            print(f"NEW {key}: {compared(record)}")
            changes += 1
            continue
        a, b = compared(before), compared(record)
        if a == b:
            continue
        changes += 1
        print(f"CHANGED {key}:")
        for field in sorted(set(a) | set(b)):
            if field == "cells":
                cells_a, cells_b = a.get("cells", {}), b.get("cells", {})
                for cell in sorted(set(cells_a) | set(cells_b)):
                    if cells_a.get(cell) != cells_b.get(cell):
                        print(f"    {cell}: {cells_a.get(cell)} -> {cells_b.get(cell)}")
            elif a.get(field) != b.get(field):
                print(f"    {field}: {a.get(field)} -> {b.get(field)}")
    print(f"{len(results)} entries compared, {changes} changed")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
