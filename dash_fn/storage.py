"""Storage dtypes: each kind of block state may be kept narrower than the state dtype it is
computed in (docs/ALGORITHM.md 3.5).

``DashConfig.factor_dtype``, ``root_dtype``, ``grad_ema_dtype`` and ``graft_dtype`` name the
dtype of the factors ``F``, the inverse roots ``Fbar``, the gradient EMA ``Gt`` and the grafting
moment ``A``; None keeps the state dtype (float32, float64 with float64 parameters). A narrow
tensor is widened to the state dtype when read, every product and EMA is formed there, and the
result is rounded once, when written.
"""

from __future__ import annotations

import torch

from .config import DashConfig

KINDS = {"F": "factor_dtype", "Fbar": "root_dtype", "Gt": "grad_ema_dtype", "A": "graft_dtype"}


def stored_dtype(config: DashConfig, key: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype in which the state entry ``key`` ("F", "Fbar", "Gt" or "A") is kept when the
    state dtype is ``dtype``."""
    name = getattr(config, KINDS[key])
    return dtype if name is None else getattr(torch, name)


def ema_(x: torch.Tensor, decay, update: torch.Tensor, alpha: float) -> torch.Tensor:
    """``x <- decay x + alpha update`` in the dtype of ``update``; returns the new value in it.

    A tensor kept in that dtype is updated in place (op for op, the bits of a state without
    storage dtypes); a narrow one is widened, updated, rounded once when written back, and read
    back widened: what is used is what is stored."""
    if x.dtype == update.dtype:
        return x.mul_(decay).add_(update, alpha=alpha)
    return x.copy_(torch.add(x.to(update.dtype) * decay, update, alpha=alpha)).to(update.dtype)
