"""Hangs and crashes reported fast: a warm-up call in a dtype the run does not check has a
quarter of the call limit, so a target hanging in every dtype costs 1.25 limits, not two;
``identify`` stops at the first call that ends the process."""

from __future__ import annotations

import textwrap

from ropecheck.session.prepare import WARM_UP_SHARE, warm_up
from ropecheck.session.spec import build
from tests.test_cli import run_subprocess

HANGS = textwrap.dedent("""
    import time

    def rope(x, positions):
        while True:
            time.sleep(0.05)
""")

CRASHES = textwrap.dedent("""
    import os

    def rope(x, positions):
        os.abort()
""")


def test_a_warm_up_call_in_an_unrequested_dtype_has_a_share_of_the_limit(tmp_path):
    path = tmp_path / "hangs.py"
    path.write_text(HANGS)
    from ropecheck.session.options import parse

    options = parse("check", {"target": f"{path}:rope", "layout": "half", "dtypes": ["float32"]})
    target = build(options)
    try:
        problems = warm_up(target, ["float32"], timeout=2.0)
    finally:
        target.close()
    assert f"within {2.0 * WARM_UP_SHARE:g} s" in problems["bfloat16"]
    assert "within 2 s" in problems["float32"]


def test_identify_stops_at_the_first_call_that_ends_the_process(tmp_path):
    path = tmp_path / "crashes.py"
    path.write_text(CRASHES)
    proc, _ = run_subprocess("identify", f"{path}:rope")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "the target ended the process on float64, head_dim 64" in output
    assert "Traceback" not in output
