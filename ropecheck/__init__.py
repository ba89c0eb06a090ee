"""ropecheck: numerical verification and property testing for rotary position embeddings.

The Python API (``ropecheck.api``)::

    report = ropecheck.check(my_rope, call="qk", layout="interleaved", dtypes=["bfloat16"])
    assert report.passed, report.summary()

    print(ropecheck.identify(my_rope).flags())

The engine's packages are ``ropecheck.properties`` (the property checks) and
``ropecheck.reference`` (the float64 references). In the repository they are the
top-level folders ``properties/`` and ``reference/``, which an install maps to those names
(pyproject.toml, ``package-dir``); run from a checkout, this package finds them beside it
(``_CheckoutFinder``).
"""

import importlib.util as _util
import sys as _sys
from pathlib import Path as _Path

_CHECKOUT = _Path(__file__).resolve().parent.parent
_ENGINE = ("properties", "reference")


class _CheckoutFinder:
    """Finds ``ropecheck.properties`` and ``ropecheck.reference`` in a source checkout (an
    install has them inside the package): exactly these two names, nothing else of the
    checkout."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        package, _, name = fullname.partition(".")
        if package != __name__ or name not in _ENGINE:
            return None
        folder = _CHECKOUT / name
        return _util.spec_from_file_location(fullname, folder / "__init__.py",
                                             submodule_search_locations=[str(folder)])


if (not (_Path(__file__).resolve().parent / "properties").is_dir()
        and all((_CHECKOUT / name / "__init__.py").is_file() for name in _ENGINE)):
    _sys.meta_path.insert(0, _CheckoutFinder)

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
