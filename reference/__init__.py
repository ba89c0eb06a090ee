"""Float64 reference implementations of rotary position embeddings (numpy/scipy)."""

from reference.rope import (
    DEFAULT_BASE,
    LAYOUTS,
    angles,
    apply_rope,
    check_layout,
    check_rotary_dim,
    inv_freq,
    pair_indices,
    pair_norms,
)

__all__ = [
    "DEFAULT_BASE",
    "LAYOUTS",
    "angles",
    "apply_rope",
    "check_layout",
    "check_rotary_dim",
    "inv_freq",
    "pair_indices",
    "pair_norms",
]
