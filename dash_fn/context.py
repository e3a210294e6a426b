"""What the stages of one step read: :class:`StepContext`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict

from .config import DashConfig
from .forms import DeviceForms
from .guard import Guard
from .plan import Plan

if TYPE_CHECKING:
    from .preconditioners.unit import Preconditioner


@dataclass(frozen=True)
class StepContext:
    """One step's view of its rank: this rank's blocks (``local``, the shard's plan; the
    model's is needed only to gather and scatter), the preconditioner and the forms the call
    runs (both picked once, at the step's entry), the non-finite guard, the step number ``t``
    (0-d, on the device) and its bias corrections (``1 - beta^t`` by use)."""

    config: DashConfig
    local: Plan
    state: TensorDict
    unit: Preconditioner
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
