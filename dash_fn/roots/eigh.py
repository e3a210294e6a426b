"""Inverse p-th roots by eigendecomposition (docs/ALGORITHM.md 5.1)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from .matmul import aligned_width
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
    padded = aligned_width(b, X.dtype)
    if padded != b:
        c = X.diagonal(dim1=-2, dim2=-1).abs().amax(dim=-1, keepdim=True)
        P = torch.diag_embed(c.expand(K, padded))
        P[:, :b, :b] = X
        X = P
    return cpu_eigh(X) if X.device.type == "cpu" else torch.linalg.eigh(X)


_pool: ThreadPoolExecutor | None = None


@torch.library.custom_op("dash_fn::cpu_eigh", mutates_args=())
def cpu_eigh(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of a CPU stack, its blocks split over torch's threads.

    torch's batched CPU eigh runs LAPACK on one block after another, and LAPACK's own threads
    barely help at these sizes (b = 256: 322 ms for 64 blocks on 2 threads vs 383 on one,
    measured), while one single-threaded eigh per core runs in 202 ms. So the stack is cut
    into ``threads`` parts decomposed concurrently, with torch (and MKL) limited to one thread
    meanwhile, which is restored after. Each block's result does not depend on the split
    (its alignment is fixed, see ``_aligned_eigh``). An op opaque to torch.compile, so the
    thread count is read when it runs.
    """
    threads = min(torch.get_num_threads(), X.shape[0])
    if threads <= 1:
        mu, Q = torch.linalg.eigh(X)
        return mu, Q.contiguous()  # LAPACK's vectors are column-major; the op promises row-major
    global _pool
    if _pool is None or _pool._max_workers < threads:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dash_fn_eigh")
    restore = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        parts = list(_pool.map(torch.linalg.eigh, X.chunk(threads)))
    finally:
        torch.set_num_threads(restore)
    return torch.cat([mu for mu, _ in parts]), torch.cat([Q for _, Q in parts]).contiguous()


@cpu_eigh.register_fake
def _cpu_eigh_fake(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return X.new_empty(X.shape[:-1]), torch.empty_like(X)
