"""What a preconditioner is to the step: :class:`Preconditioner`, the context its methods get
(:class:`StepContext`) and what its direction returns (:class:`Directions`).

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
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tensordict import TensorDict

from ..config import DashConfig
from ..forms import DeviceForms
from ..guard import Guard
from ..plan import Plan
from ..roots.matmul import Products
from ..strategy import Strategy


@dataclass(frozen=True)
class StepContext:
    """One step's view of its rank: this rank's blocks (``local``, the shard's plan; the
    model's is needed only to gather and scatter), the preconditioner and the forms the call
    runs (both picked once, at the step's entry), the non-finite guard, the step number ``t``
    (0-d, on the device) and its bias corrections (``1 - beta^t`` by use)."""

    config: DashConfig
    local: Plan
    state: TensorDict
    unit: Preconditioner  # (defined below)
    forms: DeviceForms
    guard: Guard
    t: torch.Tensor
    corrections: dict

    def stored(self, group, side, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """A group's slice of a factor stack's refreshed matrices ``Fbar`` (inverse roots, or
        eigenbases) as stored: of ``blocks`` (None: all of them, a view)."""
        Fbar = self.state["factors", str(side.stack), "Fbar"][side.offset : side.offset + group.count]
        return Fbar if blocks is None else Fbar.index_select(0, blocks)

    def refreshed(self, group, side) -> torch.Tensor:
        """:meth:`stored` of every block of the group, widened to the state dtype
        (:mod:`dash_fn.storage`)."""
        return self.stored(group, side).to(self.local.dtype)


class Directions(NamedTuple):
    """A group's directions before grafting (docs/ALGORITHM.md 4 f, g).

    ``adam`` is Adam's direction (the preconditioner's own direction where it takes no
    grafting); ``preconditioned`` the preconditioned one (None: none this step); ``ready`` where
    ``preconditioned``, once grafted, replaces ``adam``: True everywhere, False nowhere, or a bool
    tensor that broadcasts over the blocks (per block, or 0-d). Both directions are the step's
    own temporaries (grafting scales them in place), never state tensors.
    """

    adam: torch.Tensor
    preconditioned: torch.Tensor | None
    ready: torch.Tensor | bool


class Preconditioner:
    """A preconditioner as the step runs it: subclass it, give it a ``name`` and an
    ``auto_precision`` ("float16" or "float32": what ``precision="auto"`` multiplies in on a
    device with tensor cores), and implement ``fields_read``, ``solve`` and ``direction`` (and
    ``solver`` or ``accelerator_solver``). The step context (``StepContext``)
    gives the config, this rank's plan, the state, the device forms and the non-finite guard;
    no method may read a device value on the host where the strategy forbids it
    (``dash_fn.forms``)."""

    name: str
    auto_precision: str
    # the keys of the state entries that constants() may make
    constant_keys: tuple[str, ...] = ()

    def solver(self, config: DashConfig, strategy: Strategy) -> str:
        """The refresh's solver: the config's, or what "auto" picks: eigh where the CPU's ops
        serve (LAPACK beats the matmul iterations there), elsewhere ``accelerator_solver``
        (eigh syncs there once per call, cuSOLVER's error check, which CUDA graphs cannot
        capture).

        Args:
            config: the config.
            strategy: the call's execution strategy (``dash_fn.strategy``).

        Returns:
            The solver's name.
        """
        if config.solver != "auto":
            return config.solver
        return "eigh" if strategy.cpu_ops else self.accelerator_solver(config)

    def accelerator_solver(self, config: DashConfig) -> str:
        """What "auto" picks off the CPU: a matmul-only iteration.

        Args:
            config: the config.

        Returns:
            The solver's name.
        """
        raise NotImplementedError

    def fields_read(self, config: DashConfig, solver: str) -> tuple[str, ...]:
        """The DashConfig fields its refresh reads under ``solver``: the solver's knobs.

        Args:
            config: the config.
            solver: the resolved solver.

        Returns:
            The field names.
        """
        raise NotImplementedError

    def group_slots(self, config: DashConfig) -> tuple[str, ...]:
        """The per-group state entries it keeps, each (N, rows, cols) like the group's blocks;
        by default the grafting moment ``A`` and, with ``beta_G > 0``, the gradient EMA ``Gt``.

        Args:
            config: the config.

        Returns:
            The entries' names.
        """
        return ("A", "Gt") if config.beta_G > 0 else ("A",)

    def constants(self, plan: Plan, shard, config: DashConfig, device: torch.device) -> dict:
        """State entries it derives from config and plan, under ``constant_keys``: never stored
        in checkpoints, made by ``init`` and again on every load. None by default.

        Args:
            plan: the model's blocking plan.
            shard: this rank's share of it.
            config: the config.
            device: the state's device.

        Returns:
            The entries by key.
        """
        return {}

    def refresh(self, ctx: StepContext, every: bool, refresh_stacks: Callable[[], None]) -> None:
        """Run the schedule's refresh and what the preconditioner does around it.

        Args:
            ctx: the step context.
            every: whether every block refreshes (else the staggered schedule's due slice).
            refresh_stacks: refreshes every factor stack (by ``solve``).
        """
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
        """A stack's refreshed matrices (inverse roots, bases...) from its factors, keeping the
        old one of a block whose refresh fails.

        Args:
            factors: the (K, b, b) factors.
            old: the (K, b, b) matrices the refresh replaces.
            p: the order of the stack's roots.
            config: the config.
            start: power-iteration start vectors (b, k), or None.
            strategy: the call's execution strategy.
            products: the matrix products of the call's precision (``dash_fn.roots.matmul``).
            due: the blocks the caller keeps (None: all); a form that reads it on the host may
                skip the others.

        Returns:
            ``(new, fell_back)``: the (K, b, b) matrices and a (K,) bool mask of the blocks
            that kept their old one.
        """
        raise NotImplementedError

    def direction(self, ctx: StepContext, g: int, G: torch.Tensor) -> Directions:
        """Group ``g``'s directions from its gradient blocks, updating its moments.

        Args:
            ctx: the step context.
            g: the group's index in this rank's plan.
            G: the group's (N, rows, cols) gradient blocks.

        Returns:
            The directions before grafting.
        """
        raise NotImplementedError
