"""Worker processes forked from the zygote (a fork of ropecheck made before it ran torch):
they serve calls, their ends (an exit, a signal) are told as a child's are, a kill stops
them, and without a zygote (or with a dead one) a worker is a fresh interpreter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ropecheck.calling import spawn
from ropecheck.calling.messages import Exit, dumps
from ropecheck.calling.worker import cores

KERNELS = str(Path(__file__).with_name("mode_kernels.py"))


@pytest.fixture
def zygote():
    if spawn._zygote is None or not spawn._zygote.alive():
        pytest.skip("no zygote in this test process (tests/conftest.py forks it)")
    return spawn._zygote


def _stop(started):
    started.conn.close()
    for log in (started.crash_log, started.output_log):
        if log:
            Path(log).unlink(missing_ok=True)


def test_a_worker_forks_from_the_zygote_and_ends_as_a_child_does(zygote):
    started = spawn.start()
    assert isinstance(started.proc, spawn.Forked) and started.proc.pid != os.getpid()
    assert started.proc.poll() is None  # serving
    started.conn.send_bytes(dumps(Exit()))
    assert started.proc.wait(timeout=10) == 0
    _stop(started)


def test_a_killed_worker_ends_by_its_signal_and_a_running_one_times_out(zygote):
    started = spawn.start()
    with pytest.raises(subprocess.TimeoutExpired):
        started.proc.wait(timeout=0.2)
    started.proc.kill()
    assert started.proc.wait(timeout=10) == -signal.SIGKILL
    started.proc.kill()  # an ended worker: nothing to kill, no error
    _stop(started)


def test_a_crash_in_a_forked_worker_is_a_finding_with_its_signal(tmp_path):
    from tests.test_cli import check

    kernel = tmp_path / "crash.py"
    kernel.write_text("import os\n\ndef rope(x, positions):\n    os.abort()\n")
    result = check(f"{kernel}:rope", "--layout", "half", "--dtype", "float32", "--profile", "ci")
    assert result.exit_code in (1, 2), result.output
    assert "SIGABRT" in result.output and "crash.py:4 in rope" in result.output


def test_without_a_zygote_a_worker_is_a_fresh_interpreter(monkeypatch):
    monkeypatch.setattr(spawn, "_zygote", None)
    started = spawn.start()
    assert isinstance(started.proc, subprocess.Popen)
    started.proc.kill()
    started.proc.wait()
    _stop(started)


def test_a_dead_zygote_leaves_workers_to_fresh_interpreters(monkeypatch):
    dead = spawn.Zygote(())
    os.kill(dead.pid, signal.SIGKILL)
    os.waitpid(dead.pid, 0)
    monkeypatch.setattr(spawn, "_zygote", dead)
    started = spawn.start()
    assert isinstance(started.proc, subprocess.Popen) and not dead.alive()
    started.proc.kill()
    started.proc.wait()
    _stop(started)


def test_a_checks_worker_is_forked_not_a_fresh_interpreter(tmp_path):
    """A fresh interpreter is this process's child and takes more than a second of CPU
    (its start and torch's import) before its first call; a forked worker is the
    zygote's child, so none of its CPU is counted here."""
    from tests.test_cli import check

    before = os.times()
    result = check(
        f"{KERNELS}:correct",
        "--layout",
        "half",
        "--dtype",
        "float32",
        "--profile",
        "ci",
        "--property",
        "identity",
        "--max-examples",
        "2",
    )
    after = os.times()
    assert result.exit_code == 0, result.output
    children = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    assert children < 0.5, children  # the forked worker is the zygote's child: not counted here at all


def test_a_zygote_is_forked_only_while_no_thread_has_started_since_torch_was_imported():
    """Running torch starts OpenMP's pool (a thread per core), which a fork cannot take
    along: after that the pytest plugin's workers start as fresh interpreters."""
    code = (
        "import torch; from ropecheck.calling import spawn; b = spawn.threads(); "
        "print(spawn.unthreaded_since(b)); torch.ones(10**6).exp(); print(spawn.unthreaded_since(b)); "
        "print(spawn.unthreaded_since(0))"
    )
    if cores() < 2:
        pytest.skip("one core: torch's pool starts no thread")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "False", "False"], done.stdout + done.stderr


@pytest.mark.parametrize("argv, forks", [(["report", "--target", "rotate-half"], True),
                                         (["check", "--in-process"], False), (["list"], False)])
def test_the_commands_that_run_targets_in_workers_fork_them_from_a_zygote(argv, forks):
    """``check``, ``identify`` and ``report`` (a worker per target) fork their workers from
    a zygote made before ropecheck runs torch; a fresh interpreter per worker would import
    torch again (1.3 s of CPU each)."""
    code = f"from ropecheck.calling import spawn; spawn.prestart({argv!r}); print(spawn._zygote is not None)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == [str(forks)], done.stdout + done.stderr


def test_an_eager_verdict_imports_no_sympy(tmp_path):
    """torch.autograd.grad's shape check imports torch's symbolic shapes and sympy (a
    second, more than a ci verdict's calls); an eager backward goes to autograd's engine
    past it (``execution._grad``). mpmath (0.1 s), the float64 reference's own judge, is
    imported only where it is used. Pinned in a fresh interpreter, --in-process, so that the
    calls run in the process looked at."""
    code = (
        "import sys\n"
        "from ropecheck.cli import main\n"
        f"sys.argv = ['ropecheck', 'check', {KERNELS + ':correct'!r}, '--layout', 'half', '--profile', 'ci',"
        " '--dtype', 'float32', '--max-examples', '3', '--property', 'backward', '--property', 'inverse',"
        " '--in-process']\n"
        "try:\n    main()\nexcept SystemExit as end:\n    code = end.code\n"
        "print('exit', code, 'sympy', 'sympy' in sys.modules, 'mpmath', 'mpmath' in sys.modules, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "exit 0 sympy False mpmath False" in proc.stderr, proc.stdout + proc.stderr


def compiler_loaded(*args):
    """A loader whose description says whether torch.compile's machinery was there when
    the target loaded (test below)."""
    return (lambda x, positions: x), "torch._inductor.compile_fx" in sys.modules


@pytest.mark.parametrize("argv, warmed", [(["check", "t", "--mode", "eager", "--mode", "compile"], True),
                                          (["check", "t", "--mode=eager"], False)])
def test_a_compile_run_s_worker_warms_torch_compile_while_ropecheck_starts(argv, warmed):
    """The first worker of a run with --mode compile imports dynamo and inductor and
    compiles a small function before its target loads (about 4 s that a first compile
    call waited for, now spent while ropecheck imports its CLI and prepares the run); an
    eager run's worker does not."""
    code = (
        "import pickle, sys\n"
        "from ropecheck.calling import spawn\n"
        "from ropecheck.calling.messages import Load, dumps\n"
        f"spawn.prestart({argv!r})\n"
        "started = spawn.take()\n"
        "started.conn.send_bytes(dumps(Load(list(sys.path), 'tests.test_spawn:compiler_loaded', ())))\n"
        "print('loaded with the compiler:', pickle.loads(started.conn.recv_bytes()).info)\n"
        "spawn.stop(started)\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=root)
    assert f"loaded with the compiler: {warmed}" in proc.stdout, proc.stdout + proc.stderr


def raising_entry(fd: int, crash_log: str) -> None:
    """A worker's loop with a bug of ropecheck's own (tests fork it in place of serve)."""
    raise ValueError("storages of two sizes compared")


def test_an_exception_that_escapes_the_worker_s_loop_is_its_last_output(zygote):
    """Found on an H200: an error of ropecheck's own code in the worker (outside the
    target's call) ended it with exit status 0 and no word; it is now exit status 1 with
    the traceback in the worker's output, which the crash finding quotes."""
    started = spawn.fork(f"{__name__}:raising_entry")
    assert started is not None
    assert started.proc.wait(timeout=10) == 1
    assert "ValueError: storages of two sizes compared" in Path(started.output_log).read_text()
    _stop(started)
