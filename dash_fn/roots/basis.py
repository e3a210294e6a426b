"""Eigenbases of stacks of symmetric PSD blocks, for the eigenvalue-corrected preconditioner
(docs/ALGORITHM.md 5.7).

Each block's basis Q is orthogonal with its columns ordered by decreasing eigenvalue: the order
in which orthogonal iteration converges, so that a basis refreshed by ``qr`` from one found by
``eigh`` (or by an earlier ``qr``) keeps each column where it was, and with it the column's
entries of the second moment kept in that basis. (In eigh's increasing order one step of
orthogonal iteration scrambles a basis instead: each column would be orthogonalized against
those of smaller eigenvalues first; benchmarks/basis_gpu.py shows the effect.)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .eigh import pad_aligned
from .eigh_cpu import eigenvectors
from .identity import diagonal, shifted
from .matmul import stacked_matmul

# A relative shift of each normalized factor: eigenvectors unchanged, and exact zeros broken up
# (a factor's rows for embedding tokens never seen), on which MKL's ssyevd failed to converge
# (a 256 x 256 float32 factor with 158 zero rows, in train_lm; shifted, it converges)
SHIFT = 1e-6


def eigenbasis(X: torch.Tensor, cpu_ops: bool = False) -> torch.Tensor:
    """Eigenvectors of each block of a symmetric (K, b, b) stack, by decreasing eigenvalue.

    Each block is decomposed as ``X / max_i |X_ii| + SHIFT I`` (the same eigenvectors; for a
    PSD X, eigenvalues in [SHIFT, b + SHIFT]), and, where its rows are not whole 64-byte lines,
    embedded in an aligned ``diag(., -I)`` (below every eigenvalue), so that its result does
    not depend on its position in the stack (:func:`pad_aligned`); its eigenvectors are then
    the last b columns' top b rows. ``cpu_ops``: by the CPU's threaded op
    (:func:`dash_fn.roots.eigh_cpu.eigenvectors`), which retries in float64 what LAPACK cannot
    decompose. ``torch.linalg.eigh`` reads its error flags on the host: one sync per call on a
    GPU."""
    b = X.shape[-1]
    peak = diagonal(X).abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    padded = pad_aligned(shifted(X / peak[..., None], SHIFT), -1.0)
    Q = eigenvectors(padded) if cpu_ops else torch.linalg.eigh(padded).eigenvectors
    return Q[..., :b, Q.shape[-1] - b :].flip(-1).contiguous()


def qr_basis(
    X: torch.Tensor, Q: torch.Tensor, steps: int, product: Callable[..., torch.Tensor] = stacked_matmul
) -> torch.Tensor:
    """``steps`` orthogonal iterations ``Q <- qr(X Q)`` from the previous bases ``Q`` (SOAP's
    refresh): matrix products and a batched QR, no host sync. A column's sign may flip, which
    changes nothing downstream (the second moment holds squares, and the basis rotates both
    ways). ``product`` multiplies (the step's precision). Aligned as :func:`eigenbasis` (padded
    with I: the QR of ``diag(X Q, I)`` is ``diag(qr(X Q), I)``)."""
    b = X.shape[-1]
    for _ in range(steps):
        Y = pad_aligned(product(X, Q), 1.0)
        Q = torch.linalg.qr(Y).Q[..., :b, :b].contiguous()
    return Q
