"""Newton-Denman-Beavers inverse p-th roots, p a power of two (ALGORITHM.md 5.3).

The coupled iteration on a scaled block A (spectrum in (0, 2)), from ``Y_0 = A``, ``Z_0 = I``:

    E = 1.5 I - 0.5 Z Y,    Y <- Y E,    Z <- E Z,

converges to ``Y -> A^{1/2}``, ``Z -> A^{-1/2}`` and keeps ``Y_k = A Z_k``; on each eigenvalue
``w = y z`` follows ``w <- w (3 - w)^2 / 4`` (gain 2.25 near 0, so small eigenvalues need
many steps; unconverged ones get capped roots, an implicit damping). Iteration 1 needs one
product (``Z_0 = I``), later ones three; the last iteration forms only the half the caller
uses, so a call costs ``3T - 3`` products.

Roots: with ``Xr = X + eps I`` and scale s, p = 2 is ``Z(Xr / s) / sqrt(s)``; p = 4 is
``S = sqrt(s) Y(Xr / s)`` and then ``Z(S / sqrt(s)) / s^{1/4}`` (the square root's spectrum is
bounded by ``sqrt(s)``); each further doubling of p inserts one more square root. p = 4 costs
``2 (3T - 3) = 54`` products at T = 10.

``matmul_dtype`` rounds the operands of all three products (the reference stores Y and Z in
16 bits); E and the iterates stay in the working dtype.

Masking (``ndb_masking``): the residual ``max_ij |Z Y - I| = 2 max_ij |E - I|`` comes free with
E; a block whose residual falls below ``ndb_tol`` stops changing (``torch.where``), on the
device and per block, while the trip count stays fixed.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..config import DashConfig
from .cn import residual
from .matmul import rounded_matmul
from .scaling import matrix_scale

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Trace = Callable[[int, torch.Tensor, torch.Tensor], None]


def _select(active: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return new if active is None else torch.where(active, new, old)


def denman_beavers(
    A: torch.Tensor,
    steps: int,
    root: str,
    product: Product = torch.matmul,
    tol: float | None = None,
    trace: Trace | None = None,
) -> torch.Tensor:
    """``A^{1/2}`` (``root="sqrt"``: Y_T) or ``A^{-1/2}`` (``root="inv_sqrt"``: Z_T) after
    ``steps`` NDB iterations; A is an already scaled (K, b, b) stack.

    ``tol`` (or None) enables masking. ``trace(k, Y_k, Z_k)`` is called after iterations
    1..steps-1 (the last forms only one half) to observe ``Y_k = A Z_k`` and ``Y_k Z_k -> I``.
    """
    if root not in ("sqrt", "inv_sqrt"):
        raise ValueError(f"denman_beavers: root must be 'sqrt' or 'inv_sqrt', got {root!r}")
    identity = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    Y, Z = A, identity.expand_as(A)
    active = torch.ones((A.shape[0], 1, 1), dtype=torch.bool, device=A.device) if tol is not None else None
    for k in range(1, steps + 1):
        ZY = Y if k == 1 else product(Z, Y)  # Z_0 = I: iteration 1 multiplies only Y_0 E
        E = 1.5 * identity - 0.5 * ZY
        if active is not None:
            active = active & (residual(ZY) >= tol)
        last = k == steps
        if not last or root == "sqrt":
            Y = _select(active, product(Y, E), Y)
        if not last or root == "inv_sqrt":
            Z = _select(active, E if k == 1 else product(E, Z), Z)
        if trace is not None and not last:
            trace(k, Y, Z)
    return Y if root == "sqrt" else Z


def ndb_inverse_root(X: torch.Tensor, p: int, config: DashConfig, start: torch.Tensor | None) -> torch.Tensor:
    """``(X + eps I)^{-1/p}`` per block by NDB with ``config.newton_steps`` iterations per call.

    p must be a power of two (p = 2^j, j >= 1): the root is built from j - 1 square roots and
    one inverse square root.
    """
    stages = p.bit_length() - 1
    if p < 2 or p != 1 << stages:
        raise ValueError(f"ndb: p must be a power of two >= 2, got {p!r}")
    identity = torch.eye(X.shape[-1], dtype=X.dtype, device=X.device)
    Xr = X + config.eps * identity
    sigma = matrix_scale(Xr, config, start)

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return rounded_matmul(a, b, config.matmul_dtype)

    def solve(A: torch.Tensor, root: str) -> torch.Tensor:
        tol = config.ndb_tol if config.ndb_masking else None
        return denman_beavers(A, config.newton_steps, root, product, tol)

    operand = Xr
    for _ in range(stages - 1):
        operand = solve(operand / sigma, "sqrt") * sigma.sqrt()
        sigma = sigma.sqrt()
    return (solve(operand / sigma, "inv_sqrt") / sigma.sqrt()).contiguous()
