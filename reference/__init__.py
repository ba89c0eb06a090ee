"""Float64 reference implementations of rotary position embeddings (numpy/scipy).

- ``reference.rope``: the core (inv_freq, angles, pair_indices, pair_slices, apply_rope, pair_norms)
- ``reference.forms``: the seeds' equivalent forms (matrix / expm, complex, elementwise, rotate_half)
- ``reference.sinusoidal``: additive sinusoidal encoding, a negative control
- ``reference.highprec``: mpmath RoPE that judges the float64 reference's accuracy
- ``reference.symbolic``: sympy proofs of relativity and R_m = exp(m B) (import it directly)
"""

from ropecheck.reference.forms import (
    generator,
    rope_complex_form,
    rope_elementwise_form,
    rope_matrix_form,
    rope_rotate_half_form,
    rotation_matrix,
    rotation_matrix_expm,
)
from ropecheck.reference.highprec import apply_rope_mpmath
from ropecheck.reference.rope import (
    DEFAULT_BASE,
    LAYOUTS,
    angles,
    apply_rope,
    check_layout,
    check_rotary_dim,
    check_rotated_fraction,
    inv_freq,
    pair_indices,
    pair_norms,
    pair_slices,
    rotated_pairs,
    zero_beyond,
)
from ropecheck.reference.sinusoidal import apply_sinusoidal, sinusoidal_encoding

__all__ = [
    "DEFAULT_BASE",
    "LAYOUTS",
    "angles",
    "apply_rope",
    "apply_rope_mpmath",
    "apply_sinusoidal",
    "check_layout",
    "check_rotary_dim",
    "check_rotated_fraction",
    "generator",
    "inv_freq",
    "pair_indices",
    "pair_slices",
    "pair_norms",
    "rope_complex_form",
    "rope_elementwise_form",
    "rope_matrix_form",
    "rope_rotate_half_form",
    "rotated_pairs",
    "rotation_matrix",
    "rotation_matrix_expm",
    "sinusoidal_encoding",
    "zero_beyond",
]
