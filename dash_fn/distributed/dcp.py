"""The state keyed by parameter name and global block coordinates, never by rank.

``torch.distributed.checkpoint`` (DCP) saves a state dict in which every key means the same
thing on every rank: a plain tensor under a key is one global value (written once), a
DTensor is one global tensor in pieces. DASH's stacks are laid out per rank, so they are
written per parameter and per block instead::

    {parameter name: {
        "shape", "dtype", "batch_dims"            the whole parameter's, checked on load
        "step", "skipped": int64 0-d,             the step counter and the skipped steps (equal for all)
        "rows_<a>_<b>_cols_<c>_<d>": {            a block by the rows and columns it covers in
            "A", "Gt", "M": (r, c)                the parameter's 2-D view: grafting moment,
            "L", "Lbar", "L_fallbacks": (r, r), ()    gradient EMA, momentum (when kept),
            "R", "Rbar", "R_fallbacks": (c, c), ()},  factors, roots, failed refreshes
        "m", "v": the parameter's shape           AdamW moments of a vector
    }}

Only the blocks this rank holds appear in its dict, and every block is held by one rank, so
a checkpoint saved by W ranks loads on W' ranks: each rank asks for the blocks it owns
there. AdamW moments are plain tensors when parameters are whole (the same on every rank)
and DTensors placed like the parameter under FSDP2. Under ``fsdp_blocks="local"`` blocks
exist per shard: their keys start with ``shard_<first row>_`` and the checkpoint loads only
at the world size that saved it. The same dict serves the ``torch.optim`` adapter's
``state_dict`` (one entry per parameter, as ``torch.optim`` keeps it) and, through
:func:`state_dict` / :func:`load_state_dict`, the functional API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from ..config import DashConfig
from ..plan import ADAMW
from ..state import mark_static

GROUP_FIELDS = ("A", "Gt", "M")


def param_entries(state: TensorDict) -> dict[str, dict]:
    """This rank's part of the state as one entry per parameter name (see the module doc).

    The tensors are views of the live state, as in ``torch.optim``'s ``state_dict``: DCP
    saves them without a copy and loads into them in place."""
    plan, shard = state["plan"], state["shard"]
    entries: dict[str, dict] = {
        p.name: {
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
            "batch_dims": p.batch_dims,
            "step": state["step"],
            "skipped": state["skipped"],
        }
        for p in plan.params
    }
    for i, row, col, g, pos in shard.block_origins(plan):
        entries[plan.params[i].name][_block_key(shard, i, row, col, g)] = _block_views(state, shard.local, g, pos)
    for i, p in enumerate(shard.local.params):
        if p.kind == ADAMW and "adamw" in state.keys():
            for name in ("m", "v"):
                local = state["adamw", name][p.flat_offset : p.flat_offset + p.numel].view(p.shape)
                entries[p.name][_vector_key(shard, i, name)] = _as_global(shard, plan.params[i], local)
    return entries


def load_param_entries(state: TensorDict, entries: Mapping, where: str = "load_state_dict") -> TensorDict:
    """A new state laid out like ``state`` (this rank's blocks) holding the entries' values.

    ``entries`` maps each parameter name to its entry, from any world size (exact blocks). Every
    entry is checked first (a block or tensor missing, of another shape or dtype, step
    counters that disagree raise ``ValueError`` naming it); ``state`` is never modified and the
    new state shares no memory with ``entries``.
    """
    plan, shard, local = state["plan"], state["shard"], state["shard"].local
    if not isinstance(entries, Mapping):
        raise ValueError(f"{where}: expected a dict of per-parameter entries, got {type(entries).__name__}")
    for p in plan.params:
        entry = entries.get(p.name)
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: the checkpoint has no state for parameter {p.name!r}")
        if "shape" not in entry or "step" not in entry:
            raise ValueError(
                f"{where}: the checkpoint's state for parameter {p.name!r} is not a dash_fn state "
                f"(keys {sorted(entry)})"
            )
        if list(entry["shape"]) != list(p.shape):
            raise ValueError(
                f"{where}: parameter {p.name!r} has shape {p.shape} "
                f"but {tuple(entry.get('shape', ()))} in the checkpoint"
            )
        if entry.get("dtype") != str(p.dtype).removeprefix("torch."):
            raise ValueError(
                f"{where}: parameter {p.name!r} has dtype {p.dtype} but {entry.get('dtype')} in the checkpoint"
            )
        if entry.get("batch_dims", 0) != p.batch_dims:
            raise ValueError(
                f"{where}: parameter {p.name!r} has batch_dims {p.batch_dims} "
                f"but {entry.get('batch_dims', 0)} in the checkpoint"
            )
    steps = {
        p.name: _tensor(entries[p.name], "step", (), torch.int64, f"{where}: parameter {p.name!r}") for p in plan.params
    }
    first = plan.params[0].name
    for name, t in steps.items():
        if not torch.equal(t, steps[first]):
            raise ValueError(
                f"{where}: parameter {name!r} is at step {int(t)} but {first!r} at {int(steps[first])}; "
                "one state steps them together"
            )
    new = state.exclude("config", "plan", "shard").clone()
    copies = [(new["step"], steps[first])]  # (destination in the new state, source), all checked before any copy
    copies.append(
        (new["skipped"], _tensor(entries[first], "skipped", (), torch.int64, f"{where}: parameter {first!r}"))
    )
    for i, row, col, g, pos in shard.block_origins(plan):
        name = plan.params[i].name
        key = _block_key(shard, i, row, col, g)
        block = entries[name].get(key)
        if not isinstance(block, Mapping):
            raise ValueError(
                f"{where}: the checkpoint lacks block {key!r} of parameter {name!r} "
                "(saved with another block_size or fsdp_blocks?)"
            )
        for field, view in _block_views(new, local, g, pos).items():
            copies.append(
                (view, _tensor(block, field, tuple(view.shape), view.dtype, f"{where}: parameter {name!r} {key}"))
            )
    for i, p in enumerate(local.params):
        if p.kind == ADAMW and "adamw" in new.keys():
            for field in ("m", "v"):
                view = new["adamw", field][p.flat_offset : p.flat_offset + p.numel].view(p.shape)
                key = _vector_key(shard, i, field)
                source = _local_rows(shard, i, plan.params[i], entries[p.name].get(key))
                copies.append(
                    (view, _tensor({key: source}, key, tuple(view.shape), view.dtype, f"{where}: parameter {p.name!r}"))
                )
    for view, source in copies:
        view.copy_(source)
    return mark_static(
        new.set_non_tensor("config", state["config"]).set_non_tensor("plan", plan).set_non_tensor("shard", shard)
    )


def state_dict(state: TensorDict) -> dict:
    """The functional state as a DCP-ready dict: ``{"config": fields, "state": entries}``.

    Save it with ``torch.distributed.checkpoint.save`` (every rank calls it); see
    :func:`load_state_dict` for the way back, at any world size."""
    return {"config": dataclasses.asdict(state["config"]), "state": param_entries(state)}


def load_state_dict(state: TensorDict, saved: Mapping) -> TensorDict:
    """The state of a :func:`state_dict`, laid out like ``state`` (a fresh ``init`` on this
    rank: its world size may differ from the one that saved).

    Typical use: ``sd = dash_fn.state_dict(state); dcp.load(sd, checkpoint_id=path);
    state = dash_fn.load_state_dict(state, sd)``. A saved config that differs from the
    state's in any field raises ``ValueError`` naming the field, before anything is read.
    """
    from ..checkpoint import CONFIG_FIELDS

    if not isinstance(saved, Mapping) or not isinstance(saved.get("config"), Mapping) or "state" not in saved:
        raise ValueError("load_state_dict: expected the dict of dash_fn.state_dict, with 'config' and 'state'")
    config: DashConfig = state["config"]
    for name in CONFIG_FIELDS:
        found = saved["config"].get(name, getattr(DashConfig(), name))
        if found != getattr(config, name):
            raise ValueError(
                f"load_state_dict: config.{name} is {getattr(config, name)!r} here but {found!r} in the checkpoint"
            )
    return load_param_entries(state, saved["state"])


def _block_key(shard, i: int, row: int, col: int, g: int) -> str:
    """A block by the rows and columns it covers (so another block size never reuses a key)."""
    group = shard.local.groups[g]
    prefix = f"shard_{shard.rows[i][shard.rank][0]}_" if getattr(shard, "mode", "exact") == "local" else ""
    return f"{prefix}rows_{row}_{row + group.rows}_cols_{col}_{col + group.cols}"


def _vector_key(shard, i: int, name: str) -> str:
    if getattr(shard, "mode", "exact") == "local":
        return f"shard_{shard.rows[i][shard.rank][0]}_{name}"
    return name


def _block_views(state: TensorDict, local, g: int, pos: int) -> dict[str, torch.Tensor]:
    """Views of the state of block ``pos`` of this rank's group ``g`` stack."""
    group = local.groups[g]
    views = {
        name: state["groups", str(g), name][pos] for name in GROUP_FIELDS if name in state["groups", str(g)].keys()
    }
    for side, letter in ((group.left, "L"), (group.right, "R")):
        if side is not None:
            factors = state["factors", str(side.stack)]
            views[letter] = factors["F"][side.offset + pos]
            views[f"{letter}bar"] = factors["Fbar"][side.offset + pos]
            views[f"{letter}_fallbacks"] = factors["fallbacks"][side.offset + pos]
    return views


def _as_global(shard, whole, local: torch.Tensor) -> torch.Tensor:
    """AdamW moments of one parameter as the checkpoint keeps them: under FSDP2 (exact
    blocks) a DTensor of the parameter's shape placed like it, else as they are."""
    if shard.kind != "fsdp" or shard.mode == "local" or shard.world_size == 1:
        return local
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor import DTensor, Shard

    mesh = DeviceMesh.from_group(_resolve_process_group(shard.group_name), local.device.type)
    stride = torch.empty(whole.shape, device="meta").stride()
    return DTensor.from_local(local, mesh, (Shard(0),), run_check=False, shape=torch.Size(whole.shape), stride=stride)


def _local_rows(shard, i: int, whole, value):
    """This rank's rows of a saved AdamW moment: a DTensor's local piece, a whole tensor's slice."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local()
    if (
        shard.kind == "fsdp"
        and shard.mode == "exact"
        and isinstance(value, torch.Tensor)
        and tuple(value.shape) == tuple(whole.shape)
    ):
        lo, hi = shard.rows[i][shard.rank]
        return value.reshape(whole.view)[lo:hi].reshape(shard.local.params[i].shape)
    return value


def _tensor(entry: Mapping, key: str, shape: tuple, dtype: torch.dtype, where: str) -> torch.Tensor:
    x = entry.get(key)
    if not isinstance(x, torch.Tensor):
        raise ValueError(
            f"{where}: lacks tensor {key!r}" if x is None else f"{where}: {key!r} is a {type(x).__name__}, not a tensor"
        )
    if tuple(x.shape) != shape or x.dtype != dtype:
        raise ValueError(
            f"{where}: {key!r} has shape {tuple(x.shape)} and dtype {x.dtype}, expected {shape} and {dtype}"
        )
    return x
