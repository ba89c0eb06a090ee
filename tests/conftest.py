"""The project's own tests run derandomized: the same examples on every run and machine.

The workers the tests start are forked from a zygote made here, before any test has run
torch (``ropecheck.calling.spawn``): each costs a fork instead of an interpreter that
imports torch again (two and a half seconds of CPU, some two hundred times a run).

A test process computes on one thread. The suite runs two of them on two cores (xdist),
each beside the workers it starts; with torch's default of a thread per core, the OpenMP
threads of each test process spin after every parallel region on the core another
process needs. Measured side by side (`pytest -q -n 2` over test_checks_catch_bugs.py,
test_presets.py and test_call_forms.py, two runs each): 116.5 and 105.9 s with a thread
per core, 69.8 and 68.8 s with one; the processes' user CPU 185 and 162 s, 97 and 97 s."""

import torch

from ropecheck.calling import spawn

spawn.fork_zygote(("ropecheck.session.loading",))  # its workers set their own threads (worker.serve)
torch.set_num_threads(1)

from hypothesis import HealthCheck, settings

settings.register_profile("ropecheck-selftest", derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("ropecheck-selftest")
