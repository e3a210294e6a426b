"""FSDP2 row shards: blocks inside a shard stay local, straddling blocks go to one owner.

``fully_shard`` gives every parameter as a DTensor placed ``Shard(0)`` on a 1-D mesh of W
ranks (or ``(Replicate(), Shard(0))`` on a 2-D HSDP mesh, whose shard dimension is the group
used here): rank k holds a contiguous range of rows of the parameter's 2-D view, the
``torch.chunk`` split of dim 0 (``ceil(rows / W)`` each, the last ranks fewer or none).

``fsdp_blocks="exact"`` (default) cuts blocks exactly as one process does, from row 0 of the
whole parameter. A *band* (one row of blocks) whose rows all sit on one rank is owned and
computed there; a band that straddles shards is owned by one of the ranks holding its rows
(:func:`ownership.band_owners`). Each rank's owned bands of a parameter are one contiguous
range of rows, its *owned rows*. A step moves rows twice, with one all-to-all each:
gradient rows to their owners, then the owners' direction rows back to the shards that hold
them. Each rank then applies its own rows' update. The result equals one process bit for bit
(every block's arithmetic is independent of its stack, as for DDP ownership).

``fsdp_blocks="local"`` cuts blocks at shard edges (each rank's shard is blocked from its own
row 0, as Distributed Shampoo does without communication): no collective at all, but the
blocks, and so the results, depend on W.

AdamW vectors are elementwise: each rank updates its own rows, whatever the mode.
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
from .ownership import band_owners, block_cost

Rows = tuple[int, int]  # [lo, hi) rows of a parameter's 2-D view


@dataclass(frozen=True)
class FsdpShard:
    """This rank's part of FSDP2-sharded parameters: a constant of the step, like the plan.

    ``local`` describes the tensors this rank steps: its shards (``params``: local shapes,
    views and AdamW offsets) and its owned block stacks (``groups``, ``factors``).
    ``owned[i]`` cuts parameter i's owned rows (a 2-D tensor of ``owned_rows[i][rank]``)
    into blocks whose offsets index the local stacks. ``rows[i][k]`` and ``owned_rows[i][k]``
    are rank k's shard rows and owned rows of parameter i, in rows of its global 2-D view.
    """

    rank: int
    world_size: int
    group_name: str | None
    mode: str  # "exact" or "local"
    local: Plan
    owned: tuple[ParamPlan, ...]
    rows: tuple[tuple[Rows, ...], ...]
    owned_rows: tuple[tuple[Rows, ...], ...]
    exchanges: bool  # whether any rank sends any rows (else the step has no collective)
    kind = "fsdp"

    def all_ranks(self, flag: torch.Tensor) -> torch.Tensor:
        """Whether ``flag`` (0-d bool) holds on every rank: one all-reduce when W > 1."""
        return all_ranks(flag, self.world_size, self.group_name)

    def owned_ranges(self, index: int) -> list[tuple[int, int, int]]:
        """``(group, start, stop)`` in this rank's stacks: the owned blocks of parameter ``index``."""
        return [(r.group, r.offset, r.offset + r.count) for r in self.owned[index].regions]

    def key_prefix(self, index: int) -> str:
        """What a checkpoint key of parameter ``index`` starts with: under ``fsdp_blocks="local"``
        blocks exist per shard, named by the shard's first row."""
        return f"shard_{self.rows[index][self.rank][0]}_" if self.mode == "local" else ""

    def global_moment(self, index: int, whole: ParamPlan, local: torch.Tensor) -> torch.Tensor:
        """An AdamW moment of parameter ``index`` as a checkpoint keeps it: with exact blocks a
        DTensor of the parameter's shape placed like it (rows sharded), else this shard's."""
        if self.mode == "local" or self.world_size == 1:
            return local
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.distributed_c10d import _resolve_process_group
        from torch.distributed.tensor import DTensor, Shard

        # the group name: torch types it as GroupName, a NewType of str; set whenever W > 1
        group = _resolve_process_group(self.group_name)  # type: ignore[arg-type]
        mesh = DeviceMesh.from_group(group, local.device.type)
        stride = torch.empty(whole.shape, device="meta").stride()
        return DTensor.from_local(
            local, mesh, (Shard(0),), run_check=False, shape=torch.Size(whole.shape), stride=stride
        )

    def local_moment(self, index: int, whole: ParamPlan, value):
        """This rank's rows of a saved AdamW moment: a DTensor's local piece, a whole tensor's
        slice (exact blocks), else the value."""
        from torch.distributed.tensor import DTensor

        if isinstance(value, DTensor):
            return value.to_local()
        if self.mode == "exact" and isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(whole.shape):
            lo, hi = self.rows[index][self.rank]
            return value.reshape(whole.view)[lo:hi].reshape(self.local.params[index].shape)
        return value

    def block_origins(self, plan: Plan):
        """``(param index, row, col, group, stack position)`` of every block this rank holds;
        rows and columns in the parameter's 2-D view (in local mode: in its shard's view)."""
        for i, (p, rows) in enumerate(zip(self.owned, self.owned_rows)):
            start = rows[self.rank][0] if self.mode == "exact" else 0
            for r in p.regions:
                for k in range(r.count):
                    a, b = divmod(k, r.n_cols)
                    yield (
                        i,
                        start + r.row_start + a * r.block_rows,
                        r.col_start + b * r.block_cols,
                        r.group,
                        r.offset + k,
                    )

    def gradient_blocks(self, plan: Plan, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's owned gradient blocks, its shards' rows joined by the straddling rows
        that other ranks send (one all-to-all)."""
        if self.mode == "local":
            return gather(self.local, grads, plan.dtype)
        local_rows = [_rows_view(p, g).to(plan.dtype) for p, g in zip(self.local.params, grads)]
        owned_rows = self._move(local_rows, self.rows, self.owned_rows, plan.dtype, None)
        return gather(dataclasses.replace(self.local, params=self.owned), owned_rows, plan.dtype)

    def parameter_updates(
        self, plan: Plan, directions: Sequence[torch.Tensor], comm_dtype
    ) -> list[torch.Tensor | None]:
        """Each block parameter's direction on this rank's shard rows (the owners send the
        straddling rows back: one all-to-all); None for AdamW and empty parameters."""
        dtype = plan.dtype
        owned = [scatter_param(p, directions) if p.regions else _no_rows(p, dtype, directions) for p in self.owned]
        if self.mode == "exact":
            owned = self._move(owned, self.owned_rows, self.rows, dtype, comm_dtype)
        return [x.reshape(p.shape) if p.kind not in (ADAMW, EMPTY) else None for p, x in zip(self.local.params, owned)]

    def _move(self, tensors: list[torch.Tensor], have, want, dtype, comm_dtype) -> list[torch.Tensor]:
        """Rows ``want[i][rank]`` of every parameter i, given that each rank k holds rows
        ``have[i][k]`` (``tensors[i]`` here): the rows other ranks hold travel in one all-to-all
        (in ``comm_dtype`` when given, rounded alike on every rank)."""
        me, world = self.rank, self.world_size
        send, send_sizes, recv_sizes = [], [], []
        for k in range(world):
            sent = received = 0
            for i, x in enumerate(tensors):
                if k == me:
                    continue
                a, b = _meet(have[i][me], want[i][k])
                if a < b:
                    lo = have[i][me][0]
                    send.append(x[a - lo : b - lo].reshape(-1))
                    sent += send[-1].numel()
                a, b = _meet(have[i][k], want[i][me])
                received += max(b - a, 0) * x.shape[1]
            send_sizes.append(sent)
            recv_sizes.append(received)
        pieces_from: list[Any] = [[] for _ in range(world)]  # per rank: the tensor received from it, once exchanged
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
        out = []
        for i, x in enumerate(tensors):
            parts = []
            for k in range(world):
                a, b = _meet(have[i][k], want[i][me])
                if a >= b:
                    continue
                if k == me:
                    lo = have[i][me][0]
                    parts.append(x[a - lo : b - lo])
                else:
                    n = (b - a) * x.shape[1]
                    parts.append(pieces_from[k][cursor[k] : cursor[k] + n].view(b - a, x.shape[1]))
                    cursor[k] += n
            out.append(torch.cat(parts) if len(parts) > 1 else parts[0] if parts else x[:0])
        return out


def shard_rows(shape: Sequence[int], world_size: int, columns: int | None = None) -> tuple[Rows, ...]:
    """Each rank's rows of the parameter's 2-D view (``columns`` wide; by default the view
    of :func:`matrix_view`) under ``Shard(0)``: torch.chunk's split of dim 0, ``ceil(d0 / W)``
    indices of dim 0 each, the last ranks fewer or none."""
    numel = 1
    for d in shape:
        numel *= d
    C = matrix_view(shape)[1][1] if columns is None else columns
    d0 = shape[0]
    per_d0 = numel // d0 if d0 else 0  # elements per index of dim 0: a whole number of view rows
    chunk = -(-d0 // world_size) if d0 else 0
    rows = []
    for k in range(world_size):
        lo, hi = min(k * chunk, d0), min((k + 1) * chunk, d0)
        rows.append((lo * per_d0 // C, hi * per_d0 // C) if numel else (0, 0))
    return tuple(rows)


def local_shape(shape: Sequence[int], world_size: int, rank: int) -> tuple[int, ...]:
    """The shape of rank ``rank``'s ``Shard(0)`` piece of a parameter of ``shape``."""
    chunk = -(-shape[0] // world_size)
    lo, hi = min(rank * chunk, shape[0]), min((rank + 1) * chunk, shape[0])
    return (hi - lo, *shape[1:])


def make_fsdp_shard(
    plan: Plan, rank: int, world_size: int, group_name: str | None, mode: str, one_dim: str
) -> FsdpShard:
    """Rank ``rank``'s part of ``plan`` when every parameter is ``Shard(0)`` over W ranks."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
    group_name = group_name if world_size > 1 else None
    rows = tuple(shard_rows(p.shape, world_size, p.view[1]) for p in plan.params)
    if mode == "local":  # each shard is a whole problem of its own
        specs = [(p.name, local_shape(p.shape, world_size, rank), p.dtype) for p in plan.params]
        local = make_plan(specs, plan.block_size, one_dim, {p.name: p.batch_dims for p in plan.params}, plan.thin_ratio)
        return FsdpShard(rank, world_size, group_name, mode, local, local.params, rows, rows, False)
    owned_rows = plan_bands(plan, rows, world_size)[0]
    owned, counts = _owned_regions(plan, owned_rows, rank)
    groups = lay_out_factors([(g.rows, g.cols, g.sides, n) for g, n in zip(plan.groups, counts)])
    params = _local_params(plan, rows, rank, world_size)
    adamw_numel = sum(p.numel for p in params if p.kind == ADAMW)
    local = dataclasses.replace(
        plan, params=params, groups=groups, factors=stack_sizes(groups), adamw_numel=adamw_numel
    )
    return FsdpShard(
        rank, world_size, group_name, mode, local, owned, rows, owned_rows, moved_elements(plan, rows, owned_rows) > 0
    )


def moved_elements(plan: Plan, rows, owned_rows) -> int:
    """Elements that one all-to-all moves: every shard's rows of bands other ranks own."""
    world = len(rows[0]) if rows else 1
    total = 0
    for p, held, owned in zip(plan.params, rows, owned_rows):
        for k in range(world):
            for o in range(world):
                a, b = _meet(held[k], owned[o])
                if k != o and a < b:
                    total += (b - a) * p.view[1]
    return total


def band_plan(plan: Plan, rows) -> list[tuple[int, int, int, tuple[int, ...], int]]:
    """Every band of every block parameter: (param index, first row, last row + 1, rows held
    by each rank, root cost), in canonical order."""
    bands = []
    for i, p in enumerate(plan.params):
        parts: dict[int, list[Region]] = {}
        for region in p.regions:
            parts.setdefault(region.row_start, []).append(region)
        for row_start, regions in parts.items():
            br = regions[0].block_rows
            cost = sum(r.n_cols * block_cost(plan.groups[r.group]) for r in regions)
            for b in range(regions[0].n_rows):
                a, z = row_start + b * br, row_start + (b + 1) * br
                held = tuple(max(0, min(z, hi) - max(a, lo)) for lo, hi in rows[i])
                bands.append((i, a, z, held, cost))
    return bands


def plan_bands(plan: Plan, rows, world_size: int):
    """Owned rows of every parameter on every rank, and the ranks' root loads."""
    bands = band_plan(plan, rows)
    owners, loads = band_owners([(held, cost) for _, _, _, held, cost in bands], world_size)
    owned = [[(0, 0)] * world_size for _ in plan.params]
    for (i, a, z, _, _), k in zip(bands, owners):
        lo, hi = owned[i][k]
        owned[i][k] = (a, z) if lo == hi else (min(lo, a), max(hi, z))
    return tuple(tuple(r) for r in owned), loads


def _owned_regions(plan: Plan, owned_rows, rank: int) -> tuple[tuple[ParamPlan, ...], list[int]]:
    """Each parameter's owned rows cut into regions (offsets into the local stacks), and the
    number of blocks this rank owns in every group."""
    counts = [0] * len(plan.groups)
    owned = []
    for p, rows in zip(plan.params, owned_rows):
        a, z = rows[rank]
        regions = []
        for r in p.regions:
            first = max(0, -(-(a - r.row_start) // r.block_rows))
            last = min(r.n_rows, (z - r.row_start) // r.block_rows)
            if first < last:
                n = (last - first) * r.n_cols
                regions.append(
                    dataclasses.replace(
                        r, row_start=r.row_start + first * r.block_rows - a, n_rows=last - first, offset=counts[r.group]
                    )
                )
                counts[r.group] += n
        owned.append(dataclasses.replace(p, view=(z - a, p.view[1]), regions=tuple(regions)))
    return tuple(owned), counts


def _local_params(plan: Plan, rows, rank: int, world_size: int) -> tuple[ParamPlan, ...]:
    """The plan's parameters as this rank's shards: local shapes and views, AdamW offsets
    of the local elements."""
    params, flat = [], 0
    for p, rs in zip(plan.params, rows):
        lo, hi = rs[rank]
        params.append(
            dataclasses.replace(
                p, shape=local_shape(p.shape, world_size, rank), view=(hi - lo, p.view[1]), flat_offset=flat
            )
        )
        if p.kind == ADAMW:
            flat += (hi - lo) * p.view[1]
    return tuple(params)


def _rows_view(p: ParamPlan, x: torch.Tensor) -> torch.Tensor:
    return x.reshape(p.view) if p.kind != EMPTY else x.reshape(0, 1)


def _no_rows(p: ParamPlan, dtype, directions) -> torch.Tensor:
    device = directions[0].device if directions else None
    return torch.zeros(0, p.view[1], dtype=dtype, device=device)


def _meet(x: Rows, y: Rows) -> Rows:
    return max(x[0], y[0]), min(x[1], y[1])


def check_dtensors(names: Sequence[str], tensors: Sequence[torch.Tensor]):
    """The DeviceMesh and its shard dimension when the params are FSDP2 DTensors, else None.

    Raises TypeError for what is not supported: DTensors mixed with plain tensors, meshes of
    more than two dims, placements other than ``(Shard(0),)`` on a 1-D mesh or
    ``(Replicate(), Shard(0))`` on a 2-D (HSDP) mesh, parameters on different meshes.
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    is_dtensor = [isinstance(x, DTensor) for x in tensors]
    if not any(is_dtensor):
        return None
    if not all(is_dtensor):
        plain = names[is_dtensor.index(False)]
        sharded = names[is_dtensor.index(True)]
        raise TypeError(
            f"params mixes DTensors ({sharded!r}) and plain tensors ({plain!r}); dash_fn takes either all parameters "
            "sharded by fully_shard (FSDP2) or all plain (one process, or DDP with process_group=)"
        )
    dtensors = [x for x in tensors if isinstance(x, DTensor)]  # all of them, typed as DTensors
    mesh = dtensors[0].device_mesh
    supported = "FSDP2's (Shard(0),) on a 1-D mesh or (Replicate(), Shard(0)) on a 2-D HSDP mesh"
    if mesh.ndim > 2:
        raise TypeError(
            f"params[{names[0]!r}] lives on a {mesh.ndim}-D DeviceMesh; "
            f"dash_fn supports {supported} (no tensor or context parallelism)"
        )
    expected = (Shard(0),) if mesh.ndim == 1 else (Replicate(), Shard(0))
    for name, x in zip(names, dtensors):
        if x.device_mesh != mesh:
            raise TypeError(
                f"params[{name!r}] is on another DeviceMesh than params[{names[0]!r}]; "
                "dash_fn needs one mesh for all parameters"
            )
        if tuple(x.placements) != expected:
            raise TypeError(
                f"params[{name!r}] has placements {tuple(x.placements)}; dash_fn supports {supported}, "
                "not tensor-parallel placements such as Shard(1) or Partial"
            )
        if x.ndim == 0:
            raise TypeError(f"params[{name!r}] is a 0-d DTensor, which Shard(0) cannot split")
    return mesh, mesh.ndim - 1


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
