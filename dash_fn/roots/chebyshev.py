"""Chebyshev (Clenshaw) inverse p-th roots (docs/ALGORITHM.md 5.4).

``f(x) = x^{-1/p}`` is fitted once per (delta = cheb_eps, d = cheb_degree, p) on
``[delta, 1 + delta]`` by the Chebyshev series at N = 10000 nodes of the first kind
``theta_j = pi (j + 1/2) / N``, ``x_j = delta + (1 + cos theta_j) / 2``:

    c_k = (2 / N) sum_j f(x_j) cos(k theta_j),  k = 0..d,   then c_0 <- c_0 / 2.

A block with scale s (no eps added) maps to ``S = 2 X / s - I`` (spectrum in [-1, 1] when
s >= lambda_max, always under fro), and Clenshaw's recurrence

    b_d = c_d I,  b_{d-1} = 2 c_d S + c_{d-1} I,  b_k = 2 S b_{k+1} - b_{k+2} + c_k I,
    q = S b_1 - b_2 + c_0 I

evaluates ``q = sum_k c_k T_k(S) ~ (X / s + delta I)^{-1/p}`` with d - 1 products. The result
``s^{-1/p} q ~ (X + delta s I)^{-1/p}`` is a true inverse root of a relatively shifted block.
Accuracy is set by the fit near the lower end: delta >= 1e-3 with d = 60 (the default) fits to
~1e-3 relative; delta = 1e-2 to ~1e-7. Any real p > 0 works. The step's precision rounds S and
``b_{k+1}``; coefficients are Python floats (exact in float64, rounded to float32 by float32 ops).

Extrapolation: on [-1, 1] every ``|T_k| <= 1``, so ``max_ij |q| <= sum_k |c_k|``. A power-
iteration scale below lambda_max / 2 puts eigenvalues of S beyond 1, where the degree-d
polynomial explodes; blocks with ``max_ij |q| > 2 sum_k |c_k|`` are returned as NaN, the failure
flag that makes :func:`dash_fn.roots.refresh_roots` keep their previous root.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..config import DashConfig
from .identity import identity_matrix
from .masking import flag_diverged
from .matmul import stacked_matmul
from .scaling import matrix_scale, root

FIT_NODES = 10000
_coefficient_cache: dict[tuple[float, int, float, int], tuple[float, ...]] = {}


def fit_coefficients(delta: float, degree: int, p: float, nodes: int = FIT_NODES) -> tuple[float, ...]:
    """``c_0..c_degree`` of ``x^{-1/p}`` on ``[delta, 1 + delta]`` (float64, see module doc)."""
    theta = np.pi * (np.arange(nodes) + 0.5) / nodes
    values = (delta + (1.0 + np.cos(theta)) / 2.0) ** (-1.0 / p)
    c = (2.0 / nodes) * (np.cos(np.outer(np.arange(degree + 1), theta)) @ values)
    c[0] /= 2.0
    return tuple(float(v) for v in c)


@torch.compiler.assume_constant_result
def chebyshev_coefficients(delta: float, degree: int, p: float) -> tuple[float, ...]:
    """Cached :func:`fit_coefficients`; a constant to torch.compile (computed once at trace time)."""
    key = (delta, degree, p, FIT_NODES)
    if key not in _coefficient_cache:
        _coefficient_cache[key] = fit_coefficients(delta, degree, p)
    return _coefficient_cache[key]


def clenshaw(
    S: torch.Tensor, coefficients: tuple[float, ...], product: Callable[..., torch.Tensor] = stacked_matmul
) -> torch.Tensor:
    """``sum_k c_k T_k(S)`` for a (K, b, b) stack S, with ``len(coefficients) - 2`` products."""
    identity = identity_matrix(S.shape[-1], S.dtype, S.device)
    c = coefficients
    d = len(c) - 1
    after = c[d] * identity  # b_{k+2}
    current = 2 * c[d] * S + c[d - 1] * identity  # b_{k+1}
    for k in range(d - 2, 0, -1):
        after, current = current, 2 * product(S, current) - after + c[k] * identity
    return product(S, current) - after + c[0] * identity


def chebyshev_inverse_root(
    X: torch.Tensor,
    p: int,
    config: DashConfig,
    start: torch.Tensor | None,
    product: Callable[..., torch.Tensor] = stacked_matmul,
) -> torch.Tensor:
    """``~(X + cheb_eps s I)^{-1/p}`` per block: a degree ``cheb_degree`` Chebyshev polynomial
    (NaN for blocks whose spectrum left the fitted interval far enough to explode)."""
    s = matrix_scale(X, config, start)
    identity = identity_matrix(X.shape[-1], X.dtype, X.device)
    S = 2 * (X / s) - identity
    coefficients = chebyshev_coefficients(config.cheb_eps, config.cheb_degree, p)
    q = clenshaw(S, coefficients, product)
    extrapolated = ~(q.abs().amax(dim=(-2, -1), keepdim=True) <= 2 * sum(abs(c) for c in coefficients))  # or NaN
    return flag_diverged(q / root(s, p), extrapolated)
