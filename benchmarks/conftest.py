"""Prints the GPU benchmark's table (benchmarks/bench_gpu_rope.py) at the end of a run."""


def pytest_terminal_summary(terminalreporter):
    from benchmarks.gpu_protocol import ROWS, render

    if ROWS:
        from rich.console import Console

        Console(width=200).print(render(ROWS))
