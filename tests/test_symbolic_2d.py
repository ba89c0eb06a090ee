"""The seed's sympy derivation of 2-D RoPE."""
import sympy as sp

from ropecheck.reference import symbolic_2d as s


def test_constraints_of_the_seed():
    eqs = s.relativity_constraints(s.skew4(1, s.b, s.c, 0, 0, 0), s.skew4(0, 0, 0, s.d, s.e, s.f))
    assert eqs and all(q.free_symbols <= {s.b, s.c, s.d, s.e, s.f} for q in eqs)
    assert s.relativity_constraints(s.skew3(1, 0, 0), s.skew3(2, 0, 0)) == []  # commuting, skew: none


def test_3x3_has_only_the_trivial_b2():
    assert s.solve_3x3() == [{s.b: 0, s.c: 0}]


def test_4x4_gives_d_cf_e_minus_bf():
    assert s.solve_4x4() == [{s.d: s.c * s.f, s.e: -s.b * s.f}]


def test_block_diagonal_solution_is_relative_and_an_exponential():
    assert s.block_relativity_residual_2d() == sp.zeros(4, 4)
    assert s.exponential_residual_2d() == sp.zeros(4, 4)
