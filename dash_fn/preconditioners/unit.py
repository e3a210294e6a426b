"""What a preconditioner is to the step: :class:`Preconditioner`, and what its direction returns.

The step (:mod:`dash_fn.step`) is a pipeline that every preconditioner shares: factor EMAs (4 b),
a refresh on the schedule (4 d), each group's direction, grafting or a fixed norm (4 f, g),
momentum (h), decay and the update (a, i). A preconditioner supplies what differs: its state
slots, what a refresh computes from the factors (inverse roots, eigenbases) and what it does
around it, its direction, and the precision its products take under ``precision="auto"``.
Adding one means a module with a subclass, its entry in :data:`dash_fn.preconditioners.UNITS`,
and its constraints in ``dash_fn.config.PRECONDITIONERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from ..config import DashConfig
from ..plan import Plan
from ..roots.matmul import Products
from ..strategy import Strategy

if TYPE_CHECKING:
    from ..context import StepContext


class Directions(NamedTuple):
    """A group's directions before grafting (4 f, g): ``adam``, Adam's direction (the
    preconditioner's own where it has no grafting); ``preconditioned`` (None: none this step);
    ``ready``, where ``preconditioned`` replaces ``adam`` once grafted: True everywhere, False
    nowhere, or a bool tensor that broadcasts over the blocks (per block, or 0-d). Both
    directions are the step's own temporaries (grafting scales them in place), never state."""

    adam: torch.Tensor
    preconditioned: torch.Tensor | None
    ready: torch.Tensor | bool


class Preconditioner:
    """The contract; each method has the step's context (:class:`dash_fn.context.StepContext`)
    or the config, and no method may read the device on the host where the strategy forbids it
    (:mod:`dash_fn.forms`)."""

    name: str
    # what precision="auto" multiplies in on a device with tensor cores (dash_fn.roots.matmul)
    auto_precision: str

    def solver(self, config: DashConfig, strategy: Strategy) -> str:
        """The refresh's solver: the config's, or what "auto" picks under ``strategy``: eigh
        where the CPU's ops serve (LAPACK beats the matmul iterations there), elsewhere
        :meth:`accelerator_solver` (eigh syncs there once per call, cuSOLVER's error check, and
        so cannot be captured by CUDA graphs)."""
        if config.solver != "auto":
            return config.solver
        return "eigh" if strategy.cpu_ops else self.accelerator_solver(config)

    def fields_read(self, config: DashConfig, solver: str) -> tuple[str, ...]:
        """The DashConfig fields its refresh reads under ``solver`` (the solver's knobs)."""
        raise NotImplementedError

    def accelerator_solver(self, config: DashConfig) -> str:
        """What "auto" picks off the CPU: a matmul-only iteration."""
        raise NotImplementedError

    def group_slots(self, config: DashConfig) -> tuple[str, ...]:
        """The per-group state entries it keeps, each (N, rows, cols) like the group's blocks:
        the grafting moment ``A`` and, with ``beta_G > 0``, the gradient EMA ``Gt``."""
        return ("A", "Gt") if config.beta_G > 0 else ("A",)

    # the keys of the state entries that constants() may make
    constant_keys: tuple[str, ...] = ()

    def constants(self, plan: Plan, shard, config: DashConfig, device: torch.device) -> dict:
        """State entries it derives from config and plan (never stored in checkpoints: made
        by ``init`` and again on every load), under :attr:`constant_keys`."""
        return {}

    def refresh(self, ctx: StepContext, every: bool, refresh_stacks: Callable[[], None]) -> None:
        """Run ``refresh_stacks`` (the schedule's refresh of every factor stack: all of each,
        when ``every``, else the due slice) and whatever the preconditioner does around it."""
        refresh_stacks()

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
        """``(new, fell_back)``: a stack's refreshed matrices from its ``factors`` (p: the
        root's order), keeping ``old`` where a refresh fails, and the (K,) mask of those."""
        raise NotImplementedError

    def direction(self, ctx: StepContext, g: int, G: torch.Tensor) -> Directions:
        """Group ``g``'s directions from its gradient blocks ``G`` (updating its moments)."""
        raise NotImplementedError
