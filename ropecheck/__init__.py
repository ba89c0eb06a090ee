"""ropecheck: numerical verification and property testing for rotary position embeddings.

The Python API (``ropecheck.api``)::

    report = ropecheck.check(my_rope, call="qk", layout="interleaved", dtypes=["bfloat16"])
    assert report.passed, report.summary()

    print(ropecheck.identify(my_rope).flags)

The layers, lowest first (``docs/architecture.md``): ``ropecheck.reference`` (the float64
references) and ``ropecheck.properties`` (the laws: properties, families, strategies, the
error model), which the repository keeps in its top-level ``reference/`` and
``properties/`` folders (linked here as ``ropecheck/reference`` and
``ropecheck/properties``); then this package's harness: ``kernels``, ``calling``,
``targets``, ``adapters``, ``session``, ``report``, ``identification``, and the front doors
``api``, ``cli`` and ``pytest_plugin``.
"""

_API = ("check", "identify", "Report")


def __getattr__(name):
    """The API, imported on first use: ``import ropecheck`` stays cheap (the ``ropecheck``
    command starts its worker before it imports torch)."""
    if name in _API:
        from ropecheck import api

        return getattr(api, name)
    raise AttributeError(f"module 'ropecheck' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_API))


__all__ = list(_API)
