"""What differs between the supported torch releases (``torch>=2.11,<2.16``), in one place.

Every other module calls torch's current names; where an older supported release lacks one,
the stand-in below gives it the same meaning, and nothing else in the package asks which
release it runs on.
"""

from __future__ import annotations

import torch


def all_gather_single(buffer: torch.Tensor, group_name: str) -> torch.Tensor:
    """The (W * n,) concatenation of every rank's (n,) ``buffer``, in rank order: a functional
    collective that traces into a compiled graph (waited for here). torch 2.13 added
    ``all_gather_single`` and deprecated ``all_gather_tensor`` (a FutureWarning), which
    2.11 and 2.12 have alone, with the same meaning."""
    import torch.distributed._functional_collectives as collectives

    gather = getattr(collectives, "all_gather_single", None) or collectives.all_gather_tensor
    return collectives.wait_tensor(gather(buffer, 0, group_name))  # type: ignore[arg-type]
