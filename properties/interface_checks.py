"""The 1-D properties only a table-fed library interface has (``--api`` with a table):
``properties/checks.py`` registers them in the 1-D family's table (``TABLE_CHECKS``).

- table-inverse: the table of -m undoes the table of m. ropecheck feeds the kernel the
  table of the angles -m theta_i (row p of a table indexed by position turns by -p
  theta_i): a correct kernel applies R_-m = R_m^T, so f(f(x, T_m), T_-m) = x (times the
  scaling's attention factor twice). It needs no autograd: the inverse of an interface
  without backward (vLLM, FlashInfer). Each call errs by at most eps |x| per head vector
  (the error model's vector bound, the table's rounding included), the second on the
  first's rounded output: |f(f(x)) - x| <= (2 eps + eps^2) |x| + 2 floor.
"""

from __future__ import annotations

import numpy as np
import torch

from ropecheck.properties.assertions import AXES_3D, assert_close
from ropecheck.properties.inputs.cases import Case, as_float64
from ropecheck.properties.one_d import Context, eps, vector_norms


def table_inverse(ctx: Context, case: Case) -> float:
    p = case.positions_array()
    m = torch.from_numpy(np.ascontiguousarray(p))
    x = case.tensor()
    y = ctx.rope(x, m)
    back = ctx.unscale(ctx.unscale(as_float64(ctx.rope(y, m, table_sign=-1))))
    x64 = as_float64(x)
    e = eps(ctx, p)
    bound = (2 * e + e * e) * vector_norms(x64) + 2 * ctx.model.floor
    return assert_close(
        vector_norms(back - x64), 0.0, bound, positions=p, axes=AXES_3D, what="|f(f(x, T_m), T_-m) - x| per head vector"
    )


# name -> (the Property's fields, its check)
TABLE_CHECKS = {
    "table-inverse": (
        {"formula": "f(f(x, T_m), T_-m) = x: the table of -m undoes the table of m", "needs_table": True},
        table_inverse,
    ),
}
