"""How a block's direction gets its norm (docs/ALGORITHM.md 4 c, f, g): ``DashConfig.grafting``.

- "adam": the Frobenius norm of Adam's direction, its second moment an EMA at ``beta_graft``;
- "adagrad": the same with the moment a sum (AdaGrad's; nothing to bias-correct);
- "rms": a fixed per-entry RMS ``graft_rms``, the Frobenius norm ``graft_rms sqrt(rows cols)``;
- "spectral": the spectral norm ``graft_rms sqrt(max(rows, cols))``, Muon's norm for a full-rank
  orthogonal direction, whose RMS is then graft_rms.

Under the fixed norms the moment is kept as under "adam", for the direction before a block's
first root and for thin blocks' diagonals.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .roots.scaling import spectral_norm_estimate


@dataclass(frozen=True)
class Grafting:
    """``sums``: the moment is a sum, not an EMA. ``fixed``: the norm does not come from Adam's
    direction. ``norm_and_target(block_norm, config, group, D)``: the norm a direction is
    measured by and the value it is given (``block_norm``: the forms' Frobenius norm)."""

    sums: bool
    fixed: bool
    norm_and_target: Callable


def _adams_norm(block_norm, config, group, D: torch.Tensor):
    return block_norm, torch.linalg.vector_norm(D, dim=(-2, -1), keepdim=True)


GRAFTINGS = {
    "adam": Grafting(False, False, _adams_norm),
    "adagrad": Grafting(True, False, _adams_norm),
    "rms": Grafting(
        False,
        True,
        lambda block_norm, config, group, D: (block_norm, config.graft_rms * math.sqrt(group.rows * group.cols)),
    ),
    "spectral": Grafting(
        False,
        True,
        lambda block_norm, config, group, D: (
            spectral_norm_estimate,
            config.graft_rms * math.sqrt(max(group.rows, group.cols)),
        ),
    ),
}
