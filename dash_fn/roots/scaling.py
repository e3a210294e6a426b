"""Per-block scales s for the matmul solvers (docs/ALGORITHM.md 6).

Newton-type iterations converge only when the spectrum of X/s lies in their basin (X/s in
(0, 2) for NDB and CN) and converge fast only near 1, so each block is scaled by an
upper-bound-ish estimate of its largest eigenvalue:

- ``fro``: ``s = ||X||_F >= lambda_max`` (no constant; the scaled spectrum is in (0, 1]).
- ``pi``: ``s = scaling_const * lambda_hat`` from ``pi_steps`` power iterations on
  ``Xd = X + eps_power_iter I`` from the start vector ``V0[:, 0]``.
- ``pim``: as ``pi`` from all columns of ``V0`` at once, ``lambda_hat = max_j`` of the
  per-vector Rayleigh quotients.

Finally ``s >= 1e-30``. Every scale comes from its block alone. The start vectors are fixed
data (see :func:`dash_fn.roots.start_vectors`), so nothing here draws random numbers.
Norms are taken overflow-safely (entries are divided by the block's largest magnitude first),
so blocks scaled by 1e20 or 1e-20 get finite, proportional scales in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import DashConfig
from .identity import identity_matrix
from .matmul import aligned_width, stacked_matmul

SCALE_FLOOR = 1e-30


POW_STEP_BYTES = 128


def root(x: torch.Tensor, p: int) -> torch.Tensor:
    """``x^(1/p)`` elementwise; for p a power of two (every default p) by repeated square roots.

    Square roots are correctly rounded in every kernel, while a vectorized ``pow`` and its
    scalar tail round differently: with ``pow`` a block's root would depend on its position in
    the stack, and a rank holding part of a stack would not match one process bit for bit.
    Other p take ``pow`` on rows padded to whole POW_STEP_BYTES, so that every entry takes the
    vector path wherever it sits (torch's CPU loops take two vectors at a time, 128 bytes with
    AVX-512, and the rest in scalar code: 64-byte rows were not enough there, measured).
    """
    if p & (p - 1):
        n = x.shape[-1]
        width = aligned_width(n, x.dtype, POW_STEP_BYTES)
        wide = torch.nn.functional.pad(x, (0, width - n), value=1.0)
        return wide.pow(1.0 / p)[..., :n]
    while p > 1:
        x, p = x.sqrt(), p // 2
    return x


def _safe_norm(W: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Euclidean norm over ``dims`` (kept), computed as ``peak * ||W / peak||`` so that squares
    neither overflow nor underflow; zero where W is zero."""
    peak = W.abs().amax(dim=dims, keepdim=True)
    unit = torch.where(peak > 0, peak, torch.ones_like(peak))
    return torch.linalg.vector_norm(W / unit, dim=dims, keepdim=True) * peak


def frobenius_scale(X: torch.Tensor) -> torch.Tensor:
    """``||X_k||_F`` per block, shape (K, 1, 1)."""
    return _safe_norm(X, (-2, -1))


# power iterations of the spectral-norm estimate: its relative error falls as (s2 / s1)^(2T),
# and where s2 is close to s1 the estimate is close to s1 anyway (a weighted mean of the s_i)
SPECTRAL_STEPS = 8


def spectral_norm_estimate(X: torch.Tensor, steps: int = SPECTRAL_STEPS) -> torch.Tensor:
    """sigma_max of each block of a (K, r, c) stack, shape (K, 1, 1), by ``steps`` power
    iterations on ``X^T X`` (docs/ALGORITHM.md 4 f). The start is the squared column norms, a
    deterministic vector with a component along the top right singular vector for any X whose
    columns' energies are not exactly orthogonal to it; the estimate ``||X v||`` (``||v|| = 1``)
    never exceeds sigma_max. Computed on ``X / max|X|`` (no overflow); 0 for a zero block."""
    peak = X.abs().amax(dim=(-2, -1), keepdim=True)
    Y = X / torch.where(peak > 0, peak, torch.ones_like(peak))
    v = _unit(Y.square().sum(dim=-2).unsqueeze(-1))  # (K, c, 1)
    for _ in range(steps):
        v = _unit(stacked_matmul(Y.mT, stacked_matmul(Y, v)))
    return torch.linalg.vector_norm(stacked_matmul(Y, v), dim=(-2, -1), keepdim=True) * peak


def _unit(v: torch.Tensor) -> torch.Tensor:
    """Each column of a (K, n, 1) stack scaled to unit length (a zero column stays zero)."""
    norm = torch.linalg.vector_norm(v, dim=(-2, -1), keepdim=True)
    return v / torch.where(norm > 0, norm, torch.ones_like(norm))


def _normalize_columns(W: torch.Tensor) -> torch.Tensor:
    """Columns scaled to unit length; zero columns stay zero."""
    norm = _safe_norm(W, (-2,))
    return W / torch.where(norm > 0, norm, torch.ones_like(norm))


def _times(X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``X V`` for (K, b, b) and (K, b, k), with every block's bits independent of K: CPU
    batched matrix-vector products (k = 1) are not, so one vector goes elementwise."""
    if V.shape[-1] == 1:
        return (X * V.mT).sum(dim=-1, keepdim=True)
    return stacked_matmul(X, V)


def rayleigh_estimates(X: torch.Tensor, V0: torch.Tensor, steps: int, damping: float) -> torch.Tensor:
    """Per block and start vector, the Rayleigh quotient ``v^T Xd v / v^T v`` after ``steps``
    power iterations ``v <- Xd v / ||Xd v||`` from ``V0[:, j]``, with ``Xd = X + damping I``.

    X is (K, b, b), V0 is (b, k); returns (K, k). Each estimate is a Rayleigh quotient of Xd, so
    it never exceeds ``lambda_max(X) + damping`` (up to rounding); a zero block gives
    ``damping``. ``Xd v`` is formed as ``X v + damping v``: Xd itself is never built.
    """
    # (K, b, k) rather than a broadcast (b, k): a batched product per block keeps every block's
    # bits independent of the stack length (a folded (K b, b) x (b, k) product does not)
    V = V0.to(X.dtype).expand(X.shape[0], -1, -1)
    for _ in range(steps):
        V = _normalize_columns(_times(X, V) + damping * V)
    XdV = _times(X, V) + damping * V
    quotient = (V * XdV).sum(dim=-2)
    length = (V * V).sum(dim=-2)
    # a zero iterate (only when damping = 0 and X = 0) gives estimate 0, then the scale floor
    return quotient / torch.where(length > 0, length, torch.ones_like(length))


def power_iteration_scale(X: torch.Tensor, V0: torch.Tensor, config: DashConfig) -> torch.Tensor:
    """``scaling_const * max_j lambda_hat_j`` per block (K, 1, 1), from the columns of ``V0``."""
    estimates = rayleigh_estimates(X, V0, config.pi_steps, config.eps_power_iter)
    return config.scaling_const * estimates.amax(dim=-1)[:, None, None]


@dataclass(frozen=True)
class Scaling:
    """One way to scale (the module doc): ``vectors``, how many start vectors it needs;
    ``reads``, the DashConfig fields it reads; ``estimate``, the unfloored scale of X (in the
    scaling dtype) from the start vectors; ``largest``, its own estimate of lambda_max from the
    scale s."""

    vectors: Callable[[DashConfig], int]
    reads: tuple[str, ...]
    estimate: Callable[[torch.Tensor, DashConfig, Any], torch.Tensor]  # (X, config, V0: None under fro)
    largest: Callable[[torch.Tensor, DashConfig], torch.Tensor]


_POWER_ITERATION = ("scaling", "scaling_dtype", "scaling_const", "pi_steps", "eps_power_iter", "scaling_seed")
SCALINGS = {
    "fro": Scaling(
        lambda config: 0, ("scaling", "scaling_dtype"), lambda X, config, V0: frobenius_scale(X), lambda s, config: s
    ),
    "pi": Scaling(
        lambda config: 1,
        _POWER_ITERATION,
        lambda X, config, V0: power_iteration_scale(X, V0[:, :1], config),
        lambda s, config: s / config.scaling_const,
    ),
    "pim": Scaling(
        lambda config: config.pim_vectors,
        (*_POWER_ITERATION, "pim_vectors"),
        lambda X, config, V0: power_iteration_scale(X, V0, config),
        lambda s, config: s / config.scaling_const,
    ),
}


def matrix_scale(X: torch.Tensor, config: DashConfig, V0: torch.Tensor | None) -> torch.Tensor:
    """The scale s (K, 1, 1) of every block of the solver input X, in X's dtype.

    Computed in the wider of X's dtype and ``config.scaling_dtype``, then floored at 1e-30 so
    that zero blocks (with eps = 0) give a finite, positive scale.
    """
    scaling = SCALINGS[config.scaling]
    if scaling.vectors(config) and V0 is None:
        raise ValueError(f"scaling={config.scaling!r} needs start vectors (dash_fn.roots.start_vectors)")
    dtype = torch.promote_types(X.dtype, getattr(torch, config.scaling_dtype))
    return scaling.estimate(X.to(dtype), config, V0).clamp_min(SCALE_FLOOR).to(X.dtype)


def relatively_damped(Xr: torch.Tensor, s: torch.Tensor, config: DashConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Xr + eps_rel lambda_hat I, s (1 + eps_rel))``: the matmul solvers' relative floor
    (docs/ALGORITHM.md 5.6). lambda_hat is the scale's own estimate of lambda_max (``s`` under
    fro, an upper bound; ``s / scaling_const`` under pi and pim), so the shift costs no pass and
    the new scale stands to the shifted spectrum as the old one to Xr's."""
    if config.eps_rel == 0:
        return Xr, s
    lambda_hat = SCALINGS[config.scaling].largest(s, config)
    identity = identity_matrix(Xr.shape[-1], Xr.dtype, Xr.device)
    return Xr + (config.eps_rel * lambda_hat) * identity, s * (1 + config.eps_rel)
