"""Inverse p-th roots by eigendecomposition (docs/ALGORITHM.md 5.1)."""

from __future__ import annotations

import torch

from .identity import diagonal, shifted
from .matmul import aligned_width
from .scaling import root


def eigh_inverse_root(X: torch.Tensor, p: int, *, eps: float, heuristic: str, eps_rel: float = 0.0) -> torch.Tensor:
    """``Q diag(d^{-1/p}) Q^T`` for each block of a symmetric (K, b, b) stack.

    ``mu, Q = eigh(X + eps I)``; the heuristic maps eigenvalues ``mu`` (lambda = mu - eps) to d:

    - ``shampoo``: ``d = mu - min(lambda_min, 0)``; for PSD X the output is ``(X + eps I)^{-1/p}``,
      for indefinite X the spectrum is shifted so that its minimum is eps.
    - ``abs``: ``d = |mu|``.
    - ``abs_add``: ``d = |lambda| + eps``.
    - ``relu``: a pseudo-inverse root; eigenvalues with ``lambda < eps`` map to 0.

    With ``eps_rel > 0`` every heuristic's root is a pseudo-inverse one: eigenvalues with
    ``lambda <= eps_rel * lambda_max`` map to 0 (docs/ALGORITHM.md 5.6).

    The device form (the accelerator strategy's; the CPU strategies use
    :func:`dash_fn.roots.eigh_cpu.eigh_root`). ``torch.linalg.eigh`` reads its error flags on the host:
    one sync per call on a GPU.
    """
    b = X.shape[-1]
    mu, Q = torch.linalg.eigh(pad_aligned(shifted(X, eps)))
    out = spectral_root(mu, Q, p, eps, heuristic, eps_rel)
    # X's root is the top-left corner
    return out[..., :b, :b].contiguous()


# eigh's maps from the eigenvalues mu of X + eps I (lam = mu - eps, X's own) to the spectrum
# that is inverted, and whether eigenvalues of X below eps are dropped (docs/ALGORITHM.md 5.1)
HEURISTICS = {
    "shampoo": lambda mu, lam, eps: (mu - torch.clamp(lam.amin(dim=-1, keepdim=True), max=0.0), False),
    "abs": lambda mu, lam, eps: (mu.abs(), False),
    "abs_add": lambda mu, lam, eps: (lam.abs() + eps, False),
    "relu": lambda mu, lam, eps: (mu, True),
}


def spectral_root(
    mu: torch.Tensor,
    Q: torch.Tensor,
    p: int,
    eps: float,
    heuristic: str,
    eps_rel: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``Q diag(d^{-1/p}) Q^T`` from eigenpairs ``mu, Q`` of ``X + eps I``, d by the heuristic,
    0 where ``lambda <= eps_rel lambda_max`` if ``eps_rel > 0`` (written into ``out`` when given).
    A padded block's extra eigenvalue is ``max |X_ii|``, at most lambda_max for PSD X: the
    floor is X's own."""
    lam = mu - eps
    d, below_eps_dropped = HEURISTICS[heuristic](mu, lam, eps)
    scale = 1 / root(d, p)
    if below_eps_dropped:
        scale = torch.where(lam < eps, torch.zeros_like(scale), scale)
    if eps_rel > 0:
        floor = eps_rel * lam.amax(dim=-1, keepdim=True)
        scale = torch.where(lam <= floor, torch.zeros_like(scale), scale)
    return torch.matmul(Q * scale.unsqueeze(-2), Q.mT, out=out)


def pad_aligned(X: torch.Tensor, c: torch.Tensor | float | None = None) -> torch.Tensor:
    """Each block embedded as ``diag(X, c I)``, of a width whose rows fill whole 64-byte lines.

    CPU LAPACK's results depend on the memory alignment of each matrix's outputs, which for a
    size whose row is not a multiple of 64 bytes varies with the block's position in the stack:
    the same block then decomposes differently in stacks of different lengths (measured: b = 5
    at every 4th position), and a rank holding part of a stack would not match one process.
    ``c = max |X_ii|`` keeps the norm, so no accuracy is lost; ``Q f(mu) Q^T`` of the embedding
    is ``diag(f(X), f(c) I)`` whatever c's eigenvectors mix with, so its top-left corner is
    ``f(X)``. Aligned sizes (every full block) pass through. ``c`` (a number or (K, 1)) replaces
    that default where another embedding is wanted (:mod:`dash_fn.roots.basis`).
    """
    K, b = X.shape[0], X.shape[-1]
    padded = aligned_width(b, X.dtype)
    if padded == b:
        return X
    if c is None:
        c = diagonal(X).abs().amax(dim=-1, keepdim=True)
    P = torch.diag_embed(torch.as_tensor(c, dtype=X.dtype, device=X.device).expand(K, padded))
    P[:, :b, :b] = X
    return P
