"""The blocking plan: how every parameter is cut into blocks and where each block lives.

docs/ALGORITHM.md sections 2-3. A matrix parameter is viewed as (R, C); its rows split into full
parts of ``block_size`` plus a remainder, likewise its columns, so the view is a grid of at
most 2 x 2 *regions*, each a grid of equal blocks (full blocks, right strip, bottom strip,
corner); a parameter split into tiles (its tensor-parallel pieces, ``fsdp_blocks="aligned"``)
has such a grid in each tile. Blocks of equal shape across all parameters form one *block
group*, stacked as one (N, r, c) tensor; a parameter's blocks of one shape are consecutive in
their group, row-major (tile by tile in a tiled parameter). Each group's left factors (and then
its right factors) occupy one contiguous slice of the *factor stack* of their size, so one
batched solver call per factor size refreshes every root.

A vector under one-sided Shampoo is an (n, 1) matrix cut only along its rows. A *thin* block,
whose long side is at least ``thin_ratio`` times its short side (an embedding's, a thin
projection's), keeps a full factor on its short side only; its long side is preconditioned by
a diagonal read from the grafting moment (section 2.5). Vectors under AdamW live in one flat
buffer.

The plan is plain frozen data: it is hashable, stored in the state, and a constant to
torch.compile. ``gather`` and ``scatter`` are exact inverses (only views, slices, reshapes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

MATRIX, SEGMENTS, ADAMW, EMPTY = "matrix", "segments", "adamw", "empty"
# the factors of a block: full on both sides; full on the left only (vector segments, root
# order 2); full on the short side with a diagonal long side (thin blocks, 2.5): tall blocks
# (rows long) keep R, wide blocks (columns long) keep L
BOTH, LEFT, TALL, WIDE = "both", "left", "tall", "wide"


@dataclass(frozen=True)
class Region:
    """An ``n_rows x n_cols`` grid of equal ``block_rows x block_cols`` blocks in a 2-D view."""

    row_start: int
    n_rows: int
    block_rows: int
    col_start: int
    n_cols: int
    block_cols: int
    group: int  # index of the block group holding these blocks
    offset: int  # index of the region's first block within that group

    @property
    def count(self) -> int:
        return self.n_rows * self.n_cols


@dataclass(frozen=True)
class ParamPlan:
    """How one parameter is handled: its kind, its 2-D view, and its regions."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str  # MATRIX, SEGMENTS (one-sided Shampoo vector), ADAMW (vector) or EMPTY
    view: tuple[int, int]  # (R, C); vectors are (n, 1)
    regions: tuple[Region, ...]
    flat_offset: int  # start in the flat AdamW buffers (kind ADAMW only)
    batch_dims: int = 0  # leading dims that index independent matrices (experts, heads)

    @property
    def numel(self) -> int:
        return self.view[0] * self.view[1]


@dataclass(frozen=True)
class FactorSlice:
    """Where a group's left or right factors live: stack index and first position."""

    stack: int
    offset: int


@dataclass(frozen=True)
class BlockGroup:
    """All blocks of one shape, stacked as (count, rows, cols)."""

    rows: int
    cols: int
    sides: str  # BOTH, LEFT (segments), TALL or WIDE (thin blocks)
    count: int
    left: FactorSlice | None  # None where only the right side has a factor
    right: FactorSlice | None  # None where only the left side has a factor

    @property
    def order(self) -> int:
        """p of the roots: 2 for one-sided segments, 4 for every matrix block."""
        return 2 if self.sides == LEFT else 4

    @property
    def diagonal_dim(self) -> int | None:
        """The dim over which a thin block's long-side diagonal factor sums the grafting moment
        (-1: each row of a tall block, -2: each column of a wide one); None for other blocks."""
        return {TALL: -1, WIDE: -2}.get(self.sides)

    @property
    def factor_sides(self) -> list[FactorSlice]:
        """The slices holding this group's factors, left before right."""
        return [side for side in (self.left, self.right) if side is not None]


@dataclass(frozen=True)
class FactorStack:
    """Factors of one size and root order, stacked as (count, size, size)."""

    size: int
    order: int  # p: 4 for matrix blocks, 2 for one-sided segments
    count: int


@dataclass(frozen=True)
class Plan:
    """Everything ``step`` needs to know about the parameters, fixed at ``init``."""

    block_size: int
    dtype: torch.dtype  # of all optimizer state and arithmetic: float64 if any param is, else float32
    params: tuple[ParamPlan, ...]
    groups: tuple[BlockGroup, ...]
    factors: tuple[FactorStack, ...]
    adamw_numel: int
    thin_ratio: float = math.inf  # blocks this elongated get a factor on their short side only

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def matrix_view(shape: Sequence[int]) -> tuple[str, tuple[int, int]]:
    """Kind and 2-D view of a parameter shape (docs/ALGORITHM.md 2.1): size-1 dims are dropped,
    2+ remaining dims become (first, rest), one or none become a vector."""
    numel = 1
    for d in shape:
        numel *= d
    if numel == 0:
        return EMPTY, (0, 1)
    squeezed = [d for d in shape if d != 1]
    if len(squeezed) >= 2:
        return MATRIX, (squeezed[0], numel // squeezed[0])
    return "vector", (numel, 1)


def _parts(length: int, block_size: int) -> list[tuple[int, int, int]]:
    """Split [0, length) into (start, count, size): full blocks, then the remainder."""
    full, rest = divmod(length, block_size)
    parts = [(0, full, block_size)] if full else []
    if rest:
        parts.append((full * block_size, 1, rest))
    return parts


def batched_view(shape: Sequence[int], batch_dims: int) -> tuple[str, tuple[int, int], int]:
    """Kind, 2-D view and number of matrices of a parameter whose ``batch_dims`` leading dims
    index independent matrices: E matrices of view (R, C) are one (E R, C) view whose row
    bands [e R, (e + 1) R) are blocked apart (docs/ALGORITHM.md 2.1 for each)."""
    if not 0 <= batch_dims < max(len(shape), 1):
        raise ValueError(
            f"batch_dims must be in [0, {max(len(shape) - 1, 0)}] for a parameter of shape {tuple(shape)}, "
            f"got {batch_dims}"
        )
    count = 1
    for d in shape[:batch_dims]:
        count *= d
    kind, (R, C) = matrix_view(shape[batch_dims:])
    if count == 0:
        return EMPTY, (0, 1), 0
    return kind, (count * R, C), count


def make_plan(
    shapes: Sequence[tuple[str, tuple[int, ...], torch.dtype]],
    block_size: int,
    one_dim: str,
    batch_dims: Mapping[str, int] | None = None,
    thin_ratio: float = math.inf,
    splits: Mapping[str, tuple[int, int]] | None = None,
) -> Plan:
    """Build the plan for parameters given as (name, shape, dtype) in canonical order;
    ``batch_dims[name] = k`` makes a parameter's leading k dims index independent matrices;
    blocks whose long side is at least ``thin_ratio`` times the short one are thin (2.5);
    ``splits[name] = (a, b)`` cuts each of its matrices into a x b equal tiles, each blocked
    from its own first row and column (tensor-parallel pieces under ``fsdp_blocks="aligned"``)."""
    batch_dims = batch_dims or {}
    splits = splits or {}
    group_index: dict[tuple[int, int, str], int] = {}
    group_counts: list[int] = []
    group_keys: list[tuple[int, int, str]] = []
    params = []
    adamw_numel = 0
    for name, shape, dtype in shapes:
        k = batch_dims.get(name, 0)
        kind, (R, C), count = batched_view(shape, k)
        if kind == "vector":
            kind = SEGMENTS if one_dim == "shampoo" else ADAMW
        regions = []
        if kind in (MATRIX, SEGMENTS):
            row_tiles, col_tiles = splits.get(name, (1, 1))
            if (R // count) % row_tiles or C % col_tiles or (kind == SEGMENTS and col_tiles != 1):
                raise ValueError(
                    f"splits[{name!r}] = {(row_tiles, col_tiles)} does not tile its matrices of {(R // count, C)}"
                )
            # tiles of whole blocks are cut where the untiled plan cuts: cut and number them as it does
            row_tiles = 1 if (R // count // row_tiles) % block_size == 0 else row_tiles
            col_tiles = 1 if (C // col_tiles) % block_size == 0 else col_tiles
            rows = R // count // row_tiles  # of each tile
            cols = C // col_tiles
            col_parts = (
                [(0, 1, 1)]
                if kind == SEGMENTS
                else [(c0 + a, n, b) for c0 in range(0, C, cols) for a, n, b in _parts(cols, block_size)]
            )
            for first_row in range(0, R, rows):
                for row_start, n_rows, block_rows in _parts(rows, block_size):
                    for col_start, n_cols, block_cols in col_parts:
                        sides = LEFT if kind == SEGMENTS else factored_sides(block_rows, block_cols, thin_ratio)
                        key = (block_rows, block_cols, sides)
                        if key not in group_index:
                            group_index[key] = len(group_keys)
                            group_keys.append(key)
                            group_counts.append(0)
                        g = group_index[key]
                        regions.append(
                            Region(
                                first_row + row_start,
                                n_rows,
                                block_rows,
                                col_start,
                                n_cols,
                                block_cols,
                                g,
                                group_counts[g],
                            )
                        )
                        group_counts[g] += n_rows * n_cols
        params.append(ParamPlan(name, tuple(shape), dtype, kind, (R, C), tuple(regions), adamw_numel, k))
        if kind == ADAMW:
            adamw_numel += R

    groups = lay_out_factors(
        [(rows, cols, sides, count) for (rows, cols, sides), count in zip(group_keys, group_counts)]
    )
    factors = stack_sizes(groups)
    dtype = torch.float64 if any(dtype == torch.float64 for _, _, dtype in shapes) else torch.float32
    return Plan(block_size, dtype, tuple(params), groups, factors, adamw_numel, thin_ratio)


def factored_sides(rows: int, cols: int, thin_ratio: float) -> str:
    """Which sides of a ``rows x cols`` matrix block get a full factor: both, or only the short
    side of a block whose long side is at least ``thin_ratio`` times as long (2.5)."""
    if rows >= thin_ratio * cols:
        return TALL
    if cols >= thin_ratio * rows:
        return WIDE
    return BOTH


def lay_out_factors(groups: Sequence[tuple[int, int, str, int]]) -> tuple[BlockGroup, ...]:
    """Block groups given as (rows, cols, sides, count), with their factors placed.

    Factor stacks are keyed by (size, order) and numbered in order of first appearance (even
    with count 0, so a rank's partial layout numbers its stacks as the whole one does); a
    group's left factors form one slice, its right factors the next slice of their size's stack.
    """
    stack_index: dict[tuple[int, int], int] = {}
    stack_counts: list[int] = []

    def take(size: int, order: int, count: int) -> FactorSlice:
        k = stack_index.setdefault((size, order), len(stack_index))
        if k == len(stack_counts):
            stack_counts.append(0)
        stack_counts[k] += count
        return FactorSlice(k, stack_counts[k] - count)

    placed = []
    for rows, cols, sides, count in groups:
        order = 2 if sides == LEFT else 4
        left = take(rows, order, count) if sides in (BOTH, LEFT, WIDE) else None
        right = take(cols, order, count) if sides in (BOTH, TALL) else None
        placed.append(BlockGroup(rows, cols, sides, count, left, right))
    return tuple(placed)


def stack_sizes(groups: Sequence[BlockGroup]) -> tuple[FactorStack, ...]:
    """The factor stacks that ``groups`` fill: size, order and count of each, by stack index."""
    stacks: dict[int, FactorStack] = {}
    for group in groups:
        for side, size in ((group.left, group.rows), (group.right, group.cols)):
            if side is not None:
                old = stacks.get(side.stack, FactorStack(size, group.order, 0))
                stacks[side.stack] = FactorStack(size, group.order, old.count + group.count)
    return tuple(stacks[k] for k in range(len(stacks)))


def region_blocks(view: torch.Tensor, region: Region) -> torch.Tensor:
    """The region's blocks of a 2-D view as a (count, block_rows, block_cols) stack, row-major."""
    r, c = region.block_rows, region.block_cols
    sub = view[
        region.row_start : region.row_start + region.n_rows * r, region.col_start : region.col_start + region.n_cols * c
    ]
    return sub.reshape(region.n_rows, r, region.n_cols, c).permute(0, 2, 1, 3).reshape(region.count, r, c)


def gather(plan: Plan, tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """Cut every matrix/segment parameter-shaped tensor into blocks: one (N, r, c) stack per group."""
    pieces: list[list[torch.Tensor]] = [[] for _ in plan.groups]
    for p, x in zip(plan.params, tensors):
        if p.regions:
            view = x.reshape(p.view).to(dtype)
            for region in p.regions:  # regions are visited in offset order within each group
                pieces[region.group].append(region_blocks(view, region))
    device = tensors[0].device if tensors else None
    return [
        blocks[0]
        if len(blocks) == 1
        else torch.cat(blocks)
        if blocks
        else torch.zeros(0, g.rows, g.cols, dtype=dtype, device=device)
        for g, blocks in zip(plan.groups, pieces)
    ]


def scatter_param(p: ParamPlan, stacks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Reassemble one parameter's 2-D view from the group stacks (inverse of ``gather``)."""
    rows = []
    for region in p.regions:
        blocks = stacks[region.group][region.offset : region.offset + region.count]
        r, c = region.block_rows, region.block_cols
        tile = (
            blocks.reshape(region.n_rows, region.n_cols, r, c)
            .permute(0, 2, 1, 3)
            .reshape(region.n_rows * r, region.n_cols * c)
        )
        if region.col_start == 0:
            rows.append([tile])
        else:
            rows[-1].append(tile)
    bands = [torch.cat(tiles, dim=1) if len(tiles) > 1 else tiles[0] for tiles in rows]
    return torch.cat(bands) if len(bands) > 1 else bands[0]


def block_ranges(p: ParamPlan) -> list[tuple[int, int, int]]:
    """``(group, start, stop)``: where each of the parameter's regions lies in its block stack."""
    return [(r.group, r.offset, r.offset + r.count) for r in p.regions]
