"""The preconditioners, one module each (:mod:`.unit` says what one supplies), picked once per
call by the config's ``preconditioner``, as the device forms are (:mod:`dash_fn.forms`)."""

from __future__ import annotations

import torch

from ..config import DashConfig
from ..roots.matmul import Products, products_for
from ..strategy import Strategy
from .eigenvalue_corrected import EigenvalueCorrected
from .shampoo import Shampoo
from .unit import Directions, Preconditioner, StepContext

UNITS: dict[str, Preconditioner] = {unit.name: unit for unit in (Shampoo(), EigenvalueCorrected())}

__all__ = [
    "UNITS",
    "Directions",
    "Preconditioner",
    "StepContext",
    "unit_for",
    "resolve_solver",
    "fields_read",
    "config_products",
]


def unit_for(config: DashConfig) -> Preconditioner:
    """The preconditioner a config names."""
    return UNITS[config.preconditioner]


def resolve_solver(config: DashConfig, strategy: Strategy) -> str:
    """The solver a config's refresh runs under a strategy (:meth:`Preconditioner.solver`)."""
    return unit_for(config).solver(config, strategy)


def fields_read(config: DashConfig, solver: str) -> tuple[str, ...]:
    """The DashConfig fields a config's refresh reads under a solver: its knobs, the one list
    of them (every other solver knob does nothing there). A root solver's and, for the matmul
    iterations, the scaling's; eigh's eigenbases read none, orthogonal iteration ``qr_steps``.

    Args:
        config: the config (its preconditioner and scaling).
        solver: the solver as resolved ("auto" picks per device: eigh on the CPU).

    Returns:
        The field names.
    """
    return unit_for(config).fields_read(config, solver)


def config_products(config: DashConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> Products:
    """The products a config's step multiplies with on ``device`` (its ``precision``, where
    "auto" means its preconditioner's :attr:`~Preconditioner.auto_precision` on tensor cores)."""
    return products_for(config.precision, device, dtype, unit_for(config).auto_precision)
