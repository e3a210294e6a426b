"""torch.distributed: how a DASH state is spread over W ranks, one concern a module.

- :mod:`.ownership`: which rank owns which blocks (pure planning from shapes and W).
- :mod:`.gather`: replicated parameters (DDP, ``process_group=``): each rank steps its
  owned blocks, one all-gather of the directions.
- :mod:`.fsdp`: FSDP2 row shards (DTensor parameters): blocks inside a shard stay local,
  straddling blocks go to one owner, one all-to-all each way.

Checkpoints that move between world sizes use the state's one saved form, keyed by parameter
name and global block coordinates (:mod:`dash_fn.checkpoint`); each shard says how its blocks
and AdamW moments are named there (``key_prefix``, ``global_moment``, ``local_moment``).
"""

from __future__ import annotations

from .fsdp import FsdpShard, make_fsdp_shard
from .gather import Shard, gather_directions, make_shard, owned_ranges
from .ownership import band_owners, block_cost, ownership, rank_loads


def process_group_info(process_group) -> tuple[int, int, str | None]:
    """(rank, world size, name) of a process group; (0, 1, None) for ``None``."""
    if process_group is None:
        return 0, 1, None
    import torch.distributed as dist

    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(
            f"process_group must be a torch.distributed.ProcessGroup or None, got {type(process_group).__name__}"
        )
    return dist.get_rank(process_group), dist.get_world_size(process_group), process_group.group_name


__all__ = [
    "Shard",
    "FsdpShard",
    "make_shard",
    "make_fsdp_shard",
    "gather_directions",
    "owned_ranges",
    "ownership",
    "rank_loads",
    "band_owners",
    "block_cost",
    "process_group_info",
]
