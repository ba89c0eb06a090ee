"""Third-party targets. Each module registers its records in ``ADAPTERS`` on import."""

from ropecheck.adapters import hf, interfaces, others, triton_kernels  # noqa: E402,F401  (register their records)
from ropecheck.adapters.registry import ADAPTERS, Adapter, register

__all__ = ["ADAPTERS", "Adapter", "register"]

from ropecheck.adapters import axial_nd, diffusers_nd, hf_real, table_builders, transformers_nd, vision_nd, xpos  # noqa: E402,F401  (N-D, xPos, real-settings and table builder records; import nothing heavy)
