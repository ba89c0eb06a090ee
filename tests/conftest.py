"""The project's own tests run derandomized: the same examples on every run and machine.

The workers the tests start are forked from a zygote made here, before any test has run
torch (``ropecheck.calling.spawn``): each costs a fork instead of an interpreter that
imports torch again (two and a half seconds of CPU, some two hundred times a run)."""

import torch  # noqa: F401  (imported before the zygote is forked: its workers have it)

from ropecheck.calling import spawn

spawn.fork_zygote(("ropecheck.session.loading",))

from hypothesis import HealthCheck, settings

settings.register_profile("ropecheck-selftest", derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("ropecheck-selftest")
