"""The project's own tests run derandomized: the same examples on every run and machine."""

from hypothesis import HealthCheck, settings

settings.register_profile("ropecheck-selftest", derandomize=True, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("ropecheck-selftest")
