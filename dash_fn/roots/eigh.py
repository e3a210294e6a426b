"""Inverse p-th roots by eigendecomposition (ALGORITHM.md 5.1)."""

from __future__ import annotations

import torch


def eigh_inverse_root(X: torch.Tensor, p: int, *, eps: float, heuristic: str) -> torch.Tensor:
    """``Q diag(d^{-1/p}) Q^T`` for each block of a symmetric (K, b, b) stack.

    ``mu, Q = eigh(X + eps I)``; the heuristic maps eigenvalues ``mu`` (lambda = mu - eps) to d:

    - ``shampoo``: ``d = mu - min(lambda_min, 0)``; for PSD X the output is ``(X + eps I)^{-1/p}``,
      for indefinite X the spectrum is shifted so that its minimum is eps.
    - ``abs``: ``d = |mu|``.
    - ``abs_add``: ``d = |lambda| + eps``.
    - ``relu``: a pseudo-inverse root; eigenvalues with ``lambda < eps`` map to 0.
    """
    b = X.shape[-1]
    identity = torch.eye(b, dtype=X.dtype, device=X.device)
    mu, Q = torch.linalg.eigh(X + eps * identity)
    lam = mu - eps
    if heuristic == "shampoo":
        d = mu - torch.clamp(lam.amin(dim=-1, keepdim=True), max=0.0)
    elif heuristic == "abs":
        d = mu.abs()
    elif heuristic == "abs_add":
        d = lam.abs() + eps
    elif heuristic == "relu":
        d = mu
    else:
        raise ValueError(f"unknown eigh heuristic {heuristic!r}")
    scale = d.pow(-1.0 / p)
    if heuristic == "relu":
        scale = torch.where(lam < eps, torch.zeros_like(scale), scale)
    # contiguous: both branches of the refresh torch.cond must return equal strides
    return ((Q * scale.unsqueeze(-2)) @ Q.mT).contiguous()
