"""Where each rank's piece of a DTensor parameter lies: a rectangle of the parameter's 2-D view.

FSDP2 shards a parameter's dim 0 over one mesh dimension; tensor parallelism (torchtitan's
``ColwiseParallel`` / ``RowwiseParallel``) shards dim 0 or dim 1 over another; HSDP adds a
dimension that replicates. A parameter may also live on a sub-mesh (torchtitan's norms, sharded
by FSDP2 on the data-parallel dims only): there it is replicated over the dims it lacks.

Every such layout gives each rank a box of the parameter (an offset and a local shape per dim),
which DTensor computes with ``_compute_local_shape_and_global_offset``, the same function it and
DCP use for every placement, ``_StridedShard`` included (FSDP2's record of sharding a dim that
tensor parallelism already split). The step works on the parameter's 2-D view (R, C)
(:func:`dash_fn.plan.matrix_view`), in which a box is a rectangle of rows and columns when its
leading dims flatten to one range of rows and its trailing dims to one range of columns.

The ranks that step the blocks together, the *work group*, are the mesh's dims on which some
parameter is sharded; dims on which every parameter is replicated (HSDP's replicas) compute the
same update side by side, with no communication between them.

The *tensor-parallel dims* are the work dims named "tp" (torchtitan's name) or on which some
parameter is replicated (a norm, a module left out of the plan) while others are sharded:
FSDP2 shards every parameter on its dims. A parameter's *tiles* are the pieces those dims
alone give it; where they cut its 2-D view into equal bands (of rows, of columns, or both),
``fsdp_blocks="aligned"`` blocks each tile from its own first row and column
(:func:`dash_fn.plan.make_plan`'s ``splits``); an uneven cut (torch.chunk's, of a length the
degree does not divide) keeps the exact blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from ..plan import batched_view

Rect = tuple[int, int, int, int]  # rows [r0, r1) x columns [c0, c1) of a parameter's 2-D view
MAX_MESH_DIMS = 3


@dataclass(frozen=True)
class Layout:
    """Every rank's piece of every parameter, in the work group's rank order.

    ``rects[i][k]``: work rank k's rectangle of parameter i's 2-D view; ``shapes[i]``: the shape
    of this rank's piece of parameter i; ``placed[i]``: its DeviceMesh and placements (to place
    AdamW moments like it in checkpoints; empty where no processes exist); ``tiles[i]``: the
    equal bands of rows and of columns that tensor parallelism cuts it into (empty: none).
    """

    rank: int
    world_size: int
    group_name: str | None
    rects: tuple[tuple[Rect, ...], ...]
    shapes: tuple[tuple[int, ...], ...]
    placed: tuple[tuple[Any, tuple], ...]
    tiles: tuple[tuple[int, int], ...] = ()  # per parameter: its tensor-parallel (row, column) tiles


def read_layout(names: Sequence[str], dtensors: Sequence[Any], batch_dims: dict[str, int]) -> Layout:
    """The layout of DTensor parameters; TypeError for what dash_fn cannot serve (the placement
    and the parameter named), ValueError where a shard is not what its placements say."""
    from torch.distributed.tensor import Replicate

    mesh = max((x.device_mesh for x in dtensors), key=lambda m: m.ndim)
    if mesh.ndim > MAX_MESH_DIMS:
        raise TypeError(
            f"params[{names[0]!r}] lives on a {mesh.ndim}-D DeviceMesh; dash_fn serves meshes of up to "
            f"{MAX_MESH_DIMS} dims (replicate, shard and tensor-parallel)"
        )
    placements: list[tuple] = []
    for name, x in zip(names, dtensors):
        for p in x.placements:
            _check_placement(name, p, x)
        dims = _sub_mesh_dims(mesh, x.device_mesh, name)
        spread: list = [Replicate()] * mesh.ndim
        for d, p in zip(dims, x.placements):
            spread[d] = p
        placements.append(tuple(spread))
    work = work_dims(placements)
    coordinate = mesh.get_coordinate()
    mesh_shape = tuple(mesh.shape)
    rects = []
    for name, x, on_mesh in zip(names, dtensors, placements):
        shape = tuple(x.shape)
        if tuple(x.to_local().shape) != _box(shape, mesh_shape, coordinate, on_mesh)[1]:
            raise ValueError(
                f"init: params[{name!r}] holds a shard of shape {tuple(x.to_local().shape)} on rank "
                f"{mesh.get_rank()}, not the one its placements {tuple(x.placements)} give a parameter of {shape}"
            )
        rects.append(piece_rects(name, shape, batch_dims.get(name, 0), mesh_shape, on_mesh, work, coordinate))
    work_coords = list(product(*(range(mesh.size(d)) for d in work)))
    rank = work_coords.index(tuple(coordinate[d] for d in work))
    world = len(work_coords)
    shapes = tuple(tuple(x.to_local().shape) for x in dtensors)
    placed = tuple((x.device_mesh, tuple(x.placements)) for x in dtensors)
    tp = tensor_parallel_dims(placements, work, mesh.mesh_dim_names)
    tiles = tuple(
        tensor_parallel_tiles(name, tuple(x.shape), batch_dims.get(name, 0), mesh_shape, on_mesh, tp)
        for name, x, on_mesh in zip(names, dtensors, placements)
    )
    group = _work_group(mesh, work) if world > 1 else None
    return Layout(rank, world, group, tuple(rects), shapes, placed, tiles)


def work_dims(placements: Sequence[tuple]) -> list[int]:
    """The mesh dims on which some parameter is sharded (the others only replicate)."""
    ndim = len(placements[0]) if placements else 0
    return [d for d in range(ndim) if any(not p[d].is_replicate() for p in placements)]


def tensor_parallel_dims(placements: Sequence[tuple], work: Sequence[int], names: Sequence[str] | None = None):
    """The work dims named "tp", or on which some parameter is replicated and another sharded:
    tensor parallelism's (FSDP2 shards every parameter on its dims)."""
    return [d for d in work if (names and names[d] == "tp") or any(p[d].is_replicate() for p in placements)]


def tensor_parallel_tiles(name: str, shape, batch_dims: int, mesh_shape, placements, tp: Sequence[int]):
    """How many equal bands of rows and of columns (of each matrix, under ``batch_dims``) the
    pieces of the tensor-parallel dims ``tp`` alone cut a parameter into; 1 along an axis
    that they leave whole or cut unevenly. Pure: no processes needed."""
    from torch.distributed.tensor import Replicate

    if not tp:
        return (1, 1)
    alone = tuple(p if d in tp else Replicate() for d, p in enumerate(placements))
    rects = [r for r in piece_rects(name, shape, batch_dims, mesh_shape, alone, tp) if r[1] > r[0] and r[3] > r[2]]
    _, (R, C), count = batched_view(shape, batch_dims)
    rows = _equal_bands(sorted({r[:2] for r in rects}), R)
    cols = _equal_bands(sorted({r[2:] for r in rects}), C)
    per_matrix = R // max(count, 1)
    if rows > 1 and count > 1:  # bands of whole matrices need no cut; bands inside them do
        band = R // rows
        rows = per_matrix // band if per_matrix % band == 0 else 1
    return (rows, cols)


def _equal_bands(ranges: Sequence[tuple[int, int]], length: int) -> int:
    """The number of ranges when they tile [0, length) in equal lengths, else 1."""
    n = len(ranges)
    if n > 1 and length % n == 0 and ranges == [(k * length // n, (k + 1) * length // n) for k in range(n)]:
        return n
    return 1


def piece_rects(
    name: str, shape, batch_dims: int, mesh_shape, placements, work: Sequence[int], coordinate=None
) -> tuple[Rect, ...]:
    """Each work rank's rect of a parameter placed ``placements`` on a mesh of ``mesh_shape``,
    in the order of the work dims' coordinates (row-major); the other dims at ``coordinate``
    (their pieces are the same at any). Pure: no processes needed."""
    coordinate = list(coordinate) if coordinate is not None else [0] * len(mesh_shape)
    split = _view_split(shape, batch_dims)
    rects = []
    for coords in product(*(range(mesh_shape[d]) for d in work)):
        for d, c in zip(work, coords):
            coordinate[d] = c
        rects.append(_rect(name, shape, split, *_box(shape, mesh_shape, coordinate, placements), placements))
    return tuple(rects)


def _check_placement(name: str, p, x) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if isinstance(p, Replicate) or (isinstance(p, (Shard, _StridedShard)) and p.dim in (0, 1)):
        return
    raise TypeError(
        f"params[{name!r}] has placements {tuple(x.placements)}: dash_fn serves Replicate(), Shard(0) and Shard(1) "
        f"(FSDP2, HSDP and tensor parallelism), not {p!r}"
    )


def _sub_mesh_dims(mesh, sub, name: str) -> list[int]:
    """Which dims of ``mesh`` the dims of ``sub`` are: matched by the ranks along each dim
    through this rank, so meshes need no names."""
    if sub == mesh:
        return list(range(mesh.ndim))
    found = []
    for j in range(sub.ndim):
        along = sorted(_ranks_along(sub, j))
        match = [d for d in range(mesh.ndim) if sorted(_ranks_along(mesh, d)) == along and d not in found]
        if not match:
            raise TypeError(
                f"params[{name!r}] lives on a DeviceMesh that is no sub-mesh of the others' {mesh}; "
                "dash_fn needs every parameter on one mesh or on sub-meshes of it"
            )
        found.append(match[0])
    return found


def _ranks_along(mesh, dim: int) -> list[int]:
    """The ranks of mesh dim ``dim`` through this rank's coordinate."""
    index: list[Any] = list(mesh.get_coordinate())
    index[dim] = slice(None)
    return mesh.mesh[tuple(index)].tolist()


def _box(shape, mesh_shape, coordinate, placements) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global offset, local shape) of the piece at mesh ``coordinate``: DTensor's own arithmetic."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    local, offset = _compute_local_shape_and_global_offset(shape, mesh_shape, list(coordinate), placements)
    return tuple(int(o) for o in offset), tuple(int(n) for n in local)


def _view_split(shape: Sequence[int], batch_dims: int) -> int:
    """The dim at which the 2-D view's rows end: its rows index ``shape[:split]``, its columns
    the rest (a vector's are all rows)."""
    _, (_, C), _ = batched_view(shape, batch_dims)
    if C == 1:
        return len(shape)
    return next(d + 1 for d in range(batch_dims, len(shape)) if shape[d] != 1)


def _span(shape: Sequence[int], offset: Sequence[int], local: Sequence[int]) -> tuple[int, int] | None:
    """The flat range [a, b) that a box of dims ``shape`` covers, or None when it is not one range:
    one dim may be partial, the dims before it must have one index, the dims after it be whole."""
    if any(n == 0 for n in local):
        return (0, 0)
    a = 0
    for d, size in enumerate(shape):
        a = a * size + offset[d]
    partial = [d for d in range(len(shape)) if local[d] != shape[d]]
    if partial:
        first = partial[0]
        if any(local[d] != 1 for d in range(first)) or any(local[d] != shape[d] for d in range(first + 1, len(shape))):
            return None
    count = 1
    for n in local:
        count *= n
    return a, a + count


def _rect(name, shape, split, offset, local, placements) -> Rect:
    rows = _span(shape[:split], offset[:split], local[:split])
    cols = _span(shape[split:], offset[split:], local[split:])
    if rows is None or cols is None:
        raise TypeError(
            f"params[{name!r}] of shape {tuple(shape)} under placements {placements} gives a rank a piece that is "
            "not a rectangle of its 2-D view (rows from its leading dim, columns from the rest); dash_fn serves "
            "Shard(0) and Shard(1) of matrices, and Shard(0) of the leading dim otherwise"
        )
    if rows == (0, 0) or cols == (0, 0):
        return (0, 0, 0, 0)
    return (*rows, *cols)


_GROUPS: dict[tuple, Any] = {}


def _work_group(mesh, work: list[int]) -> str:
    """The process group of this rank's work group (the ``work`` dims of ``mesh``), by name."""
    if len(work) == 1:
        return mesh.get_group(work[0]).group_name
    import torch.distributed as dist

    rest = [d for d in range(mesh.ndim) if d not in work]
    size = 1
    for d in work:
        size *= mesh.size(d)
    lists = tuple(tuple(row.tolist()) for row in mesh.mesh.permute(*rest, *work).reshape(-1, size))
    if lists not in _GROUPS:  # every rank creates every group, in the same order
        _GROUPS[lists] = dist.new_subgroups_by_enumeration([list(r) for r in lists])[0]
    return _GROUPS[lists].group_name
