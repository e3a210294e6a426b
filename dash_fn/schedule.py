"""When the inverse roots are refreshed: all at once every f steps, or a fixed slice every step.

Two schedules (``DashConfig.refresh_schedule``), f = ``inv_root_freq``, s = ``start_prec_step``,
W = ``inv_root_warmup``; each is the same math eager or compiled, on every device, and under
either the W warm-up steps s <= t < s + W refresh every root:

- ``"periodic"``: every root at step s and at every multiple of f after it. A step is one of
  two programs, a plain step or a refresh step (several times its cost), picked on the host
  (``refresh=`` of :func:`dash_fn.step`, :func:`is_refresh_step`).
- ``"staggered"`` (the default): every block has a *phase* in [0, f), and at step t >= s the blocks of phase
  ``(t - s) mod f`` refresh their roots (both factors of a two-sided block together). So every
  root is at most f - 1 steps stale, as under the periodic schedule, and every step is the same
  program: each factor stack solves one fixed-size slice of m blocks, picked on the device by
  index arithmetic on the step counter (no branch on the host or on the device, one graph).
  Until its first refresh (t < s + phase) a block's direction is its Adam direction, selected
  per block. A step skipped by the non-finite guard refreshes nothing (its counter does not
  advance, so the next step refreshes the same slice). A warm-up step (W > 0) is the periodic
  refresh step's program, picked on the host by ``refresh=True`` (``is_refresh_step``): every
  block then has its root from step s on, and the slices resume at t = s + W on the same phases.

Phases are a property of the blocks, not of the ranks: blocks are numbered group after group
(a group: all blocks of one shape, in parameter order, row-major within a parameter or tile; groups in
order of first appearance) and a block's phase is its number mod f. Consecutive blocks take
consecutive phases, so every stack, and every rank's contiguous share of it, meets every phase
about equally often; the same numbering on every world size keeps a distributed run bitwise
equal to one process (:mod:`dash_fn.distributed`), and a checkpoint resumes mid-period.

Each rank keeps two constant tables per factor stack (derived from the plan, never stored in
checkpoints): ``phase`` (K,), each factor's block phase, and ``slices`` (f, m), row j the stack
positions of phase j (rows only up to the largest block number when f exceeds it), padded to
the stack's largest phase by repeating one of its own blocks (the same block solved twice
gives the same bits, so the scatter is deterministic). A phase with no block in a stack points
at position 0 and keeps its old root.
"""

from __future__ import annotations

from itertools import islice

import torch

from .config import DashConfig
from .plan import BlockGroup, Plan

SCHEDULE_KEY = "schedule"
DUE_BLOCKS_KEY = "due_blocks"


def is_refresh_step(config: DashConfig, t: int) -> bool | None:
    """The ``refresh=`` flag of step number ``t`` (the first step is 1).

    Periodic: ``t == s or (t > s and t % inv_root_freq == 0)`` with s = start_prec_step, or a
    warm-up step (``s <= t < s + inv_root_warmup``). Staggered: None (the staggered step takes
    no flag), or with a warm-up, whether t is a warm-up step (False: the staggered slice). A
    caller that counts its steps on the host passes every call, skipped or not (the adapter
    does).

    Args:
        config: the config of the state being stepped.
        t: the number of the step about to be taken, counted from 1 on the host.

    Returns:
        True or False under the periodic schedule and under the staggered one with a warm-up;
        None under the staggered one without.
    """
    if not takes_flag(config):
        return None
    return bool((warmup_due if staggered(config) else periodic_due)(t, config))


def periodic_due(t, config: DashConfig):
    """Whether the periodic schedule refreshes at step ``t`` (an int, or a tensor on the device):
    at s = start_prec_step, at every multiple of inv_root_freq after it, and on warm-up steps."""
    s = config.start_prec_step
    return (t == s) | ((t > s) & (t % config.inv_root_freq == 0)) | warmup_due(t, config)


def warmup_due(t, config: DashConfig):
    """Whether step ``t`` (an int, or a tensor on the device) is a warm-up step, which refreshes
    every root: s <= t < s + inv_root_warmup."""
    s = config.start_prec_step
    return (t >= s) & (t < s + config.inv_root_warmup)


def staggered(config: DashConfig) -> bool:
    """Whether the config's schedule is the staggered one (else the periodic one)."""
    return config.refresh_schedule == "staggered"


def takes_flag(config: DashConfig) -> bool:
    """Whether a step takes the host's ``refresh=`` flag: under the periodic schedule, and
    under the staggered one with a warm-up (whose steps are another program)."""
    return not staggered(config) or config.inv_root_warmup > 0


def staggers(config: DashConfig) -> bool:
    """Whether the state keeps the staggered schedule's tables: roots exist and the schedule
    is staggered."""
    return staggered(config) and config.start_prec_step != float("inf")


def block_numbers(plan: Plan, shard) -> list[list[int]]:
    """Per group of ``shard.local``, the global number of each block (the module doc): the same
    on every world size, except under ``fsdp_blocks="local"``, whose blocks are the shard's own."""
    local = shard.local
    if getattr(shard, "piecewise", False):
        starts = _group_starts(local.groups)
        return [[starts[g] + q for q in range(group.count)] for g, group in enumerate(local.groups)]
    starts = _group_starts(plan.groups)
    numbers = [[-1] * group.count for group in local.groups]
    for i, row, col, g, pos in shard.block_origins(plan):
        region = next(
            r
            for r in plan.params[i].regions
            if r.row_start <= row < r.row_start + r.n_rows * r.block_rows
            and r.col_start <= col < r.col_start + r.n_cols * r.block_cols
        )
        within = (row - region.row_start) // region.block_rows * region.n_cols + (col - region.col_start) // (
            region.block_cols
        )
        numbers[g][pos] = starts[region.group] + region.offset + within
    return numbers


def stagger_tables(plan: Plan, shard, period: int, device) -> dict:
    """``{stack: {"phase": (K,), "slices": (min(period, blocks), m)}}`` (int64) for this rank's
    factor stacks (blocks: of the whole model)."""
    local = shard.local
    phases: list[list[int]] = [[0] * stack.count for stack in local.factors]
    numbers_of_groups, count = _numbers_and_rows(plan, shard, period)
    for group, numbers in zip(local.groups, numbers_of_groups):
        for side in group.factor_sides:
            for q, n in enumerate(numbers):
                phases[side.stack][side.offset + q] = n % period
    tables = {}
    for k, phase in enumerate(phases):
        rows: list[list[int]] = [[] for _ in range(count)]
        for i, p in enumerate(phase):
            rows[p].append(i)
        width = max((len(r) for r in rows), default=0)
        slices = [r + r[-1:] * (width - len(r)) if r else [0] * width for r in rows]
        tables[str(k)] = {
            "phase": torch.tensor(phase, dtype=torch.int64, device=device).reshape(len(phase)),
            "slices": torch.tensor(slices, dtype=torch.int64, device=device).reshape(count, width),
        }
    return tables


def due_block_tables(plan: Plan, shard, period: int, device) -> dict:
    """``{group: (min(period, blocks), w)}`` (int64) for this rank's groups: row j the group's
    own blocks of phase j, then blocks of other phases up to the width w (the most blocks one
    phase holds), so that a row's entries are distinct. Where a group's blocks are refreshed
    (both sides at their phase) the eigenvalue-corrected preconditioner rotates their gradient
    EMAs into the new bases; a padding block's bases are unchanged, so it is left as it is."""
    numbers_of_groups, count = _numbers_and_rows(plan, shard, period)
    tables = {}
    for g, numbers in enumerate(numbers_of_groups):
        rows = [[q for q, n in enumerate(numbers) if n % period == j] for j in range(count)]
        width = max((len(r) for r in rows), default=0)
        padded = [
            r + list(islice((q for q, n in enumerate(numbers) if n % period != j), width - len(r)))
            for j, r in enumerate(rows)
        ]
        tables[str(g)] = torch.tensor(padded, dtype=torch.int64, device=device).reshape(count, width)
    return tables


def _numbers_and_rows(plan: Plan, shard, period: int) -> tuple[list[list[int]], int]:
    """The blocks' numbers (:func:`block_numbers`) and the tables' row count: phases past the
    last block's number (period > blocks) have no block, so rows up to it suffice (the lookups
    clamp the phase, and nothing is due there), and the tables stay within the number of
    blocks however large the period (inv_root_freq=10**9: never again)."""
    numbers_of_groups = block_numbers(plan, shard)
    count = min(period, 1 + max((n for numbers in numbers_of_groups for n in numbers), default=0))
    return numbers_of_groups, count


def due_slice(tables, t: torch.Tensor, config: DashConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(positions (m,), due (1,) bool)``: the stack positions that step ``t`` refreshes, and
    whether it does (its phase has blocks in this stack and t >= s), on the device."""
    s = int(config.start_prec_step)
    j = torch.remainder(t - s, config.inv_root_freq)
    row = j.clamp(max=tables["slices"].shape[0] - 1)
    positions = tables["slices"].index_select(0, row.reshape(1)).reshape(-1)
    due = (tables["phase"].index_select(0, positions[:1]) == j) & (t >= s)
    return positions, due


def due_blocks(table: torch.Tensor, t: torch.Tensor, config: DashConfig) -> torch.Tensor:
    """(w,): the row of a group's :func:`due_block_tables` entry for step ``t``'s phase."""
    j = torch.remainder(t - int(config.start_prec_step), config.inv_root_freq).clamp(max=table.shape[0] - 1)
    return table.index_select(0, j.reshape(1)).reshape(-1)


def has_root(tables, start: int, count: int, t: torch.Tensor, config: DashConfig) -> torch.Tensor:
    """(count,) bool: which of the factors at ``[start, start + count)`` have been refreshed by
    step ``t`` (the first refresh of a block of phase p is at step s + p; with a warm-up, of
    every block at s)."""
    phase = tables["phase"][start : start + count]
    return (phase if config.inv_root_warmup == 0 else torch.zeros_like(phase)) <= t - int(config.start_prec_step)


def _group_starts(groups: tuple[BlockGroup, ...]) -> list[int]:
    starts, total = [], 0
    for group in groups:
        starts.append(total)
        total += group.count
    return starts
