"""What a target's imports and calls print or warn stays out of ropecheck's output (issue
23: torchao's "Skipping import of cpp extensions ..." in the middle of the table); --debug
shows it; a crash's message carries the worker's last output."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ropecheck.cli import main

NOISY = '''
import os, sys, warnings
print("IMPORT-PRINT")
sys.stderr.write("IMPORT-STDERR\\n")
warnings.warn("IMPORT-WARNING")
os.write(1, b"IMPORT-FD\\n")

def rope(x, positions):
    print("CALL-PRINT")
    warnings.warn("CALL-WARNING")
    if int(positions.max()) == 999983:
        sys.stderr.write("LAST-WORDS\\n")
        sys.stderr.flush()
        os._exit(3)
    return x.clone()
'''
MARKS = ("IMPORT-PRINT", "IMPORT-STDERR", "IMPORT-WARNING", "CALL-PRINT", "CALL-WARNING")


def _run(tmp_path, *flags):
    target = tmp_path / "noisy.py"
    target.write_text(NOISY)
    return CliRunner().invoke(
        main, ["check", f"{target}:rope", "--profile", "ci", "--max-examples", "2", "--dtype", "float32",
               "--property", "identity", *flags],
    )


@pytest.mark.parametrize("flags", [(), ("--in-process",)])
def test_the_targets_output_is_captured(tmp_path, flags):
    result = _run(tmp_path, *flags)
    assert result.exit_code == 0, result.output
    for mark in MARKS + (() if flags else ("IMPORT-FD",)):  # a worker's file descriptors too
        assert mark not in result.output


def test_debug_shows_it(tmp_path, capfd):
    result = _run(tmp_path, "--debug", "--in-process")
    assert result.exit_code == 0, result.output
    shown = result.output + capfd.readouterr().err
    for mark in MARKS:
        if "WARNING" not in mark:  # pytest records warnings itself
            assert mark in shown, mark


def test_a_worker_that_dies_says_what_it_printed_last():
    from ropecheck.calling.worker import Worker
    from ropecheck.calling.execution import Request
    import torch

    from ropecheck.calling import quiet

    quiet.show(False)
    worker = Worker("ropecheck.session.loading:_target_parts", (f"{__file__}:_dies", None, None, {}))
    try:
        worker.start()
        outcome = worker.run(Request("call", (torch.zeros(1, 1, 1, 2),), torch.zeros(1, 1, dtype=torch.int64)))
    finally:
        worker.close()
    assert outcome.error is not None and outcome.error[0] == "crashed"
    assert "exit status 3" in outcome.error[1] and "LAST-WORDS" in outcome.error[1]


def _dies(x, positions):
    import os
    import sys

    sys.stderr.write("LAST-WORDS\n")
    sys.stderr.flush()
    os._exit(3)
