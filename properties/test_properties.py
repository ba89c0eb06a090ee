"""The property checks as pytest tests: ``pytest --pyargs ropecheck.properties --rope-target T``.

Each test is one check of the target's session (``ropecheck.session``): the plugin
(``ropecheck.pytest_plugin``) parametrizes ``rope_check`` with (dtype, property, mode) for
the target's family and gives ``rope_run``, which runs it and reports it as pytest does
(``test_opcheck``: the opcheck row of each dtype and mode, with ``--rope-opcheck``).
With ``--rope-bench``, ``test_bench`` is one benchmark per shape and dtype
(``ropecheck bench``'s rows), through pytest-benchmark's ``benchmark`` fixture."""


def test_position_range(rope_check, rope_run):
    """The target accepts every position 0 .. --rope-max-position (one finding if not)."""
    rope_run(rope_check)


def test_property(rope_check, rope_run):
    rope_run(rope_check)


def test_opcheck(rope_check, rope_run):
    """With --rope-opcheck: torch.library.opcheck on the custom ops the checks' calls make,
    per dtype and mode (ropecheck.session.opcheck_row)."""
    rope_run(rope_check)


def test_bench(rope_bench_row, rope_bench, benchmark):
    """The target timed at one bench shape, its output checked first (``ropecheck bench``)."""
    rope_bench(rope_bench_row, benchmark)
