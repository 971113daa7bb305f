"""Model expressions built in one call: the sums every constraint family of the CP-SAT model uses."""

from __future__ import annotations

from collections.abc import Sequence

from ortools.sat.python import cp_model

Expr = cp_model.LinearExpr | int  # a model expression or a constant (what lsum and wsum return)


def lsum(exprs: Sequence[Expr]) -> Expr:
    """Sum of model expressions in one call (Python's sum builds a chain of partial sums)."""
    return cp_model.LinearExpr.sum(exprs) if exprs else 0


def wsum(exprs: Sequence[Expr], coeffs: Sequence[int]) -> Expr:
    """Weighted sum of model expressions in one call."""
    return cp_model.LinearExpr.weighted_sum(exprs, coeffs) if exprs else 0
