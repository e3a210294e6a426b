"""The eigenvalue-corrected preconditioner (docs/ALGORITHM.md 4 k, 5.7; SOAP's form): Adam run in
the eigenbases ``Q_L, Q_R`` of each block's factors, both moments kept in those bases, the
direction rotated back; no grafting (Adam's second moment in the basis sets each entry's scale)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..config import DashConfig
from ..plan import Plan
from ..roots.basis import eigenbasis, qr_basis
from ..roots.identity import identity_matrix
from ..roots.masking import finite_blocks
from ..roots.matmul import Products
from ..schedule import DUE_BLOCKS_KEY, due_block_tables, due_blocks, staggered, staggers
from ..strategy import Strategy
from .unit import Directions, Preconditioner, StepContext


class EigenvalueCorrected(Preconditioner):
    """Eigenbases refreshed by eigh or orthogonal iteration."""

    name = "eigenvalue_corrected"
    # float16 did not hold within 0.005 of float32's final loss on every seed of this mode
    # (benchmarks/RESULTS.md, "Precision of the products")
    auto_precision = "float32"
    constant_keys = (DUE_BLOCKS_KEY,)

    def accelerator_solver(self, config: DashConfig) -> str:
        """Orthogonal iteration ("qr"), warm-started from the previous bases."""
        return "qr"

    def constants(self, plan: Plan, shard, config: DashConfig, device: torch.device) -> dict:
        """Under the staggered schedule, each group's due blocks (whose gradient EMA a refresh
        moves into new bases: :func:`dash_fn.schedule.due_block_tables`)."""
        if staggers(config) and config.beta_G > 0:
            return {DUE_BLOCKS_KEY: due_block_tables(plan, shard, config.inv_root_freq, device)}
        return {}

    def refresh(self, ctx: StepContext, every: bool, refresh_stacks: Callable[[], None]) -> None:
        """The refresh, then each group's gradient EMA moved into the bases it changed."""
        before = _bases_before(ctx, every) if ctx.config.beta_G > 0 else []
        refresh_stacks()
        for g, blocks, old in before:
            _rotate_gradient_ema(ctx, g, blocks, old)

    def fields_read(self, config: DashConfig, solver: str) -> tuple[str, ...]:
        """eigh's bases read nothing of the config; orthogonal iteration its ``qr_steps``."""
        return BASES[solver].reads

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
        """New eigenbases for a factor stack (5.7), keeping a block's old basis where its
        factor or its new basis is not finite (as the roots' refresh keeps roots). Their
        temporaries are a few stacks (LAPACK's or cuSOLVER's workspace, one product), so the
        stack is solved whole. (``p``, ``start`` and ``due`` concern roots.)"""
        finite_factor = finite_blocks(factors)
        safe = factors
        if not strategy.holds(finite_factor):
            identity = identity_matrix(factors.shape[-1], factors.dtype, factors.device)
            safe = torch.where(finite_factor[:, None, None], factors, identity)
        new = BASES[self.solver(config, strategy)].solve(safe, old, config, strategy, products)
        ok = finite_factor & finite_blocks(new)
        return strategy.select(ok[:, None, None], new, old).contiguous(), ~ok

    def direction(self, ctx: StepContext, g: int, G: torch.Tensor) -> Directions:
        """Adam's direction of ``rot(G) = Q_L^T G Q_R``, with both moments kept in the bases,
        rotated back: ``Q_L [Gt_hat / (sqrt(A_hat) + eps)] Q_R^T``. A thin block's diagonal
        side and a one-sided segment's missing side are not rotated (their basis is I), as is
        every block before its first basis (its ``Fbar`` is still I: Adam's direction)."""
        group = ctx.local.groups[g]
        left = None if group.left is None else ctx.refreshed(group, group.left)
        right = None if group.right is None else ctx.refreshed(group, group.right)
        rotate = ctx.forms.products.of("rotate")
        if left is not None:
            G = rotate(left.mT, G)
        if right is not None:
            G = rotate(G, right)
        _, D = ctx.forms.adam_direction(ctx.config, ctx.state["groups", str(g)], G, ctx.corrections, ctx.t, ctx.guard)
        if left is not None:
            D = rotate(left, D)
        return Directions(D if right is None else rotate(D, right.mT), None, False)


class BasisSolver(NamedTuple):
    """``solve(factors, previous bases, config, strategy, products) -> new bases`` (5.7), and
    the DashConfig fields it ``reads``."""

    solve: Callable
    reads: tuple[str, ...]


BASES = {
    "eigh": BasisSolver(lambda X, old, config, strategy, products: eigenbasis(X, strategy.cpu_ops), ()),
    "qr": BasisSolver(
        lambda X, old, config, strategy, products: qr_basis(X, old, config.qr_steps, products.of("qr")), ("qr_steps",)
    ),
}


def _bases_before(ctx: StepContext, every: bool) -> list:
    """``[(g, blocks, bases)]``: for each group, the blocks this step may refresh (the
    staggered schedule's due blocks; None: all, as on a step that refreshes ``every`` root) and
    their bases before it, one per side (None for a side without a basis)."""
    found = []
    for g, group in enumerate(ctx.local.groups):
        blocks = None
        if staggered(ctx.config) and not every:
            blocks = due_blocks(ctx.state[DUE_BLOCKS_KEY, str(g)], ctx.t, ctx.config)
        # (all of them: copied, as the refresh writes them in place)
        bases = [None if side is None else ctx.stored(group, side, blocks) for side in (group.left, group.right)]
        found.append((g, blocks, [b if b is None or blocks is not None else b.clone() for b in bases]))
    return found


def _rotate_gradient_ema(ctx: StepContext, g: int, blocks: torch.Tensor | None, before: list) -> None:
    """The gradient EMA of a group's ``blocks`` (None: all) moved into their new bases (k):
    kept as ``Gt' = Q_L^T Gt Q_R``, it becomes ``Q_L'^T Q_L Gt' Q_R^T Q_R'``, one side at a
    time and only where that side's basis changed (elsewhere its bits stay)."""
    group, dtype = ctx.local.groups[g], ctx.local.dtype
    entry = ctx.state["groups", str(g), "Gt"]
    X = (entry if blocks is None else entry.index_select(0, blocks)).to(dtype)
    for is_left, side, old in ((True, group.left, before[0]), (False, group.right, before[1])):
        if side is None or old is None:
            continue
        new = ctx.stored(group, side, blocks)
        changed = (new != old).flatten(1).any(1)
        Q_old, Q_new = old.to(dtype), new.to(dtype)
        rotate = ctx.forms.products.of("rotate")
        moved = rotate(Q_new.mT, rotate(Q_old, X)) if is_left else rotate(rotate(X, Q_old.mT), Q_new)
        X = ctx.forms.select(changed[:, None, None], moved, X)
    if blocks is None:
        entry.copy_(X)
    else:
        entry.index_copy_(0, blocks, X.to(entry.dtype))
