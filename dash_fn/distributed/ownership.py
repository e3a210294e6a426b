"""Which rank owns which blocks: pure planning from shapes and the world size W.

Two planners, one cost model. A block's root cost is the cube of each factor size it
refreshes (``r^3 + c^3`` two-sided, ``r^3`` one-sided).

- :func:`ownership` (replicated parameters, DDP): rank k owns a contiguous slice of every
  block group, ``N // W`` blocks each and the ``N % W`` least-loaded ranks one more
  (docs/ALGORITHM.md 8).
- :func:`band_owners` (FSDP2 row shards): a *band* (one row of blocks of one parameter) whose
  rows all sit on one rank is owned there; a band that straddles shards goes to the rank that
  holds most of its rows (the fewest rows to move), ties to the least-loaded rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import BlockGroup, Plan


def block_cost(group: BlockGroup) -> int:
    """Root cost of one block of ``group``: the cube of each factor size it refreshes."""
    return (group.rows**3 if group.left is not None else 0) + (group.cols**3 if group.right is not None else 0)


def ownership(plan: Plan, world_size: int) -> tuple[tuple[int, ...], ...]:
    """``counts[g][k]``: how many blocks of group g rank k owns (docs/ALGORITHM.md 8).

    Groups in plan order: each rank gets ``N // W`` blocks and the ``N % W`` least-loaded ranks
    (ties: lower rank) one more; a rank's load is the root cost of the blocks it owns so far.
    """
    check_world_size(world_size)
    load = [0] * world_size
    counts = []
    for group in plan.groups:
        q, e = divmod(group.count, world_size)
        extra = set(sorted(range(world_size), key=lambda k: (load[k], k))[:e])
        n = tuple(q + (k in extra) for k in range(world_size))
        cost = block_cost(group)
        for k in range(world_size):
            load[k] += n[k] * cost
        counts.append(n)
    return tuple(counts)


def rank_loads(plan: Plan, counts: Sequence[Sequence[int]]) -> list[int]:
    """Each rank's root cost under :func:`ownership`'s counts."""
    world_size = len(counts[0]) if counts else 1
    return [sum(n[k] * block_cost(group) for group, n in zip(plan.groups, counts)) for k in range(world_size)]


def band_owners(bands: Sequence[tuple[tuple[int, ...], int]], world_size: int) -> tuple[list[int], list[int]]:
    """Owners of row bands given as ``(rows held by each rank, root cost)``; returns (owners, loads).

    Bands held by one rank are owned there and counted first; each straddling band then goes,
    in order, to the rank holding most of its rows, ties to the least-loaded, then lower rank.
    """
    check_world_size(world_size)
    load = [0] * world_size
    owners: list[int] = [-1] * len(bands)
    for i, (held, cost) in enumerate(bands):
        holders = [k for k in range(world_size) if held[k]]
        if len(holders) == 1:
            owners[i] = holders[0]
            load[holders[0]] += cost
    for i, (held, cost) in enumerate(bands):
        if owners[i] < 0:
            k = min((k for k in range(world_size) if held[k]), key=lambda k: (-held[k], load[k], k))
            owners[i] = k
            load[k] += cost
    return owners, load


def check_world_size(world_size) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
