"""The seed's 2-D derivation (RoPE-2D via matrix exponentials), in sympy.

R_{x,y} = exp(x B1 + y B2). Relativity R_{x1,y1}^T R_{x2,y2} = R_{x2-x1,y2-y1} needs
B1^T = -B1, B2^T = -B2 and B1 B2 = B2 B1 (``relativity_constraints``). With B1, B2
"orthogonal" parts of a general skew-symmetric matrix:
- 3x3: B1 = B(1, 0, 0), B2 = B(0, b, c): commutation forces b = c = 0 (``solve_3x3``);
- 4x4: B1 = B(1, b, c, 0, 0, 0), B2 = B(0, 0, 0, d, e, f): d = c f, e = -b f (``solve_4x4``);
- the solution f = 1, b = c = d = e = 0 with theta gives the block-diagonal R_{x,y}, whose
  relativity residual simplifies to zero (``block_relativity_residual_2d``).
"""

from __future__ import annotations

import sympy as sp

from ropecheck.reference.symbolic import rotation_block, simplify_trig

a, b, c, d, e, f = sp.symbols("a b c d e f", real=True)
x1, y1, x2, y2 = sp.symbols("x1 y1 x2 y2", real=True)
theta = sp.Symbol("theta", positive=True)


def skew3(a_, b_, c_) -> sp.Matrix:
    return sp.Matrix([[0, -a_, -b_], [a_, 0, -c_], [b_, c_, 0]])


def skew4(a_, b_, c_, d_, e_, f_) -> sp.Matrix:
    return sp.Matrix([[0, -a_, -b_, -d_], [a_, 0, -c_, -e_], [b_, c_, 0, -f_], [d_, e_, f_, 0]])


def relativity_constraints(b1: sp.Matrix, b2: sp.Matrix) -> list:
    """The equations (as expressions = 0) that relativity imposes: B^T + B = 0 for both,
    B1 B2 - B2 B1 = 0 (the seed's B1 B2^T = B2^T B1, equivalent under skew-symmetry)."""
    eqs = list(b1.T + b1) + list(b2.T + b2) + list(b1 * b2 - b2 * b1)
    return [sp.expand(q) for q in eqs if sp.expand(q) != 0]


def solve_3x3() -> list:
    """Solutions (b, c) of B1 B2 = B2 B1 with B1 = B(1, 0, 0), B2 = B(0, b, c): [{b: 0, c: 0}]."""
    return sp.solve(relativity_constraints(skew3(1, 0, 0), skew3(0, b, c)), [b, c], dict=True)


def solve_4x4() -> list:
    """Solutions of B1 B2 = B2 B1 with B1 = B(1, b, c, 0, 0, 0), B2 = B(0, 0, 0, d, e, f):
    [{d: c f, e: -b f}]."""
    return sp.solve(relativity_constraints(skew4(1, b, c, 0, 0, 0), skew4(0, 0, 0, d, e, f)), [d, e], dict=True)


def rotation_2d(x_, y_) -> sp.Matrix:
    """exp(theta (x B1 + y B2)) for the seed's solution: diag(R_x, R_y)."""
    return sp.diag(rotation_block(theta, x_), rotation_block(theta, y_))


def exponential_residual_2d() -> sp.Matrix:
    """exp(theta (x B1 + y B2)) - diag(R_x, R_y), B1 = B(1,0,0,0,0,0), B2 = B(0,0,0,0,0,1)."""
    gen = theta * (x1 * skew4(1, 0, 0, 0, 0, 0) + y1 * skew4(0, 0, 0, 0, 0, 1))
    return (gen.exp() - rotation_2d(x1, y1)).applyfunc(lambda q: sp.simplify(q.rewrite(sp.cos)))


def block_relativity_residual_2d() -> sp.Matrix:
    """R_{x1,y1}^T R_{x2,y2} - R_{x2-x1,y2-y1}, simplified (zero iff relativity holds)."""
    return simplify_trig(rotation_2d(x1, y1).T * rotation_2d(x2, y2) - rotation_2d(x2 - x1, y2 - y1))
