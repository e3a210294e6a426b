"""Block ownership across ranks and the all-gather of finished directions (ALGORITHM.md 8).

W ranks hold the same params, config and (already all-reduced) gradients. Each rank owns one
contiguous slice of every block group, keeps factors, roots and moments for those blocks only,
refreshes their roots and computes their directions; one all-gather per step (all groups'
directions in one buffer) then hands every rank the full set, and every rank applies the
update to every parameter identically. AdamW vectors are cheap and computed on every rank.

The slices are planned from shapes and W alone, balancing the root cost ``r^3 + c^3`` of a
two-sided block (``r^3`` one-sided) across ranks. A rank may own nothing of a group, or
nothing at all, and still joins the collective. One process is the W = 1 instance of the same
code: it owns everything and the gather is the identity.

Bitwise equality with one process holds because every per-block computation is independent
of how many blocks share its stack (batch invariance, tested per solver), the power-iteration
start vectors are the same on every rank, and float32 directions travel exactly (the optional
``comm_dtype="bfloat16"`` rounds them, on every rank alike, to halve the traffic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from .plan import ParamPlan, Plan, block_ranges, lay_out_factors, stack_sizes


@dataclass(frozen=True)
class Shard:
    """This rank's share of the blocks: a constant of the step, like the plan.

    ``counts[g][k]`` blocks of group g belong to rank k, which owns the slice
    ``[sum(counts[g][:k]), sum(counts[g][:k + 1]))`` of the group's stack. ``local`` is the
    plan of the owned sub-problem: the whole plan's parameters with groups of the owned counts
    and factor stacks laid out as ``make_plan`` lays out a whole problem.
    """

    rank: int
    world_size: int
    group_name: str | None  # the process group's name for functional collectives; None when W == 1
    counts: tuple[tuple[int, ...], ...]
    local: Plan

    def bounds(self, g: int) -> tuple[int, int]:
        """``[lo, hi)``: this rank's slice of group g's stack."""
        lo = sum(self.counts[g][: self.rank])
        return lo, lo + self.counts[g][self.rank]


def owned_ranges(shard: Shard, p: ParamPlan) -> list[tuple[int, int, int]]:
    """``(group, start, stop)`` in this rank's stacks: the owned blocks of parameter ``p``."""
    ranges = []
    for g, start, stop in block_ranges(p):
        lo, hi = shard.bounds(g)
        start, stop = max(start, lo), min(stop, hi)
        if start < stop:
            ranges.append((g, start - lo, stop - lo))
    return ranges


def block_cost(rows: int, cols: int, one_sided: bool) -> int:
    """Root cost of one block: the cube of each factor size it refreshes."""
    return rows**3 if one_sided else rows**3 + cols**3


def ownership(plan: Plan, world_size: int) -> tuple[tuple[int, ...], ...]:
    """``counts[g][k]``: how many blocks of group g rank k owns (ALGORITHM.md 8).

    Groups in plan order: each rank gets ``N // W`` blocks and the ``N % W`` least-loaded ranks
    (ties: lower rank) one more; a rank's load is the root cost of the blocks it owns so far.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    load = [0] * world_size
    counts = []
    for group in plan.groups:
        q, e = divmod(group.count, world_size)
        extra = set(sorted(range(world_size), key=lambda k: (load[k], k))[:e])
        n = tuple(q + (k in extra) for k in range(world_size))
        cost = block_cost(group.rows, group.cols, group.one_sided)
        for k in range(world_size):
            load[k] += n[k] * cost
        counts.append(n)
    return tuple(counts)


def rank_loads(plan: Plan, counts: Sequence[Sequence[int]]) -> list[int]:
    """Each rank's root cost, the sum of ``b^3`` over the factors it owns."""
    world_size = len(counts[0]) if counts else 1
    return [
        sum(n[k] * block_cost(group.rows, group.cols, group.one_sided) for group, n in zip(plan.groups, counts))
        for k in range(world_size)
    ]


def make_shard(plan: Plan, rank: int, world_size: int, group_name: str | None) -> Shard:
    """Rank ``rank``'s shard of ``plan`` among ``world_size`` ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    counts = ownership(plan, world_size)
    owned = [(g.rows, g.cols, g.one_sided, n[rank]) for g, n in zip(plan.groups, counts)]
    groups = lay_out_factors(owned)
    local = dataclasses.replace(plan, groups=groups, factors=stack_sizes(groups))
    return Shard(rank, world_size, group_name if world_size > 1 else None, counts, local)


def process_group_info(process_group) -> tuple[int, int, str | None]:
    """(rank, world size, name) of a process group; (0, 1, None) for ``None``."""
    if process_group is None:
        return 0, 1, None
    import torch.distributed as dist

    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group must be a torch.distributed.ProcessGroup or None, got {type(process_group).__name__}")
    return dist.get_rank(process_group), dist.get_world_size(process_group), process_group.group_name


def owned_blocks(shard: Shard, stacks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Views of this rank's slice of every group stack."""
    if shard.world_size == 1:
        return list(stacks)
    return [x[slice(*shard.bounds(g))] for g, x in enumerate(stacks)]


def gather_directions(shard: Shard, directions: Sequence[torch.Tensor], comm_dtype: torch.dtype | None) -> list[torch.Tensor]:
    """Every group's full stack of directions from every rank's owned slices: one all-gather.

    Each rank's slices are padded to the largest count of their group and packed into one flat
    buffer; the gathered (W, buffer) is cut back into groups, and each group's rank pieces,
    in rank order, are its whole stack.
    """
    if shard.world_size == 1 or not directions:
        return list(directions)
    import torch.distributed._functional_collectives as collectives

    dtype = directions[0].dtype
    widths = [max(n) for n in shard.counts]
    packed = []
    for P, width in zip(directions, widths):
        pad = width - P.shape[0]
        packed.append((torch.cat([P, P.new_zeros(pad, *P.shape[1:])]) if pad else P).reshape(-1))
    buffer = torch.cat(packed) if len(packed) > 1 else packed[0]
    if comm_dtype is not None:
        buffer = buffer.to(comm_dtype)
    gathered = collectives.all_gather_single(buffer, 0, shard.group_name).view(shard.world_size, -1).to(dtype)
    full, start = [], 0
    for P, width, n in zip(directions, widths, shard.counts):
        size = width * P.shape[1] * P.shape[2]
        per_rank = gathered[:, start : start + size].reshape(shard.world_size, width, *P.shape[1:])
        pieces = [per_rank[k, : n[k]] for k in range(shard.world_size) if n[k]]
        full.append(torch.cat(pieces) if len(pieces) > 1 else pieces[0].contiguous())
        start += size
    return full
