"""A run's checks shared with a helper process (``--jobs``, ``ropecheck.session.helper``):
each check runs once, in one of the two, and the verdicts, results and counterexamples are
those of the same run in one process; a helper that dies leaves its checks to ropecheck."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ropecheck.session.sharing import SharedRows

MUTANTS = str(Path(__file__).with_name("mutants.py"))
KERNELS = str(Path(__file__).with_name("mode_kernels.py"))


def test_every_row_is_handed_out_once_in_each_process_s_order_until_the_run_stops():
    rows = SharedRows.create(6)
    other = SharedRows(rows.path, rows.count)  # the helper's view of the same rows
    leader, helper = [4, 5, 0, 1, 2, 3], [0, 1, 2, 3]  # rows 4 and 5 are the leader's alone
    try:
        taken = [rows.claim(leader), other.claim(helper), other.claim(helper), rows.claim(leader), rows.claim(leader)]
        assert taken == [4, 0, 1, 5, 2]
        other.stop("the target hung in relativity (float32)")
        assert rows.claim(leader) is None and other.claim(helper) is None  # row 3 is nobody's: the run stopped
        rows.stop("a later reason")
        assert rows.stopped == "the target hung in relativity (float32)" and rows.taken == [0, 1, 2, 4, 5]
    finally:
        other.close()
        rows.close(remove=True)
    assert not os.path.exists(rows.path)


def test_a_process_takes_nothing_outside_its_order():
    rows = SharedRows.create(3)
    try:
        assert [rows.claim([0, 2]), rows.claim([0, 2]), rows.claim([0, 2])] == [0, 2, None]
        assert rows.claim([0, 1, 2]) == 1 and rows.claim([0, 1, 2]) is None
        assert rows.taken == [0, 1, 2] and rows.stopped == ""
    finally:
        rows.close(remove=True)


def run_check(cwd, target: str, jobs: int, *args: str) -> dict:
    out = Path(cwd) / f"jobs{jobs}.json"
    done = subprocess.run(
        [sys.executable, "-m", "ropecheck", "check", target, "--layout", "half", "--jobs", str(jobs),
         "--json", str(out), *args],
        capture_output=True, text=True, timeout=600, cwd=cwd,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    record = json.loads(out.read_text())
    record["exit"] = done.returncode
    return record


def compared(record: dict) -> list:
    """What a result says, less the seconds it took."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in record["results"]]


@pytest.mark.parametrize("kernel", ["correct", "wrong_base"])
def test_a_shared_run_gives_the_results_of_the_same_run_in_one_process(tmp_path, kernel):
    """The same seed, every dtype: each check's status, largest error, examples,
    counterexample and reproduce line are the same with a helper as without (a wrong base
    fails the same checks on the same minimal inputs)."""
    source = KERNELS if kernel == "correct" else MUTANTS
    args = ("--profile", "dev", "--seed", "7", "--max-examples", "4")
    alone = run_check(tmp_path, f"{source}:{kernel}", 1, *args)
    shared = run_check(tmp_path, f"{source}:{kernel}", 2, *args)
    assert shared["exit"] == alone["exit"] == (0 if kernel == "correct" else 1)
    assert compared(shared) == compared(alone)
    assert len(alone["results"]) == 4 * 14  # the range probe and 13 properties in four dtypes


COUNTING = textwrap.dedent("""
    import os
    from mode_kernels import correct  # copied beside this file

    def rope(x, positions):
        with open("calls-%d" % os.getpid(), "a") as log:
            log.write(".")
        return correct(x, positions)
""")


def test_the_helper_runs_checks_in_a_worker_of_its_own(tmp_path):
    shutil.copy(KERNELS, tmp_path)
    (tmp_path / "counting.py").write_text(COUNTING)
    record = run_check(tmp_path, "counting.py:rope", 2, "--profile", "ci", "--dtype", "float32",
                       "--dtype", "bfloat16", "--seed", "3", *("--property", "linearity", "--property", "relativity"),
                       *("--property", "inverse", "--property", "backward"))  # fmt: skip
    assert record["exit"] == 0
    calls = sorted(len(p.read_text()) for p in tmp_path.glob("calls-*"))
    assert len(calls) == 2, calls  # ropecheck's worker and the helper's
    assert min(calls) > 20, calls  # both ran checks, not only their warm-up's few calls


DYING_HELPER = textwrap.dedent("""
    import os
    import signal
    from mode_kernels import correct  # copied beside this file

    # The helper's worker loads the target second: on its 40th call it kills the helper
    # (its parent's parent; its parent is the helper's zygote).
    try:
        os.close(os.open("first-load", os.O_CREAT | os.O_EXCL))
        IN_HELPER = False
    except FileExistsError:
        IN_HELPER = True
    CALLS = [0]

    def rope(x, positions):
        CALLS[0] += 1
        if IN_HELPER and CALLS[0] == 40:
            with open("/proc/%d/stat" % os.getppid()) as stat:
                helper = int(stat.read().rsplit(")", 1)[1].split()[1])
            os.kill(helper, signal.SIGKILL)
        return correct(x, positions)
""")


def test_a_helper_that_dies_leaves_its_checks_to_ropecheck(tmp_path):
    shutil.copy(KERNELS, tmp_path)
    (tmp_path / "dying.py").write_text(DYING_HELPER)
    args = ("--profile", "ci", "--dtype", "float32", "--dtype", "float16", "--max-examples", "5")
    shared = run_check(tmp_path, "dying.py:rope", 2, *args)
    assert (tmp_path / "first-load").exists()
    (tmp_path / "first-load").unlink()
    alone = run_check(tmp_path, "dying.py:rope", 1, *args)
    assert shared["exit"] == alone["exit"] == 0
    assert compared(shared) == compared(alone)


def test_a_mode_run_per_process_stays_in_ropecheck_and_the_eager_checks_are_shared(tmp_path):
    """A helper takes eager checks only (a compiled model is one per process); ropecheck
    takes the other mode's first. The results are those of the run in one process."""
    args = ("--profile", "ci", "--dtype", "float32", "--mode", "eager", "--mode", "autocast", "--max-examples", "3")
    alone = run_check(tmp_path, f"{KERNELS}:matmul_angles", 1, *args)
    shared = run_check(tmp_path, f"{KERNELS}:matmul_angles", 2, *args)
    assert shared["exit"] == alone["exit"] == 1  # right in eager, wrong under autocast
    assert compared(shared) == compared(alone)
    assert {r["mode"] for r in alone["results"]} == {"eager", "autocast"}


def test_ropecheck_takes_rows_in_a_run_s_order_and_a_helper_from_the_last_one_back():
    """ropecheck's own checks then meet a stateful target in the state a run alone leaves
    it in; the checks of a compiling mode are ropecheck's alone, and first."""
    from types import SimpleNamespace

    from ropecheck.session.helper import helper_rows, leader_rows

    props = [SimpleNamespace(name=n) for n in ("identity", "inverse")]
    checks = [(d, m, p) for d in ("float32", "bfloat16") for m in ("eager", "compile") for p in props]
    session = SimpleNamespace(checks=checks)
    assert leader_rows(session) == [2, 3, 6, 7, 0, 1, 4, 5]
    assert helper_rows(session) == [5, 4, 1, 0]


SLOW = textwrap.dedent("""
    import time
    from mode_kernels import correct  # copied beside this file

    def rope(x, positions):
        time.sleep(0.05)  # slow enough that the run is far from its end when ctrl-c comes, on a loaded machine too
        return correct(x, positions)
""")


def processes_with(word: str) -> list:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and word in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_ctrl_c_on_a_shared_run_ends_every_process_of_it(tmp_path):
    """ropecheck, its zygote and worker, the helper, the helper's zygote and worker: the
    forked ones carry ropecheck's command line, so none may be left once it has ended."""
    shutil.copy(KERNELS, tmp_path)
    word = f"slow_{os.getpid()}"
    (tmp_path / f"{word}.py").write_text(SLOW)
    # ctrl-c as a terminal delivers it: an ignored SIGINT is inherited, and a test run in this
    # pytest process before (a worker's or zygote's serve called here) may have left it ignored
    proc = subprocess.Popen([sys.executable, "-m", "ropecheck", "check", f"{word}.py:rope", "--layout", "half"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 180  # until the helper's worker runs (six processes); CI is loaded
        while len(processes_with(word)) < 6 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert len(processes_with(word)) >= 6, processes_with(word)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "interrupted" in out, out
    deadline = time.monotonic() + 60  # the forked processes see their parent go, then end
    while processes_with(word) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(word) == []
