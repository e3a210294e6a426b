"""The CPU's eigh: :func:`dash_fn.roots.eigh.eigh_inverse_root` of a stack, and the
eigenvectors of the eigenvalue-corrected preconditioner's bases, its blocks solved side by side
in threads.

torch's batched CPU eigh runs LAPACK on one block after another, and LAPACK's own threads
barely help at these sizes, while one eigh per core runs them side by side (the figures:
benchmarks/RESULTS.md). So the stack is cut into one part per torch thread, solved
concurrently, each thread shifting (``X + eps I``), padding (:func:`pad_aligned`), decomposing
and reconstructing its own part a few blocks at a time (:data:`CPU_CHUNK_ELEMENTS`), so that no
pass over the whole stack precedes or follows the eighs. The reconstruction ``Q diag Q^T``
runs in the same thread, on eigenvectors still in its cache, and writes its part of the result
(no concatenation). Each block's result does not depend on the split (its alignment is fixed,
see :func:`pad_aligned`). Each of these threads runs torch (and MKL) with one thread of its
own: with more, each would start its own team of threads and the refresh would oversubscribe
the cores (benchmarks/RESULTS.md, "One algorithm, one switch: the refactor's shape, bits and
speed").
"""

from __future__ import annotations

import threading
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
    """A pool of at least ``threads`` workers, each running torch with one thread of its own.

    Made once (again only when torch's thread count grows). torch keeps a thread's count from
    when it starts, out of a process-wide setting: each new worker sets it to one
    (``torch.set_num_threads(1)`` in the worker), and once every worker has started, the
    caller's count is written back, for the threads started later. No step changes it after."""
    global _pool, _pool_size
    if _pool is None or _pool_size < threads:
        restore = torch.get_num_threads()
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dash_fn_eigh", initializer=_one_thread)
        started = threading.Barrier(threads)
        list(pool.map(lambda _: started.wait(), range(threads)))  # every worker started and set
        torch.set_num_threads(restore)
        _pool, _pool_size = pool, threads
    return _pool


def start_workers() -> None:
    """Make the op's threads now, one a torch thread (``init`` does, so that no step makes them)."""
    if torch.get_num_threads() > 1:
        _workers(torch.get_num_threads())


def _one_thread() -> None:
    """This thread runs torch with one thread: its count first taken from the process-wide one
    (torch does that on a thread's first parallel op, and would undo a count set before), then set."""
    torch.get_num_threads()
    torch.set_num_threads(1)


@torch.library.custom_op("dash_fn::cpu_eigh_root", mutates_args=())
def eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str, eps_rel: float) -> torch.Tensor:
    """``(X + eps I)^(-1/p)`` (by the heuristic, with the relative floor) of every block of a
    CPU stack (the module doc says how). An op opaque to torch.compile, so that torch's thread
    count is read when it runs."""
    out = torch.empty_like(X)
    b = X.shape[-1]

    def solve(blocks: slice) -> None:
        padded = pad_aligned(shifted(X[blocks], eps))
        mu, Q = torch.linalg.eigh(padded)
        if padded.shape[-1] == b:
            spectral_root(mu, Q, p, eps, heuristic, eps_rel, out=out[blocks])
        else:  # X's root is the top-left corner
            out[blocks] = spectral_root(mu, Q, p, eps, heuristic, eps_rel)[..., :b, :b]

    _in_chunks(X, solve)
    return out


@eigh_root.register_fake
def _(X: torch.Tensor, p: int, eps: float, heuristic: str, eps_rel: float) -> torch.Tensor:
    return torch.empty_like(X)


@torch.library.custom_op("dash_fn::cpu_eigenvectors", mutates_args=())
def eigenvectors(X: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.eigh(X).eigenvectors`` of every block of a CPU stack (the module doc says
    how), a part again in float64 should LAPACK not converge (rounded back): a refresh never
    ends a run. An op opaque to torch.compile, so that the retry happens inside a compiled step
    too."""
    out = torch.empty_like(X)  # row-major, as the fake promises (LAPACK's own are column-major)

    def solve(blocks: slice) -> None:
        try:
            out[blocks] = torch.linalg.eigh(X[blocks]).eigenvectors
        except torch.linalg.LinAlgError:
            out[blocks] = torch.linalg.eigh(X[blocks].double()).eigenvectors

    _in_chunks(X, solve)
    return out


@eigenvectors.register_fake
def _(X: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(X)


def _in_chunks(X: torch.Tensor, solve) -> None:
    """``solve(blocks)`` over the stack ``X`` in slices of :data:`CPU_CHUNK_ELEMENTS`: one part
    of the stack per torch thread, side by side in the workers (in the caller's thread where one
    thread serves), each part a chunk at a time."""
    count = X.shape[0]
    chunk = max(1, CPU_CHUNK_ELEMENTS // (X.shape[-1] * X.shape[-1]))

    def solve_part(part: slice) -> None:
        for lo in range(part.start, part.stop, chunk):
            solve(slice(lo, min(lo + chunk, part.stop)))

    threads = min(torch.get_num_threads(), count)
    if threads <= 1:
        solve_part(slice(0, count))
        return
    bounds = [round(i * count / threads) for i in range(threads + 1)]
    list(_workers(threads).map(solve_part, [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]))
