"""ropecheck from a project's own tests (docs/user-guide.md, "From Python"):

    python -m pytest docs/examples/test_api.py
"""

import ropecheck
from call_forms import rope_qk  # docs/examples/call_forms.py: rope(q, k, positions) -> (q_out, k_out)
from my_rope import rope  # docs/examples/my_rope.py: rope(x, positions) -> y


def test_rope_is_right():
    report = ropecheck.check(lambda q, k, pos: rope_qk(q, k, pos), call="qk", layout="half", base=500000.0,
                             dtypes=["bfloat16"], max_position=2**20)
    assert report.passed, report.summary()


def test_convention_is_identified():
    found = ropecheck.identify(rope)
    assert found.options == {"layout": "half", "base": 10000.0}, found.flags
