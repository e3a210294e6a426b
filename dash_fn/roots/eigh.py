"""Inverse p-th roots by eigendecomposition (ALGORITHM.md 5.1)."""

from __future__ import annotations

import torch

from .matmul import ALIGN_BYTES
from .scaling import root


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
    mu, Q = _aligned_eigh(X + eps * identity)
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
    scale = 1 / root(d, p)
    if heuristic == "relu":
        scale = torch.where(lam < eps, torch.zeros_like(scale), scale)
    # on the padded blocks, whose alignment does not vary either; X's root is the top-left corner.
    # contiguous: both branches of the refresh torch.cond must return equal strides
    return ((Q * scale.unsqueeze(-2)) @ Q.mT)[..., :b, :b].contiguous()


def _aligned_eigh(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of every block, padded so each block's rows fill whole 64-byte lines.

    CPU LAPACK's results depend on the memory alignment of each matrix's outputs, which for a
    size whose row is not a multiple of 64 bytes varies with the block's position in the stack:
    the same block then decomposes differently in stacks of different lengths (measured: b = 5
    at every 4th position), and a rank holding part of a stack would not match one process.
    The block is embedded as ``diag(X, c I)`` with ``c = max |X_ii|`` (keeping the norm, so no
    accuracy is lost); ``Q f(mu) Q^T`` of it is ``diag(f(X), f(c) I)`` whatever c's
    eigenvectors mix with, so its top-left corner is ``f(X)``.
    """
    K, b = X.shape[0], X.shape[-1]
    multiple = max(1, ALIGN_BYTES // X.element_size())
    padded = -(-b // multiple) * multiple
    if padded == b:
        return torch.linalg.eigh(X)
    c = X.diagonal(dim1=-2, dim2=-1).abs().amax(dim=-1, keepdim=True)
    P = torch.diag_embed(c.expand(K, padded))
    P[:, :b, :b] = X
    return torch.linalg.eigh(P)
