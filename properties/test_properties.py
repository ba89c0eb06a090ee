"""The property checks as pytest tests: ``pytest --pyargs ropecheck.properties --rope-target T``.

Each test is one check of the target's session (``ropecheck.session``): the plugin
(``ropecheck.pytest_plugin``) parametrizes ``rope_check`` with (dtype, property, mode) for
the target's family and gives ``rope_run``, which runs it and reports it as pytest does.
With ``--rope-bench``, ``test_bench`` is one benchmark per shape and dtype
(``ropecheck bench``'s rows), through pytest-benchmark's ``benchmark`` fixture."""


def test_position_range(rope_check, rope_run):
    """The target accepts every position 0 .. --rope-max-position (one finding if not)."""
    rope_run(rope_check)


def test_property(rope_check, rope_run):
    rope_run(rope_check)


def test_bench(rope_bench_row, rope_bench, benchmark):
    """The target timed at one bench shape, its output checked first (``ropecheck bench``)."""
    rope_bench(rope_bench_row, benchmark)
