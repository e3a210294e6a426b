"""The identity matrix of the solvers, in the form torch.compile handles well, shifts by it, and diagonals."""

from __future__ import annotations

import torch


def identity_matrix(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (n, n) identity, built as ``arange == arange``.

    Same values as ``torch.eye``, which Inductor's CPU code turns into a per-element index
    compare through 8-bit vectors wherever the identity enters a fused kernel (terms such as
    ``1.5 I - 0.5 X``, which NDB forms twice per iteration), several times slower than this form."""
    index = torch.arange(n, device=device)
    return (index[:, None] == index[None, :]).to(dtype)


def shifted(X: torch.Tensor, eps: float) -> torch.Tensor:
    """``X + eps I`` for each block of a (K, b, b) stack."""
    return X + eps * identity_matrix(X.shape[-1], X.dtype, X.device)


def diagonal(X: torch.Tensor) -> torch.Tensor:
    """The diagonals of a stack of square matrices, ``X.diagonal(dim1=-2, dim2=-1)``, read as
    every (b+1)-th entry of each flattened matrix: the same values, without ``aten.diagonal``,
    whose Inductor lowering calls a deprecated torch helper that prints a FutureWarning."""
    return X.flatten(-2)[..., :: X.shape[-1] + 1]
