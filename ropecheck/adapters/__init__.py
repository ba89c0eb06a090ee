"""Third-party targets. Each module registers its records in ``ADAPTERS`` on import."""

from ropecheck.adapters.registry import ADAPTERS, Adapter, register
from ropecheck.adapters import hf, others, triton_kernels  # noqa: E402,F401  (register their records)

__all__ = ["ADAPTERS", "Adapter", "register"]

from ropecheck.adapters import transformers_nd  # noqa: E402,F401  (N-D records; imports nothing heavy)
from ropecheck.adapters import xpos  # noqa: E402,F401  (xPos records; imports nothing heavy)
