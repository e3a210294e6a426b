"""Coupled Newton inverse p-th roots (docs/ALGORITHM.md 5.2).

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
for p = 4. The step's precision (:mod:`dash_fn.precision`) rounds the operands of the ``C^p M``
products; ``Y C``, which forms the result, stays in the working dtype, as in the reference.

Residual ``max_ij |M - I|`` (exact iterates: every eigenvalue of M_k, k >= 1, is in (0, 1]),
see :mod:`dash_fn.roots.masking`: with ``cn_masking`` a block freezes after the first iteration
whose residual is below ``cn_tol`` (the loop keeps its fixed trip count: no host sync, and a
block's result does not depend on its stack companions); a block whose residual exceeds
``DIVERGED`` comes back as NaN, the failure flag.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import DashConfig
from .identity import identity_matrix, shifted
from .masking import diverging, flag_diverged, residual, select
from .matmul import stacked_matmul
from .scaling import matrix_scale, relatively_damped, root

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


def coupled_newton(
    Xr: torch.Tensor,
    s: torch.Tensor,
    p: int,
    steps: int,
    product: Product = stacked_matmul,
    tol: float | None = None,
    trace: Trace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Y_T, diverged)``: ``Y_T ~ Xr^{-1/p}`` after ``steps`` coupled Newton iterations, and
    per block (K, 1, 1) whether a residual exceeded ``masking.DIVERGED``.

    ``s`` (K, 1, 1) is the scale, ``product`` multiplies for the ``C^p M`` update, ``tol`` (or
    None) enables masking. ``trace(k, Y_k, M_k)`` is called after iterations 1..steps-1 (the
    last one does not form M) to observe the invariant ``M_k = Y_k^p Xr``.
    """
    identity = identity_matrix(Xr.shape[-1], Xr.dtype, Xr.device)
    z = (p + 1) / (2 * s)
    M = z * Xr
    active = torch.ones_like(s, dtype=torch.bool) if tol is not None else None
    diverged = torch.zeros_like(s, dtype=torch.bool)
    Y = Xr  # a placeholder, never read: the first iteration sets Y_1 (steps >= 1)
    for k in range(1, steps + 1):
        C = ((p + 1) * identity - M) / p
        # Y_0 = z^{1/p} I, so Y_1 = Y_0 C needs no product (and every block is active)
        Y = root(z, p) * C if k == 1 else select(active, stacked_matmul(Y, C), Y)
        if k == steps:
            break  # M_T would only serve a next iteration
        M = select(active, _power_times(C, p, M, product), M)
        r = residual(M)
        diverged = diverged | diverging(r)
        if active is not None and tol is not None:  # both set or both None
            active = active & (r >= tol)
        if trace is not None:
            trace(k, Y, M)
    return Y, diverged


def cn_inverse_root(
    X: torch.Tensor, p: int, config: DashConfig, start: torch.Tensor | None, product: Product = stacked_matmul
) -> torch.Tensor:
    """``(X + eps I)^{-1/p}`` per block by coupled Newton with ``config.newton_steps`` iterations
    (NaN for blocks that diverged); with ``eps_rel``, of ``X + eps I`` relatively damped.
    ``product`` multiplies for the ``C^p M`` update (the step's precision)."""
    Xr = shifted(X, config.eps)
    Xr, s = relatively_damped(Xr, matrix_scale(Xr, config, start), config)
    tol = config.cn_tol if config.cn_masking else None
    return flag_diverged(*coupled_newton(Xr, s, p, config.newton_steps, product, tol))
