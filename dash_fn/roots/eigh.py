"""Inverse p-th roots by eigendecomposition (docs/ALGORITHM.md 5.1)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from .identity import diagonal, shifted
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
    if X.device.type == "cpu":
        return cpu_eigh_root(X, p, eps, heuristic)
    b = X.shape[-1]
    out = spectral_root(*torch.linalg.eigh(pad_aligned(shifted(X, eps))), p, eps, heuristic)
    # X's root is the top-left corner; contiguous: both branches of the refresh torch.cond
    # must return equal strides
    return out[..., :b, :b].contiguous()


def spectral_root(mu: torch.Tensor, Q: torch.Tensor, p: int, eps: float, heuristic: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """``Q diag(d^{-1/p}) Q^T`` from eigenpairs ``mu, Q`` of ``X + eps I``, d by the heuristic
    (written into ``out`` when given)."""
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
    return torch.matmul(Q * scale.unsqueeze(-2), Q.mT, out=out)


def pad_aligned(X: torch.Tensor) -> torch.Tensor:
    """Each block embedded as ``diag(X, c I)``, of a width whose rows fill whole 64-byte lines.

    CPU LAPACK's results depend on the memory alignment of each matrix's outputs, which for a
    size whose row is not a multiple of 64 bytes varies with the block's position in the stack:
    the same block then decomposes differently in stacks of different lengths (measured: b = 5
    at every 4th position), and a rank holding part of a stack would not match one process.
    ``c = max |X_ii|`` keeps the norm, so no accuracy is lost; ``Q f(mu) Q^T`` of the embedding
    is ``diag(f(X), f(c) I)`` whatever c's eigenvectors mix with, so its top-left corner is
    ``f(X)``. Aligned sizes (every full block) pass through.
    """
    K, b = X.shape[0], X.shape[-1]
    padded = aligned_width(b, X.dtype)
    if padded == b:
        return X
    c = diagonal(X).abs().amax(dim=-1, keepdim=True)
    P = torch.diag_embed(c.expand(K, padded))
    P[:, :b, :b] = X
    return P


_pool: ThreadPoolExecutor | None = None


# blocks a thread shifts, decomposes and reconstructs at once: 8 blocks of 256 (2 MiB) stay
# in cache between the shift, LAPACK's copy of its input and the reconstruction
CPU_CHUNK_ELEMENTS = 8 * 256 * 256


@torch.library.custom_op("dash_fn::cpu_eigh_root", mutates_args=())
def cpu_eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    """:func:`eigh_inverse_root` of a CPU stack: the stack split over torch's threads, each
    thread shifting (``X + eps I``), padding (:func:`pad_aligned`), decomposing and
    reconstructing its own part, a few blocks at a time (:data:`CPU_CHUNK_ELEMENTS`), so
    that no pass over the whole stack precedes or follows the eighs.

    torch's batched CPU eigh runs LAPACK on one block after another, and LAPACK's own threads
    barely help at these sizes (b = 256: 322 ms for 64 blocks on 2 threads vs 383 on one,
    measured), while one single-threaded eigh per core runs in 202 ms. So the stack is cut
    into ``threads`` parts solved concurrently, with torch (and MKL) limited to one thread
    meanwhile, which is restored after. The reconstruction ``Q diag Q^T`` runs in the same
    thread, on eigenvectors still in its cache, and writes its part of the result (no
    concatenation). Each block's result does not depend on the split (its alignment is fixed,
    see :func:`pad_aligned`). An op opaque to torch.compile, so the thread count is read when
    it runs.
    """
    out = torch.empty_like(X)
    b = X.shape[-1]
    chunk = max(1, CPU_CHUNK_ELEMENTS // (b * b))

    def solve(part: slice) -> None:
        for lo in range(part.start, part.stop, chunk):
            blocks = slice(lo, min(lo + chunk, part.stop))
            padded = pad_aligned(shifted(X[blocks], eps))
            if padded.shape[-1] == b:
                spectral_root(*torch.linalg.eigh(padded), p, eps, heuristic, out=out[blocks])
            else:  # X's root is the top-left corner
                out[blocks] = spectral_root(*torch.linalg.eigh(padded), p, eps, heuristic)[..., :b, :b]

    threads = min(torch.get_num_threads(), X.shape[0])
    if threads <= 1:
        solve(slice(0, X.shape[0]))
        return out
    global _pool
    if _pool is None or _pool._max_workers < threads:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dash_fn_eigh")
    bounds = [round(i * X.shape[0] / threads) for i in range(threads + 1)]
    restore = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        list(_pool.map(solve, [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]))
    finally:
        torch.set_num_threads(restore)
    return out


@cpu_eigh_root.register_fake
def _cpu_eigh_root_fake(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    return torch.empty_like(X)
