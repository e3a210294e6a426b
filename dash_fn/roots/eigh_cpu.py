"""The CPU's eigh root: :func:`dash_fn.roots.eigh.eigh_inverse_root` of a stack, its blocks
solved side by side in threads.

torch's batched CPU eigh runs LAPACK on one block after another, and LAPACK's own threads
barely help at these sizes, while one eigh per core runs them side by side (the figures:
benchmarks/RESULTS.md). So the stack is cut into one part per torch thread, solved
concurrently, each thread shifting (``X + eps I``), padding (:func:`pad_aligned`), decomposing
and reconstructing its own part a few blocks at a time (:data:`CPU_CHUNK_ELEMENTS`), so that no
pass over the whole stack precedes or follows the eighs. While they run, torch (and MKL) is
limited to one thread and restored after: a process-wide setting, but without it each of
these threads would start its own team of torch's threads and the refresh oversubscribes the
cores (benchmarks/RESULTS.md, "One algorithm, one switch"). The reconstruction ``Q diag Q^T``
runs in the same thread, on eigenvectors still in its cache, and writes its part of the result
(no concatenation). Each block's result does not depend on the split (its alignment is fixed,
see :func:`pad_aligned`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from .eigh import pad_aligned, spectral_root
from .identity import shifted

# blocks a thread shifts, decomposes and reconstructs at once: 8 blocks of 256 (2 MiB) stay
# in cache between the shift, LAPACK's copy of its input and the reconstruction
CPU_CHUNK_ELEMENTS = 8 * 256 * 256

_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _workers(threads: int) -> ThreadPoolExecutor:
    """A pool of at least ``threads`` workers, made once and grown when torch's thread count grows."""
    global _pool, _pool_size
    if _pool is None or _pool_size < threads:
        _pool, _pool_size = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dash_fn_eigh"), threads
    return _pool


@torch.library.custom_op("dash_fn::cpu_eigh_root", mutates_args=())
def eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    """``(X + eps I)^(-1/p)`` of every block of a CPU stack (the module doc says how). An op
    opaque to torch.compile, so that torch's thread count is read when it runs."""
    out = torch.empty_like(X)
    b = X.shape[-1]
    chunk = max(1, CPU_CHUNK_ELEMENTS // (b * b))

    def solve(part: slice) -> None:
        for lo in range(part.start, part.stop, chunk):
            blocks = slice(lo, min(lo + chunk, part.stop))
            padded = pad_aligned(shifted(X[blocks], eps))
            mu, Q = torch.linalg.eigh(padded)
            if padded.shape[-1] == b:
                spectral_root(mu, Q, p, eps, heuristic, out=out[blocks])
            else:  # X's root is the top-left corner
                out[blocks] = spectral_root(mu, Q, p, eps, heuristic)[..., :b, :b]

    threads = min(torch.get_num_threads(), X.shape[0])
    if threads <= 1:
        solve(slice(0, X.shape[0]))
        return out
    bounds = [round(i * X.shape[0] / threads) for i in range(threads + 1)]
    restore = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        list(_workers(threads).map(solve, [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]))
    finally:
        torch.set_num_threads(restore)
    return out


@eigh_root.register_fake
def _(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    return torch.empty_like(X)
