"""A bench run in pytest-benchmark's JSON format, so that ``pytest-benchmark compare`` and
the CI dashboards that read its saved files read a ``ropecheck bench`` run.

A file is what ``pytest --benchmark-save-data`` writes: ``machine_info``, ``commit_info``,
``benchmarks`` (one ``entry`` each), ``datetime`` (UTC, ISO 8601) and ``version`` (of
pytest-benchmark). An entry's ``stats`` are computed by pytest-benchmark's own
``pytest_benchmark.stats.Stats`` from the samples (seconds per call), so that its min,
median, IQR, outliers and ops mean what they mean in every other file; the samples
themselves are ``stats["data"]``. Those statistics describe one timer's samples; the
comparison ``ropecheck bench`` gates on is ``ropecheck.timing.stats.shift`` of block ratios,
which a reader can redo from the data.
"""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest_benchmark
from pytest_benchmark.stats import Stats
from pytest_benchmark.utils import funcname, get_commit_info

STATS_FIELDS = tuple(Stats.fields) + ("iterations",)
DEFAULT_OPTIONS: dict[str, Any] = {  # the options a saved entry has (pytest_benchmark.fixture)
    "disable_gc": False,
    "timer": None,
    "min_rounds": None,
    "max_time": None,
    "min_time": None,
    "precision": None,
    "confidence": None,
    "warmup": False,
}


def entry(
    name: str,
    group: str,
    samples: list[float],
    *,
    fullname: str = "",
    params: dict | None = None,
    extra_info: dict | None = None,
    options: dict | None = None,
    iterations: int = 1,
) -> dict:
    """One benchmark as pytest-benchmark saves it, from its ``samples`` (seconds per call).

    ``fullname`` defaults to ``name``; ``param`` is ``params``' values joined by "-" (as
    pytest's parametrize ids), None without params; ``options`` are laid over pytest-
    benchmark's (timer, min_rounds, max_time, warmup...; ``min_rounds`` defaults to the
    number of samples; a callable is saved by its name). ``iterations``: calls per sample
    (the samples are already per call, as pytest-benchmark's).
    """
    data = [float(t) for t in samples]
    if not data:
        raise ValueError(f"benchmark {name!r}: no samples")
    stats = Stats()
    for t in data:
        stats.update(t)
    saved = stats.as_dict()
    saved["data"] = data
    saved["iterations"] = iterations
    merged = {**DEFAULT_OPTIONS, "min_rounds": len(data), **(options or {})}
    return {
        "group": group,
        "name": name,
        "fullname": fullname or name,
        "params": params,
        "param": "-".join(str(v) for v in params.values()) if params else None,
        "extra_info": dict(extra_info or {}),
        "options": {k: funcname(v) if callable(v) else v for k, v in merged.items()},
        "stats": saved,
    }


def machine_info(device: str, device_name: str) -> dict:
    """pytest-benchmark's machine info (platform and CPU, ``py-cpuinfo``) with
    ``ropecheck_device``: the device's name (e.g. "NVIDIA H200"), and
    ``ropecheck_device_string``: ``device`` as given (e.g. "cuda:0"). Where pytest-benchmark's
    fails, the platform's basics and the error."""
    try:
        from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info

        info = dict(pytest_benchmark_generate_machine_info())
    except Exception as exc:  # py-cpuinfo missing or failing: the run is still worth its file
        info = {
            "node": platform.node(),
            "machine": platform.machine(),
            "system": platform.system(),
            "python_version": platform.python_version(),
            "error": repr(exc),
        }
    info["ropecheck_device"] = device_name
    info["ropecheck_device_string"] = device
    return info


def document(entries: list[dict], machine: dict, commit: dict | None = None) -> dict:
    """A whole saved file. ``commit`` None: pytest-benchmark's ``get_commit_info()`` of the
    current directory (never raises: an error is recorded in it)."""
    if commit is None:
        try:
            commit = get_commit_info()
        except Exception as exc:
            commit = {
                "id": "unknown",
                "time": None,
                "author_time": None,
                "dirty": False,
                "project": None,
                "branch": "(unknown)",
                "error": repr(exc),
            }
    return {
        "machine_info": machine,
        "commit_info": commit,
        "benchmarks": list(entries),
        "datetime": datetime.now(timezone.utc).isoformat(),
        "version": pytest_benchmark.__version__,
    }


def save(doc: dict, path: str | Path) -> Path:
    """Write ``doc`` as pytest-benchmark does (ASCII JSON, indented by 4)."""
    path = Path(path)
    path.write_text(json.dumps(doc, ensure_ascii=True, indent=4), encoding="utf8")
    return path


def _problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being a pytest-benchmark file, or None."""
    if not isinstance(doc, dict):
        return f"it holds a JSON {type(doc).__name__}, not an object"
    missing = [k for k in ("machine_info", "commit_info", "benchmarks", "datetime", "version") if k not in doc]
    if missing:
        return f"it has no {', '.join(missing)}"
    if not isinstance(doc["benchmarks"], list):
        return "its benchmarks are not a list"
    for i, bench in enumerate(doc["benchmarks"]):
        if not isinstance(bench, dict) or not isinstance(bench.get("stats"), dict):
            return f"benchmark {i} has no stats"
        absent = [k for k in ("group", "name", "fullname", "params", "param", "options") if k not in bench]
        absent += [f"stats.{k}" for k in STATS_FIELDS if k not in bench["stats"] and k != "ops"]  # ops: filled on load
        if absent:
            return f"benchmark {i} ({bench.get('name', '?')!r}) has no {', '.join(absent)}"
    return None


def load(path: str | Path) -> dict:
    """A saved file, read and checked: ValueError, saying what is wrong, when it is not a
    pytest-benchmark file (OSError when it cannot be read)."""
    text = Path(path).read_text(encoding="utf8")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a pytest-benchmark file: it is not JSON ({exc})") from exc
    problem = _problem(doc)
    if problem:
        raise ValueError(f"{path} is not a pytest-benchmark file: {problem}")
    return doc
