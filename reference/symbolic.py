"""Symbolic (sympy) proofs of the RoPE identities the numeric checks rely on.

- relativity of the 2x2 block:   R_m^T R_n - R_{n-m} = 0,   R_m = [[cos m t, -sin m t], [sin m t, cos m t]]
- the same for the block-diagonal R_m = diag(R_m(theta_0), ..., R_m(theta_{k-1}))
  with independent symbolic frequencies theta_i
- the generator:                 exp(m B) - R_m = 0,   B = [[0, -t], [t, 0]]

Each ``*_residual`` function returns the simplified residual matrix; the identity holds iff
it is the zero matrix.
"""

from __future__ import annotations

import sympy as sp

m, n = sp.symbols("m n", real=True)
theta = sp.Symbol("theta", positive=True)


def rotation_block(theta_symbol, m_symbol) -> sp.Matrix:
    """[[cos(m theta), -sin(m theta)], [sin(m theta), cos(m theta)]]."""
    phi = m_symbol * theta_symbol
    return sp.Matrix([[sp.cos(phi), -sp.sin(phi)], [sp.sin(phi), sp.cos(phi)]])


def frequencies(n_pairs: int) -> tuple[sp.Symbol, ...]:
    """Independent positive symbols theta_0 .. theta_{n_pairs-1}."""
    return sp.symbols(f"theta_0:{n_pairs}", positive=True)


def block_diagonal_rotation(n_pairs: int, m_symbol=m, thetas=None) -> sp.Matrix:
    """diag(R_m(theta_0), ..., R_m(theta_{k-1})), the interleaved-layout R_m of size 2k."""
    thetas = frequencies(n_pairs) if thetas is None else thetas
    return sp.diag(*[rotation_block(t, m_symbol) for t in thetas])


def simplify_trig(matrix: sp.Matrix) -> sp.Matrix:
    """Entrywise expand_trig, expand, simplify: how each residual is reduced to zero."""
    # expand_trig turns cos((n - m) t) into products of cos(n t), sin(m t), ...
    return matrix.applyfunc(lambda e: sp.simplify(sp.expand(sp.expand_trig(e))))


def block_relativity_residual() -> sp.Matrix:
    """Simplified R_m^T R_n - R_{n-m} for the 2x2 block (zero iff relativity holds)."""
    return simplify_trig(rotation_block(theta, m).T * rotation_block(theta, n) - rotation_block(theta, n - m))


def block_diagonal_relativity_residual(n_pairs: int = 3) -> sp.Matrix:
    """Simplified R_m^T R_n - R_{n-m} for the block-diagonal R with symbolic theta_i."""
    thetas = frequencies(n_pairs)
    r_m, r_n = block_diagonal_rotation(n_pairs, m, thetas), block_diagonal_rotation(n_pairs, n, thetas)
    return simplify_trig(r_m.T * r_n - block_diagonal_rotation(n_pairs, n - m, thetas))


def generator_block() -> sp.Matrix:
    """B = [[0, -theta], [theta, 0]], the generator of the 2x2 block."""
    return sp.Matrix([[0, -theta], [theta, 0]])


def exponential_residual() -> sp.Matrix:
    """Simplified exp(m B) - R_m for the 2x2 block (zero iff R_m = exp(m B))."""
    residual = (m * generator_block()).exp() - rotation_block(theta, m)
    return residual.applyfunc(lambda e: sp.simplify(e.rewrite(sp.cos)))
