"""``ropecheck bench`` in pytest (``--rope-bench``, ini ``rope_bench = true``): one
``test_bench`` item per shape and dtype, each timed by the bench's own timers and handed to
pytest-benchmark's ``benchmark`` fixture, so that ``--benchmark-save``,
``--benchmark-compare`` and the usual dashboards work as users expect; the speed gate of
``--rope-bench-baseline`` fails the item. Under ``--benchmark-disable`` (pytest-benchmark's
switch) an item only checks the shape's output against the float64 reference."""

from __future__ import annotations

import pytest

from ropecheck.bench.output import extra_info
from ropecheck.bench.run import BenchRun, prepare
from ropecheck.bench.runner import case_for, check_output
from ropecheck.session import options as table
from ropecheck.session.options import Options, UsageError, parse
from ropecheck.session.spec import UnusableTarget


def options(raw: dict, sources: dict) -> Options:
    """The bench's options from the plugin's flags and ini values (those it takes)."""
    taken = {o.name for o in table.for_command("bench")}
    return parse("bench", {k: v for k, v in raw.items() if k in taken}, door="pytest", sources=sources)


def bench_of(config) -> BenchRun:
    """The bench run, prepared once per pytest process; pytest.exit (usage error) when it
    cannot be."""
    if getattr(config, "_ropecheck_bench_run", None) is None:
        try:
            config._ropecheck_bench_run = prepare(config._ropecheck_bench)
        except (UnusableTarget, UsageError) as exc:
            pytest.exit(f"ropecheck: --rope-bench: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        config.add_cleanup(config._ropecheck_bench_run.close)
    return config._ropecheck_bench_run


def parametrize(metafunc) -> None:
    if getattr(metafunc.config, "_ropecheck_bench", None) is None:
        metafunc.parametrize("rope_bench_row", [])
        return
    run = bench_of(metafunc.config)
    ids = [f"{dtype}-{shape.name}".replace(" ", "-") for shape, dtype in run.rows_to_time]
    metafunc.parametrize("rope_bench_row", run.rows_to_time, ids=ids)


class ReplayClock:
    """A pytest-benchmark timer that reads back samples the bench's timers took: each
    round's start and end readings differ by the next sample, so pytest-benchmark's
    statistics, saved files and comparisons are of those samples."""

    def __init__(self, samples: list, name: str):
        self.samples, self.now, self.ends = list(samples), 0.0, False
        self.__name__ = f"ropecheck.{name}"

    def __call__(self) -> float:
        if self.ends:
            self.now += self.samples.pop(0)
        self.ends = not self.ends
        return self.now


def record(benchmark, row, target: str) -> None:
    """A timed row into pytest-benchmark's ``benchmark`` fixture: its samples (through
    ``ReplayClock``), its group (the step) and extra_info (``output.extra_info``)."""
    assert row.samples is not None
    samples = list(row.samples.arms["call"])
    benchmark.group = row.shape.step
    benchmark.extra_info.update(extra_info(row, target))
    benchmark._timer = ReplayClock(samples, row.timer)  # pytest-benchmark's timer, read by its runner
    benchmark.pedantic(lambda: None, rounds=len(samples), iterations=1, warmup_rounds=0)


def run(config, item: tuple, benchmark) -> None:
    bench = bench_of(config)
    shape, dtype = item
    if benchmark.disabled:
        found = check_output(bench.subject, case_for(bench.subject.target, shape, dtype, bench.plan.seed))
        if found is not None:
            pytest.fail(f"{dtype} {shape.name}: {found[0]}: {found[1]}", pytrace=False)
        benchmark(lambda: None)
        return
    row = bench.row(shape, dtype)
    if row.status != "timed" or row.samples is None:
        pytest.fail(f"{row.name}: {row.status}: {row.message}", pytrace=False)
    record(benchmark, row, bench.subject.name)
    for note in row.notes:
        print(f"{row.name}: {note}")
    if row.gate is not None and row.gate.failed:
        pytest.fail(f"{row.name}: {row.gate.message}", pytrace=False)
