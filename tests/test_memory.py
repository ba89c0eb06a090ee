"""The processes ropecheck owns keep freed memory for the next call (``calling.memory``):
once the heap has settled, a large tensor allocated again after it was freed costs no new
page faults, where glibc's default (a fresh mmap per large allocation) faults in every page
each time."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import resource, sys
    from ropecheck.calling import memory
    if sys.argv[1] == "keep":
        assert memory.keep_freed_memory()
    import torch
    torch.set_num_threads(1)  # one heap: a thread pool's threads allocate from arenas of their own
    faults = []
    # 64 MiB each time (above glibc's largest mmap threshold, 32 MiB), freed at once: as the
    # calls of a large input
    for _ in range(30):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(2**23, dtype=torch.float64).sum()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(*faults)
""")
PAGES = 2**26 // 4096


def page_faults(mode: str) -> list:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [int(n) for n in done.stdout.split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_large_tensor_is_reused_without_page_faults():
    assert min(page_faults("default")[-3:]) > PAGES // 2  # every page faulted in again, every time
    # The heap's freed memory, reused once the heap has settled. It takes a few calls: a small
    # allocation that lands in the freed block (the interpreter's, between two calls) leaves it
    # too short, and that call takes fresh pages at the heap's top. Seen here: 6 to 10 calls
    # before every later one faults in nothing (once in CI the 10th of 12 still faulted).
    settled = page_faults("keep")[-10:]
    assert sum(faults > PAGES // 10 for faults in settled) <= 1, settled


def test_importing_collects_nothing_inside_and_freezes_what_it_imported():
    import gc

    from ropecheck.calling import memory

    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    try:
        with memory.importing():
            assert not gc.isenabled()
            kept = [[] for _ in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(kept)
    finally:
        gc.unfreeze()  # the test session's own objects go back to the collector
        gc.enable()


GC_TARGET = textwrap.dedent("""
    import gc
    import torch
    def rope(x, positions):
        if not gc.isenabled():  # the worker calls with the collector off: garbage would pile up
            raise RuntimeError("the garbage collector is off during the call")
        return x.clone()
""")


def test_the_ropecheck_command_calls_its_target_with_the_collector_on(tmp_path):
    """The command imports with the collector off, and its zygote and workers are forked
    then: the worker turns it back on once its target is loaded."""
    (tmp_path / "gc_target.py").write_text(GC_TARGET)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ropecheck",
            "check",
            "gc_target.py:rope",
            "--profile",
            "ci",
            "--dtype",
            "float32",
            "--property",
            "statelessness",
            "--max-examples",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "PASSED" in done.stdout, done.stdout + done.stderr
