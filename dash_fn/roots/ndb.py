"""Newton-Denman-Beavers inverse p-th roots, p a power of two (docs/ALGORITHM.md 5.3).

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

The step's precision (:mod:`dash_fn.precision`) rounds the operands of all three products (the
reference stores Y and Z in 16 bits); E and the iterates stay in the working dtype.

Residual ``max_ij |Z Y - I|`` (exact iterates keep the eigenvalues of Z Y in [0, 1]; the
product Z Y is formed anyway for E), checked on iterates 0..T-1, see
:mod:`dash_fn.roots.masking`: with ``ndb_masking`` a block whose residual is below ``ndb_tol``
stops changing while the trip count stays fixed; a block whose residual exceeds ``DIVERGED``
(16-bit rounding on an ill-conditioned block, or a scale below lambda_max / 3) comes back as
NaN, the failure flag.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import DashConfig
from .identity import identity_matrix, shifted
from .masking import diverging, flag_diverged, residual, select
from .matmul import stacked_matmul
from .scaling import matrix_scale, relatively_damped

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Trace = Callable[[int, torch.Tensor, torch.Tensor], None]


def denman_beavers(
    A: torch.Tensor,
    steps: int,
    root: str,
    product: Product = stacked_matmul,
    tol: float | None = None,
    trace: Trace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(root, diverged)``: ``A^{1/2}`` (``root="sqrt"``: Y_T) or ``A^{-1/2}``
    (``root="inv_sqrt"``: Z_T) after ``steps`` NDB iterations on an already scaled (K, b, b)
    stack A, and per block (K, 1, 1) whether a residual exceeded ``masking.DIVERGED``.

    ``tol`` (or None) enables masking. ``trace(k, Y_k, Z_k)`` is called after iterations
    1..steps-1 (the last forms only one half) to observe ``Y_k = A Z_k`` and ``Y_k Z_k -> I``.
    """
    if root not in ("sqrt", "inv_sqrt"):
        raise ValueError(f"denman_beavers: root must be 'sqrt' or 'inv_sqrt', got {root!r}")
    identity = identity_matrix(A.shape[-1], A.dtype, A.device)
    Y, Z = A, identity.expand_as(A)
    diverged = torch.zeros((A.shape[0], 1, 1), dtype=torch.bool, device=A.device)
    active = torch.ones_like(diverged) if tol is not None else None
    for k in range(1, steps + 1):
        ZY = Y if k == 1 else product(Z, Y)  # Z_0 = I: iteration 1 multiplies only Y_0 E
        E = 1.5 * identity - 0.5 * ZY
        r = residual(ZY)
        diverged = diverged | diverging(r)
        if active is not None and tol is not None:  # both set or both None
            active = active & (r >= tol)
        last = k == steps
        if not last or root == "sqrt":
            Y = select(active, product(Y, E), Y)
        if not last or root == "inv_sqrt":
            Z = select(active, E if k == 1 else product(E, Z), Z)
        if trace is not None and not last:
            trace(k, Y, Z)
    return (Y if root == "sqrt" else Z), diverged


def ndb_root(
    Xr: torch.Tensor, s: torch.Tensor, p: int, steps: int, product: Product = stacked_matmul, tol: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Xr^{-1/p}, diverged)`` from ``steps`` NDB iterations per call, for a stack with scale s.

    p must be a power of two (p = 2^j, j >= 1): j - 1 square roots, each rescaled by the square
    root of the previous scale, then one inverse square root.
    """
    stages = p.bit_length() - 1
    if p < 2 or p != 1 << stages:
        raise ValueError(f"ndb: p must be a power of two >= 2, got {p!r}")
    operand, diverged = Xr, torch.zeros_like(s, dtype=torch.bool)
    for _ in range(stages - 1):
        root, failed = denman_beavers(operand / s, steps, "sqrt", product, tol)
        operand, diverged, s = root * s.sqrt(), diverged | failed, s.sqrt()
    root, failed = denman_beavers(operand / s, steps, "inv_sqrt", product, tol)
    return root / s.sqrt(), diverged | failed


def ndb_inverse_root(
    X: torch.Tensor, p: int, config: DashConfig, start: torch.Tensor | None, product: Product = stacked_matmul
) -> torch.Tensor:
    """``(X + eps I)^{-1/p}`` per block by NDB with ``config.newton_steps`` iterations per call
    (NaN for blocks that diverged); p a power of two. With ``eps_rel``, of ``X + eps I``
    relatively damped. ``product`` multiplies (the step's precision)."""
    Xr = shifted(X, config.eps)
    Xr, s = relatively_damped(Xr, matrix_scale(Xr, config, start), config)
    tol = config.ndb_tol if config.ndb_masking else None
    return flag_diverged(*ndb_root(Xr, s, p, config.newton_steps, product, tol))
