"""Shampoo's preconditioner (docs/ALGORITHM.md 4 d, g): each block's gradient EMA multiplied by
its factors' inverse p-th roots, ``U = L^{-1/p} Gt R^{-1/p}``, grafted by the step onto Adam's
norm (or a fixed one)."""

from __future__ import annotations

import math

import torch

from ..config import DashConfig
from ..roots import fields_read, refresh_roots, resolve_solver
from ..roots.matmul import Products
from ..roots.scaling import root
from ..schedule import SCHEDULE_KEY, has_root, staggered
from ..strategy import Strategy
from .unit import Directions, Preconditioner, StepContext


class Shampoo(Preconditioner):
    """Inverse roots refreshed by a root solver; tensor-core float16 products under "auto"."""

    name = "shampoo"
    # float16 held within 0.005 of float32's final loss on every seed with coupled Newton (the
    # accelerators' solver); bfloat16 did not (benchmarks/RESULTS.md, "Precision of the products")
    auto_precision = "float16"

    def solver(self, config: DashConfig, strategy: Strategy) -> str:
        """The root solver (:func:`dash_fn.roots.resolve_solver`)."""
        return resolve_solver(config, strategy)

    def fields_read(self, config: DashConfig, solver: str) -> tuple[str, ...]:
        """The root solver's (:func:`dash_fn.roots.fields_read`)."""
        return fields_read(config, solver)

    def solve(
        self,
        factors: torch.Tensor,
        old: torch.Tensor,
        p: int,
        config: DashConfig,
        start: torch.Tensor | None,
        strategy: Strategy,
        products: Products,
        due: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inverse p-th roots (:func:`dash_fn.roots.refresh_roots`)."""
        return refresh_roots(factors, old, p, config, start, strategy, products, due)

    def direction(self, ctx: StepContext, g: int, G: torch.Tensor) -> Directions:
        """Adam's direction (c, e, f) and, from step s on, the preconditioned gradient EMA (g),
        ready where a block has its first root: from step s on under the periodic schedule,
        from each block's first refresh under the staggered one."""
        config, local = ctx.config, ctx.local
        group = local.groups[g]
        Gt, D = ctx.forms.adam_direction(config, ctx.state["groups", str(g)], G, ctx.corrections, ctx.t, ctx.guard)
        s = config.start_prec_step
        if s == math.inf:
            return Directions(D, None, False)
        U, precondition = Gt, ctx.forms.products.of("precondition")
        if group.left is not None:
            U = precondition(ctx.refreshed(group, group.left), U)
        if group.right is not None:
            U = precondition(U, ctx.refreshed(group, group.right))
        if group.diagonal_dim is not None:  # a thin block's long side (docs/ALGORITHM.md 2.5)
            A = ctx.state["groups", str(g), "A"].to(local.dtype)
            U = U * diagonal_root(A, group.diagonal_dim, config.resolved_root_order, config.eps, config.eps_rel)
        if staggered(config):  # a block's Adam direction until its first refresh
            side = group.factor_sides[0]
            ready = has_root(ctx.state[SCHEDULE_KEY, str(side.stack)], side.offset, group.count, ctx.t, config)
            return Directions(D, U, ready[:, None, None])
        return Directions(D, U, True if s == 1 else ctx.t >= s)


def diagonal_root(A: torch.Tensor, dim: int, p: int, eps: float, eps_rel: float) -> torch.Tensor:
    """``(d + eps)^(-1/p)`` of the long side's diagonal factor d: the grafting moment summed
    over ``dim``, which is diag(G G^T)'s EMA (tall blocks; diag(G^T G)'s for wide ones) at the
    grafting moment's decay; 0 where ``d <= eps_rel max(d)`` (the relative floor on the
    diagonal's eigenvalues; at eps_rel = 0, a row that never had a gradient gets no update)."""
    d = A.sum(dim, keepdim=True)
    floor = eps_rel * d.amax(dim=(-2, -1), keepdim=True) if eps_rel > 0 else 0.0
    # for p a power of two, square roots and a division, each correctly rounded, not pow:
    # torch's CPU kernels take pow in vector code but a loop's tail in scalar code, which round
    # differently, so a block's root would depend on how many blocks its stack holds
    return torch.where(d > floor, root(d + eps, p).reciprocal(), torch.zeros_like(d))
