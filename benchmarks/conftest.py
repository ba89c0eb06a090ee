"""Prints the GPU benchmark's table (benchmarks/bench_gpu_rope.py) at the end of a run."""


def pytest_terminal_summary(terminalreporter):
    import sys

    module = sys.modules.get("benchmarks.bench_gpu_rope") or sys.modules.get("bench_gpu_rope")
    rows = getattr(module, "ROWS_TIMED", None)
    if rows:
        from rich.console import Console

        from ropecheck.bench.output import table

        for implementation in dict.fromkeys(name for name, _ in rows):
            mine = [row for name, row in rows if name == implementation]
            Console(width=200).print(table(mine, implementation))
