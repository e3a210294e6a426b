"""DTensor parameters (FSDP2, tensor parallel, HSDP): blocks inside a piece stay local,
straddling blocks go to one owner.

Each rank of the *work group* (:mod:`.layout`: the mesh dims that shard some parameter) holds
a rectangle of every parameter's 2-D view: a range of rows under FSDP2's ``Shard(0)`` (and
under tensor parallelism's ``Shard(0)`` of a colwise weight, which FSDP2 records as
``_StridedShard``), rows and a range of columns under a rowwise weight's ``Shard(1)``; ranks
of a dim the parameter is replicated on hold the same rectangle.

``fsdp_blocks="exact"`` (default) cuts blocks exactly as one process does, from row 0 and
column 0 of the whole parameter. The view's columns split into *strips*, one per distinct
column range the ranks hold, each strip's edges moved to the nearest block edge; inside a
strip, a *band* (one row of the strip's blocks) is owned by one of the ranks holding that
column range (:func:`ownership.band_owners`: whole bands where they lie, straddling bands to
the rank holding most of their rows; of ranks holding the same rectangle, the first). Each
rank's owned blocks of a parameter are one rectangle, its *owned rect*. A step moves pieces
twice, with one all-to-all each: gradient pieces to their owners, then the owners' direction
pieces back to every rank that holds them. Each rank then applies its own piece's update. The
result equals one process bit for bit (every block's arithmetic is independent of its stack,
as for DDP ownership). Where block edges fall on the shard edges, nothing moves.

``fsdp_blocks="local"`` cuts blocks at shard edges (each rank's piece is blocked from its own
first row and column, as Distributed Shampoo does without communication): no collective at
all, but the blocks, and so the results, depend on the layout.

AdamW vectors are elementwise: each rank updates its own piece, whatever the mode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..plan import (
    ADAMW,
    EMPTY,
    ParamPlan,
    Plan,
    Region,
    gather,
    lay_out_factors,
    make_plan,
    matrix_view,
    scatter_param,
    stack_sizes,
)
from .gather import all_ranks
from .layout import Layout, Rect
from .ownership import band_owners, block_cost


@dataclass(frozen=True)
class FsdpShard:
    """This rank's part of DTensor parameters: a constant of the step, like the plan.

    ``local`` describes the tensors this rank steps: its pieces (``params``: local shapes,
    views and AdamW offsets) and its owned block stacks (``groups``, ``factors``).
    ``owned[i]`` cuts parameter i's owned rect (a 2-D tensor of ``owned_rects[i][rank]``'s
    shape) into blocks whose offsets index the local stacks. ``rects[i][k]`` and
    ``owned_rects[i][k]`` are work rank k's piece and owned rect of parameter i, in its global
    2-D view; ``placed[i]`` its DeviceMesh and placements (None without processes).
    """

    rank: int
    world_size: int
    group_name: str | None
    piecewise: bool  # blocks cut at every piece's edges (fsdp_blocks="local"), else as one process cuts them
    local: Plan
    owned: tuple[ParamPlan, ...]
    rects: tuple[tuple[Rect, ...], ...]
    owned_rects: tuple[tuple[Rect, ...], ...]
    exchanges: bool  # whether any rank sends anything (else the step has no collective)
    placed: tuple[Any, ...] = ()
    kind = "fsdp"

    def all_ranks(self, flag: torch.Tensor) -> torch.Tensor:
        """Whether ``flag`` (0-d bool) holds on every rank: one all-reduce when W > 1."""
        return all_ranks(flag, self.world_size, self.group_name)

    def owned_ranges(self, index: int) -> list[tuple[int, int, int]]:
        """``(group, start, stop)`` in this rank's stacks: the owned blocks of parameter ``index``."""
        return [(r.group, r.offset, r.offset + r.count) for r in self.owned[index].regions]

    def key_prefix(self, index: int) -> str:
        """What a checkpoint key of parameter ``index`` starts with: under ``fsdp_blocks="local"``
        blocks exist per piece, named by the piece's first row (and first column, if not 0)."""
        if not self.piecewise:
            return ""
        r0, _, c0, _ = self.rects[index][self.rank]
        return f"shard_{r0}_" + (f"cols_{c0}_" if c0 else "")

    def global_moment(self, index: int, whole: ParamPlan, local: torch.Tensor) -> torch.Tensor:
        """An AdamW moment of parameter ``index`` as a checkpoint keeps it: with exact blocks a
        DTensor of the parameter's shape placed like it, else this piece's."""
        if self.piecewise or self.world_size == 1 or not self.placed:
            return local
        from torch.distributed.tensor import DTensor

        mesh, placements = self.placed[index]
        stride = torch.empty(whole.shape, device="meta").stride()
        return DTensor.from_local(
            local, mesh, placements, run_check=False, shape=torch.Size(whole.shape), stride=stride
        )

    def local_moment(self, index: int, whole: ParamPlan, value):
        """This rank's piece of a saved AdamW moment: a DTensor's local piece, a whole tensor's
        rectangle (exact blocks), else the value."""
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            return value.to_local()
        if not self.piecewise and isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(whole.shape):
            r0, r1, c0, c1 = self.rects[index][self.rank]
            return value.reshape(whole.view)[r0:r1, c0:c1].reshape(self.local.params[index].shape)
        return value

    def block_origins(self, plan: Plan):
        """``(param index, row, col, group, stack position)`` of every block this rank holds;
        rows and columns in the parameter's 2-D view (in local mode: in its piece's view)."""
        for i, p in enumerate(self.owned):
            row, _, col, _ = self.owned_rects[i][self.rank] if not self.piecewise else (0, 0, 0, 0)
            for r in p.regions:
                for k in range(r.count):
                    a, b = divmod(k, r.n_cols)
                    yield (
                        i,
                        row + r.row_start + a * r.block_rows,
                        col + r.col_start + b * r.block_cols,
                        r.group,
                        r.offset + k,
                    )

    def gradient_blocks(self, plan: Plan, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's owned gradient blocks, its pieces joined by the pieces that other ranks
        send (one all-to-all)."""
        if self.piecewise:
            return gather(self.local, grads, plan.dtype)
        pieces = [_view_of(p, g).to(plan.dtype) for p, g in zip(self.local.params, grads)]
        owned = self._move(pieces, self.rects, self.owned_rects, plan.dtype, None)
        return gather(dataclasses.replace(self.local, params=self.owned), owned, plan.dtype)

    def parameter_updates(
        self, plan: Plan, directions: Sequence[torch.Tensor], comm_dtype
    ) -> list[torch.Tensor | None]:
        """Each block parameter's direction on this rank's pieces (the owners send the pieces
        that others hold back: one all-to-all); None for AdamW and empty parameters."""
        dtype = plan.dtype
        owned = [scatter_param(p, directions) if p.regions else _nothing(p, dtype, directions) for p in self.owned]
        if not self.piecewise:
            owned = self._move(owned, self.owned_rects, self.rects, dtype, comm_dtype)
        return [x.reshape(p.shape) if p.kind not in (ADAMW, EMPTY) else None for p, x in zip(self.local.params, owned)]

    def _move(self, tensors: list[torch.Tensor], have, want, dtype, comm_dtype) -> list[torch.Tensor]:
        """Rect ``want[i][rank]`` of every parameter i, given that each rank k holds rect
        ``have[i][k]`` (``tensors[i]`` here): what other ranks hold travels in one all-to-all
        (in ``comm_dtype`` when given, rounded alike on every rank)."""
        me, world = self.rank, self.world_size
        send: list[torch.Tensor] = []
        send_sizes, recv_sizes = [0] * world, [0] * world
        blocked = [i for i, p in enumerate(self.local.params) if p.kind not in (ADAMW, EMPTY)]
        for k in range(world):
            for i in blocked:
                x = tensors[i]
                for piece, source in pieces_of(have[i], want[i][k], k):
                    if source == me and k != me:
                        send.append(_cut(x, have[i][me], piece).reshape(-1))
                        send_sizes[k] += send[-1].numel()
                    elif k == me and source != me:
                        recv_sizes[source] += _area(piece)
        pieces_from: list[Any] = [None] * world  # per rank: what it sent, once exchanged
        if self.exchanges:
            import torch.distributed._functional_collectives as collectives

            device = tensors[0].device if tensors else None
            buffer = torch.cat(send) if send else torch.zeros(0, dtype=dtype, device=device)
            if comm_dtype is not None:
                buffer = buffer.to(comm_dtype)
            recv = collectives.wait_tensor(
                # the group name: torch types it as GroupName, a NewType of str; set whenever W > 1
                collectives.all_to_all_single(buffer, recv_sizes, send_sizes, self.group_name)  # type: ignore[arg-type]
            ).to(dtype)
            pieces_from = list(torch.split(recv, recv_sizes))
        cursor = [0] * world
        out = list(tensors)  # AdamW and empty parameters as they are: nothing of them moves
        for i in blocked:
            x, target = tensors[i], want[i][me]
            parts = []
            for piece, source in pieces_of(have[i], target, me):
                if source == me:
                    parts.append((piece, _cut(x, have[i][me], piece)))
                else:
                    n = _area(piece)
                    shape = (piece[1] - piece[0], piece[3] - piece[2])
                    parts.append((piece, pieces_from[source][cursor[source] : cursor[source] + n].view(shape)))
                    cursor[source] += n
            out[i] = _assemble(target, parts, x)
        return out


def pieces_of(have: Sequence[Rect], target: Rect, rank: int) -> list[tuple[Rect, int]]:
    """How rank ``rank`` assembles rect ``target`` from what the ranks hold (``have[k]``):
    ``(piece, source rank)`` for each distinct held rect that meets it, the piece taken from
    ``rank`` itself when it holds that rect, else from the first rank that does."""
    out = []
    seen: set[Rect] = set()
    for k, rect in enumerate(have):
        if rect in seen or not _area(rect):
            continue
        seen.add(rect)
        piece = _meet(rect, target)
        if _area(piece):
            out.append((piece, rank if have[rank] == rect else k))
    return out


def _meet(x: Rect, y: Rect) -> Rect:
    r0, r1, c0, c1 = max(x[0], y[0]), min(x[1], y[1]), max(x[2], y[2]), min(x[3], y[3])
    return (r0, r1, c0, c1) if r0 < r1 and c0 < c1 else (0, 0, 0, 0)


def _area(rect: Rect) -> int:
    return (rect[1] - rect[0]) * (rect[3] - rect[2])


def _cut(x: torch.Tensor, held: Rect, piece: Rect) -> torch.Tensor:
    """The part ``piece`` of a tensor that holds rect ``held``."""
    return x[piece[0] - held[0] : piece[1] - held[0], piece[2] - held[2] : piece[3] - held[2]]


def _assemble(target: Rect, parts: list[tuple[Rect, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """Rect ``target`` from pieces that tile it."""
    shape = (target[1] - target[0], target[3] - target[2])
    if len(parts) == 1:
        return parts[0][1]
    if all(piece[2:] == target[2:] for piece, _ in parts):  # whole rows: in row order
        return torch.cat([x for _, x in sorted(parts, key=lambda part: part[0][0])]) if parts else like.new_zeros(shape)
    out = like.new_empty(shape)
    for piece, x in parts:
        out[piece[0] - target[0] : piece[1] - target[0], piece[2] - target[2] : piece[3] - target[2]] = x
    return out


def row_rects(shape: Sequence[int], world_size: int, columns: int | None = None) -> tuple[Rect, ...]:
    """Each rank's rect of the parameter's 2-D view (``columns`` wide; by default the view of
    :func:`matrix_view`) under ``Shard(0)``: torch.chunk's split of dim 0, ``ceil(d0 / W)``
    indices of dim 0 each, the last ranks fewer or none."""
    numel = 1
    for d in shape:
        numel *= d
    C = matrix_view(shape)[1][1] if columns is None else columns
    d0 = shape[0]
    per_d0 = numel // d0 if d0 else 0  # elements per index of dim 0: a whole number of view rows
    chunk = -(-d0 // world_size) if d0 else 0
    rects = []
    for k in range(world_size):
        lo, hi = min(k * chunk, d0), min((k + 1) * chunk, d0)
        rects.append((lo * per_d0 // C, hi * per_d0 // C, 0, C) if numel and hi > lo else (0, 0, 0, 0))
    return tuple(rects)


def local_shape(shape: Sequence[int], world_size: int, rank: int) -> tuple[int, ...]:
    """The shape of rank ``rank``'s ``Shard(0)`` piece of a parameter of ``shape``."""
    chunk = -(-shape[0] // world_size)
    lo, hi = min(rank * chunk, shape[0]), min((rank + 1) * chunk, shape[0])
    return (hi - lo, *shape[1:])


def row_layout(plan: Plan, rank: int, world_size: int, group_name: str | None = None) -> Layout:
    """The layout of FSDP2's ``Shard(0)`` of every parameter over W ranks, from shapes alone."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    rects = tuple(row_rects(p.shape, world_size, p.view[1]) for p in plan.params)
    shapes = tuple(local_shape(p.shape, world_size, rank) for p in plan.params)
    return Layout(rank, world_size, group_name if world_size > 1 else None, rects, shapes, ())


def make_fsdp_shard(plan: Plan, layout: Layout, piecewise: bool, one_dim: str) -> FsdpShard:
    """This rank's part of ``plan`` when the parameters lie as ``layout`` says: the plan's
    blocks (as one process cuts them, or for "aligned" as it cuts the tensor-parallel pieces,
    moved alike), or with ``piecewise`` blocks cut at every piece's edges."""
    rank, world = layout.rank, layout.world_size
    group_name = layout.group_name if world > 1 else None
    rects = layout.rects
    if piecewise:  # each piece is a whole problem of its own
        specs = [(p.name, shape, p.dtype) for p, shape in zip(plan.params, layout.shapes)]
        local = make_plan(specs, plan.block_size, one_dim, {p.name: p.batch_dims for p in plan.params}, plan.thin_ratio)
        return FsdpShard(rank, world, group_name, piecewise, local, local.params, rects, rects, False, layout.placed)
    owned_rects = plan_tiles(plan, rects, world)[0]
    owned, counts = _owned_regions(plan, owned_rects, rank)
    groups = lay_out_factors([(g.rows, g.cols, g.sides, n) for g, n in zip(plan.groups, counts)])
    params = _local_params(plan, rects, layout.shapes, rank)
    adamw_numel = sum(p.numel for p in params if p.kind == ADAMW)
    local = dataclasses.replace(
        plan, params=params, groups=groups, factors=stack_sizes(groups), adamw_numel=adamw_numel
    )
    moved = moved_elements(plan, rects, owned_rects) + moved_elements(plan, owned_rects, rects) > 0
    return FsdpShard(rank, world, group_name, piecewise, local, owned, rects, owned_rects, moved, layout.placed)


def sent_elements(plan: Plan, have, want) -> list[int]:
    """Elements each rank sends in one all-to-all when every rank k holds rect ``have[i][k]`` of
    each parameter i and wants ``want[i][k]``: the pieces others want from it."""
    world = len(have[0]) if have else 1
    sent = [0] * world
    for p, held, wanted in zip(plan.params, have, want):
        if p.kind not in (ADAMW, EMPTY):
            for k, target in enumerate(wanted):
                for piece, source in pieces_of(held, target, k):
                    if source != k:
                        sent[source] += _area(piece)
    return sent


def moved_elements(plan: Plan, have, want) -> int:
    """Elements that one all-to-all moves, over all ranks (:func:`sent_elements`)."""
    return sum(sent_elements(plan, have, want))


def strips(plan_param: ParamPlan, held: Sequence[Rect]) -> list[tuple[int, int, int, int]]:
    """The column strips of a parameter: ``(c0, c1, e0, e1)`` for each distinct column range
    ``[c0, c1)`` that ranks hold, with ``[e0, e1)`` the columns it owns (the range's edges
    moved to the nearest block edge, ties to the lower)."""
    C = plan_param.view[1]
    ranges = sorted({(r[2], r[3]) for r in held if _area(r)})
    edges = sorted({r.col_start + j * r.block_cols for r in plan_param.regions for j in range(r.n_cols)} | {C})
    nearest = [min(edges, key=lambda e: (abs(e - c0), e)) for c0, _ in ranges[1:]]
    bounds = [0, *nearest, C]
    return [(c0, c1, bounds[s], max(bounds[s], bounds[s + 1])) for s, (c0, c1) in enumerate(ranges)]


def band_plan(plan: Plan, rects) -> list[tuple[int, int, int, int, int, tuple[int, ...], int]]:
    """Every band of every strip of every block parameter: (param index, first row, last row + 1,
    first owned column, last + 1, rows held by each candidate rank, root cost), in canonical order.
    A strip's candidates are the first ranks holding each rect of its column range."""
    bands = []
    world = len(rects[0]) if rects else 1
    for i, p in enumerate(plan.params):
        held = rects[i]
        first = {rect: k for k, rect in reversed(list(enumerate(held)))}
        for c0, c1, e0, e1 in strips(p, held):
            if e0 == e1:
                continue
            candidates = [k for k in range(world) if _area(held[k]) and held[k][2:] == (c0, c1) and first[held[k]] == k]
            parts: dict[int, list[Region]] = {}
            for region in p.regions:
                parts.setdefault(region.row_start, []).append(region)
            for row_start, regions in parts.items():
                br = regions[0].block_rows
                cost = sum(len(_block_columns(r, e0, e1)) * block_cost(plan.groups[r.group]) for r in regions)
                for b in range(regions[0].n_rows):
                    a, z = row_start + b * br, row_start + (b + 1) * br
                    rows = tuple(
                        max(0, min(z, held[k][1]) - max(a, held[k][0])) if k in candidates else 0 for k in range(world)
                    )
                    bands.append((i, a, z, e0, e1, rows, cost))
    return bands


def plan_tiles(plan: Plan, rects, world_size: int):
    """Owned rect of every parameter on every rank, and the ranks' root loads."""
    bands = band_plan(plan, rects)
    owners, loads = band_owners([(held, cost) for *_, held, cost in bands], world_size)
    owned = [[(0, 0, 0, 0)] * world_size for _ in plan.params]
    for (i, a, z, e0, e1, _, _), k in zip(bands, owners):
        r0, r1, _, _ = owned[i][k]
        owned[i][k] = (a, z, e0, e1) if r0 == r1 else (min(r0, a), max(r1, z), e0, e1)
    return tuple(tuple(r) for r in owned), loads


def _block_columns(region: Region, e0: int, e1: int) -> range:
    """The region's block columns whose first column lies in [e0, e1)."""
    first = max(0, -(-(e0 - region.col_start) // region.block_cols))
    last = min(region.n_cols, -(-(e1 - region.col_start) // region.block_cols))
    return range(first, max(first, last))


def _owned_regions(plan: Plan, owned_rects, rank: int) -> tuple[tuple[ParamPlan, ...], list[int]]:
    """Each parameter's owned rect cut into regions (offsets into the local stacks), and the
    number of blocks this rank owns in every group."""
    counts = [0] * len(plan.groups)
    owned = []
    for p, rects in zip(plan.params, owned_rects):
        a, z, e0, e1 = rects[rank]
        regions = []
        for r in p.regions:
            first = max(0, -(-(a - r.row_start) // r.block_rows))
            last = min(r.n_rows, (z - r.row_start) // r.block_rows)
            columns = _block_columns(r, e0, e1)
            if first < last and columns:
                n = (last - first) * len(columns)
                regions.append(
                    dataclasses.replace(
                        r,
                        row_start=r.row_start + first * r.block_rows - a,
                        n_rows=last - first,
                        col_start=r.col_start + columns.start * r.block_cols - e0,
                        n_cols=len(columns),
                        offset=counts[r.group],
                    )
                )
                counts[r.group] += n
        owned.append(dataclasses.replace(p, view=(z - a, e1 - e0), regions=tuple(regions)))
    return tuple(owned), counts


def _local_params(plan: Plan, rects, shapes, rank: int) -> tuple[ParamPlan, ...]:
    """The plan's parameters as this rank's pieces: local shapes and views, AdamW offsets of
    the local elements."""
    params, flat = [], 0
    for p, rs, shape in zip(plan.params, rects, shapes):
        r0, r1, c0, c1 = rs[rank]
        view = (r1 - r0, c1 - c0) if _area(rs[rank]) else (0, p.view[1])
        params.append(dataclasses.replace(p, shape=tuple(shape), view=view, flat_offset=flat))
        if p.kind == ADAMW:
            flat += view[0] * view[1]
    return tuple(params)


def _view_of(p: ParamPlan, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(p.view) if p.kind != EMPTY else x.reshape(0, 1)


def _nothing(p: ParamPlan, dtype, directions) -> torch.Tensor:
    device = directions[0].device if directions else None
    return torch.zeros(p.view, dtype=dtype, device=device)


def check_dtensors(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> bool:
    """Whether the params are DTensors (FSDP2, tensor parallel, HSDP); TypeError when DTensors
    are mixed with plain tensors. :func:`.layout.read_layout` checks their placements."""
    from torch.distributed.tensor import DTensor

    is_dtensor = [isinstance(x, DTensor) for x in tensors]
    if not any(is_dtensor):
        return False
    if not all(is_dtensor):
        plain = names[is_dtensor.index(False)]
        sharded = names[is_dtensor.index(True)]
        raise TypeError(
            f"params mixes DTensors ({sharded!r}) and plain tensors ({plain!r}); dash_fn takes either all parameters "
            "as DTensors (FSDP2, tensor parallel) or all plain (one process, or DDP with process_group=)"
        )
    return True


def to_local(x: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return x.to_local() if isinstance(x, DTensor) else x


def like(reference: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as a DTensor placed like ``reference`` when that is one."""
    from torch.distributed.tensor import DTensor

    if not isinstance(reference, DTensor):
        return local
    return DTensor.from_local(
        local,
        reference.device_mesh,
        reference.placements,
        run_check=False,
        shape=reference.shape,
        stride=reference.stride(),
    )
