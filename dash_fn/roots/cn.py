"""Coupled Newton inverse p-th roots (ALGORITHM.md 5.2).

With ``Xr = X + eps I``, scale s and ``z = (p + 1) / (2 s)``, start from ``Y_0 = z^{1/p} I``,
``M_0 = z Xr`` and iterate

    C = ((p + 1) I - M) / p,    Y <- Y C,    M <- C^p M,

which keeps ``M_k = Y_k^p Xr`` (every iterate is a polynomial in Xr, so all commute). On each
eigenvalue the map is ``m <- m ((p + 1 - m) / p)^p``: m -> 1 for m in (0, p + 1), i.e. for
s > lambda_max / 2, and then ``Y -> Xr^{-1/p}``. Near 0 an eigenvalue gains ``(1 + 1/p)^p``
per iteration (2.25 for p = 2, 2.44 for p = 4), so small eigenvalues of X/s need many steps.

Any integer p >= 1 works. Products per call: ``T - 1`` for ``Y C`` (``Y_0 C`` is a scalar
multiple) plus, for ``C^p M`` by repeated squaring, ``floor(log2 p) + popcount(p)`` in each
of the first ``T - 1`` iterations (``M_T`` is never used): ``3T - 3`` for p = 2, ``4T - 4``
for p = 4. ``matmul_dtype`` rounds the operands of the ``C^p M`` products; ``Y C`` stays in the
working dtype, as in the reference.

Masking (``cn_masking``): a block whose residual ``max_ij |M - I|`` falls below ``cn_tol``
stops changing (``torch.where``), on the device and per block, while the loop keeps its fixed
trip count: no host sync, and a block's result does not depend on its stack companions.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..config import DashConfig
from .matmul import rounded_matmul
from .scaling import matrix_scale

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Trace = Callable[[int, torch.Tensor, torch.Tensor], None]


def _power_times(C: torch.Tensor, p: int, M: torch.Tensor, product: Product) -> torch.Tensor:
    """``C^p M`` by repeated squaring (C and M commute, so the factors' order is free)."""
    result, power = M, C
    while True:
        if p & 1:
            result = product(power, result)
        p >>= 1
        if not p:
            return result
        power = product(power, power)


def residual(M: torch.Tensor) -> torch.Tensor:
    """``max_ij |M - I|`` per block, (K, 1, 1)."""
    identity = torch.eye(M.shape[-1], dtype=M.dtype, device=M.device)
    return (M - identity).abs().amax(dim=(-2, -1), keepdim=True)


def coupled_newton(
    Xr: torch.Tensor,
    s: torch.Tensor,
    p: int,
    steps: int,
    product: Product = torch.matmul,
    tol: float | None = None,
    trace: Trace | None = None,
) -> torch.Tensor:
    """``Y_T ~ Xr^{-1/p}`` after ``steps`` coupled Newton iterations on the scaled stack.

    ``s`` (K, 1, 1) is the scale, ``product`` multiplies for the ``C^p M`` update, ``tol`` (or
    None) enables masking. ``trace(k, Y_k, M_k)`` is called after iterations 1..steps-1 (the
    last one does not form M) to observe the invariant ``M_k = Y_k^p Xr``.
    """
    identity = torch.eye(Xr.shape[-1], dtype=Xr.dtype, device=Xr.device)
    z = (p + 1) / (2 * s)
    M = z * Xr
    Y = z ** (1.0 / p) * identity  # shape (K, b, b) via broadcasting with z
    active = torch.ones_like(s, dtype=torch.bool) if tol is not None else None
    for k in range(1, steps + 1):
        C = ((p + 1) * identity - M) / p
        Y_next = z ** (1.0 / p) * C if k == 1 else Y @ C  # Y_0 C is a scalar multiple of C
        Y = Y_next if active is None else torch.where(active, Y_next, Y)
        if k == steps:
            break
        M_next = _power_times(C, p, M, product)
        if active is None:
            M = M_next
        else:
            M = torch.where(active, M_next, M)
            active = active & (residual(M) >= tol)
        if trace is not None:
            trace(k, Y, M)
    return Y


def cn_inverse_root(X: torch.Tensor, p: int, config: DashConfig, start: torch.Tensor | None) -> torch.Tensor:
    """``(X + eps I)^{-1/p}`` per block by coupled Newton with ``config.newton_steps`` iterations."""
    identity = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    Xr = X + config.eps * identity
    s = matrix_scale(Xr, config, start)

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return rounded_matmul(a, b, config.matmul_dtype)

    tol = config.cn_tol if config.cn_masking else None
    return coupled_newton(Xr, s, p, config.newton_steps, product, tol).contiguous()
