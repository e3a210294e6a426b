"""Per-block freezing and failure flags shared by the Newton solvers (docs/ALGORITHM.md 5.2, 5.3, 7).

Both iterations carry a residual ``max_ij |R - I|`` per block (R = M for coupled Newton,
R = Z Y for NDB) that is at most 1 for exact iterates. It drives two device-side decisions,
each a ``torch.where`` on a (K, 1, 1) mask, never a host sync or an early exit:

- masking: a block whose residual is below the tolerance stops changing (its later iterates
  are selected away), so its result does not depend on how long its companions iterate;
- divergence: a residual above ``DIVERGED`` (or NaN) means the block left the basin (a scale
  far below lambda_max / 2, or 16-bit rounding on an ill-conditioned block). Its root is
  returned as NaN, the failure flag that :func:`dash_fn.roots.refresh_roots` turns into keeping
  the block's previous root. Unflagged, such roots come back finite but meaningless (entries up
  to 1e36 in bfloat16), and the preconditioned gradient overflows.
"""

from __future__ import annotations

import torch

from .identity import identity_matrix

# Residual above which an iterate has certainly left the basin (exact iterates stay <= 1).
DIVERGED = 2.0


def residual(R: torch.Tensor) -> torch.Tensor:
    """``max_ij |R - I|`` per block, (K, 1, 1)."""
    identity = identity_matrix(R.shape[-1], R.dtype, R.device)
    return (R - identity).abs().amax(dim=(-2, -1), keepdim=True)


def diverging(r: torch.Tensor) -> torch.Tensor:
    """Blocks whose residual r (K, 1, 1) exceeds ``DIVERGED`` or is NaN."""
    return ~(r <= DIVERGED)


def select(active: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` where the block is still active (all blocks when masking is off), else ``old``."""
    return new if active is None else torch.where(active, new, old)


def flag_diverged(root: torch.Tensor, diverged: torch.Tensor) -> torch.Tensor:
    """The root with diverged blocks ((K, 1, 1) True) replaced by NaN, as a contiguous stack."""
    return torch.where(diverged, torch.full_like(root, float("nan")), root).contiguous()


def finite_blocks(X: torch.Tensor) -> torch.Tensor:
    """Whether each block of a (K, b, b) stack is finite, from its sum: one reduction, where
    ``isfinite`` makes three passes. A NaN or Inf propagates into the sum; finite entries whose
    sum leaves the float range (|entries| near 1e38 / b^2) count as non-finite too, which only
    makes such a block keep its previous root."""
    return torch.isfinite(X.sum(dim=(-2, -1)))
