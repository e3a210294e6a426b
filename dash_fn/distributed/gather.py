"""Replicated parameters (DDP): each rank steps its owned blocks, one all-gather of directions.

W ranks hold the same params, config and (already all-reduced) gradients. Each rank owns one
contiguous slice of every block group (:func:`ownership.ownership`), keeps factors, roots and
moments for those blocks only, refreshes their roots and computes their directions; one
all-gather per step (all groups' directions in one buffer) then hands every rank the full set,
and every rank applies the update to every parameter identically. AdamW vectors are cheap
and computed on every rank. A rank may own nothing of a group, or nothing at all, and still
joins the collective. One process is the W = 1 instance of the same code: it owns everything
and the gather is the identity.

Bitwise equality with one process holds because every per-block computation is independent
of how many blocks share its stack (batch invariance, tested per solver), the power-iteration
start vectors are the same on every rank, and float32 directions travel exactly (the optional
``comm_dtype="bfloat16"`` rounds them, on every rank alike, to halve the traffic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..plan import ParamPlan, Plan, block_ranges, gather, lay_out_factors, scatter_param, stack_sizes
from ..torch_versions import all_gather_single
from .ownership import ownership


@dataclass(frozen=True)
class Shard:
    """This rank's share of the blocks of replicated parameters: a constant of the step.

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
    kind = "replicated"

    def bounds(self, g: int) -> tuple[int, int]:
        """``[lo, hi)``: this rank's slice of group g's stack."""
        lo = sum(self.counts[g][: self.rank])
        return lo, lo + self.counts[g][self.rank]

    def block_origins(self, plan: Plan):
        """``(param index, row, col, group, stack position)`` of every block this rank holds;
        rows and columns in the parameter's 2-D view."""
        for i, p in enumerate(plan.params):
            for r in p.regions:
                lo, hi = self.bounds(r.group)
                for k in range(max(r.offset, lo), min(r.offset + r.count, hi)):
                    a, b = divmod(k - r.offset, r.n_cols)
                    yield i, r.row_start + a * r.block_rows, r.col_start + b * r.block_cols, r.group, k - lo

    def owned_ranges(self, index: int) -> list[tuple[int, int, int]]:
        """``(group, start, stop)`` in this rank's stacks: the owned blocks of parameter ``index``."""
        ranges = []
        for g, start, stop in block_ranges(self.local.params[index]):
            lo, hi = self.bounds(g)
            start, stop = max(start, lo), min(stop, hi)
            if start < stop:
                ranges.append((g, start - lo, stop - lo))
        return ranges

    def all_ranks(self, flag: torch.Tensor) -> torch.Tensor:
        """Whether ``flag`` (0-d bool) holds on every rank: one all-reduce when W > 1."""
        return all_ranks(flag, self.world_size, self.group_name)

    def key_prefix(self, index: int) -> str:
        """What a checkpoint key of parameter ``index`` starts with: blocks are global here."""
        return ""

    def global_moment(self, index: int, whole: ParamPlan, local: torch.Tensor) -> torch.Tensor:
        """An AdamW moment of parameter ``index`` as a checkpoint keeps it: whole on every rank."""
        return local

    def local_moment(self, index: int, whole: ParamPlan, value):
        """This rank's part of a saved AdamW moment (a DTensor's local piece, else the value)."""
        from torch.distributed.tensor import DTensor

        return value.to_local() if isinstance(value, DTensor) else value

    def gradient_blocks(self, plan: Plan, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's slice of every group's gradient block stack."""
        stacks = gather(plan, grads, plan.dtype)
        if self.world_size == 1:
            return stacks
        return [x[slice(*self.bounds(g))] for g, x in enumerate(stacks)]

    def parameter_updates(
        self, plan: Plan, directions: Sequence[torch.Tensor], comm_dtype
    ) -> list[torch.Tensor | None]:
        """Every block parameter's full direction (all-gathered); None for the others."""
        full = gather_directions(self, directions, comm_dtype)
        return [scatter_param(p, full).reshape(p.shape) if p.regions else None for p in plan.params]


def owned_ranges(shard, p: ParamPlan) -> list[tuple[int, int, int]]:
    """``(group, start, stop)`` in this rank's stacks: the owned blocks of parameter ``p``."""
    return shard.owned_ranges(shard.local.names.index(p.name))


def make_shard(plan: Plan, rank: int, world_size: int, group_name: str | None) -> Shard:
    """Rank ``rank``'s shard of ``plan`` among ``world_size`` ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    counts = ownership(plan, world_size)
    owned = [(g.rows, g.cols, g.sides, n[rank]) for g, n in zip(plan.groups, counts)]
    groups = lay_out_factors(owned)
    local = dataclasses.replace(plan, groups=groups, factors=stack_sizes(groups))
    return Shard(rank, world_size, group_name if world_size > 1 else None, counts, local)


def all_ranks(flag: torch.Tensor, world_size: int, group_name: str | None) -> torch.Tensor:
    """The logical AND of a 0-d bool over the ranks (a traceable functional all-reduce)."""
    if world_size == 1:
        return flag
    import torch.distributed._functional_collectives as collectives

    # the group name: torch types it as GroupName, a NewType of str; set whenever W > 1
    vote = collectives.all_reduce(flag.to(torch.int32).reshape(1), "min", group_name)  # type: ignore[arg-type]
    votes = collectives.wait_tensor(vote)
    return votes[0] > 0


def gather_directions(
    shard: Shard, directions: Sequence[torch.Tensor], comm_dtype: torch.dtype | None
) -> list[torch.Tensor]:
    """Every group's full stack of directions from every rank's owned slices: one all-gather.

    Each rank's slices are padded to the largest count of their group and packed into one flat
    buffer; the gathered (W, buffer) is cut back into groups, and each group's rank pieces,
    in rank order, are its whole stack.
    """
    if shard.world_size == 1 or not directions:
        return list(directions)
    dtype = directions[0].dtype
    widths = [max(n) for n in shard.counts]
    packed = []
    for P, width in zip(directions, widths):
        pad = width - P.shape[0]
        packed.append((torch.cat([P, P.new_zeros(pad, *P.shape[1:])]) if pad else P).reshape(-1))
    buffer = torch.cat(packed) if len(packed) > 1 else packed[0]
    if comm_dtype is not None:
        buffer = buffer.to(comm_dtype)
    group_name: str = shard.group_name  # type: ignore[assignment]  # set whenever W > 1
    gathered = all_gather_single(buffer, group_name).view(shard.world_size, -1).to(dtype)
    full, start = [], 0
    for P, width, n in zip(directions, widths, shard.counts):
        size = width * P.shape[1] * P.shape[2]
        per_rank = gathered[:, start : start + size].reshape(shard.world_size, width, *P.shape[1:])
        pieces = [per_rank[k, : n[k]] for k in range(shard.world_size) if n[k]]
        full.append(torch.cat(pieces) if len(pieces) > 1 else pieces[0].contiguous())
        start += size
    return full
