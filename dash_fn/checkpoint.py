"""The state's one saved form: per parameter name and global block coordinates, never per rank.

Every way out of a state and back uses it: :func:`state_to_dict` / :func:`state_from_dict`
(the functional API, and ``torch.distributed.checkpoint``), the adapter's
``DASH.state_dict()`` (one entry per parameter index, as ``torch.optim`` keeps it), and the
files of :func:`save_state` / :func:`load_state`. A parameter's entry::

    {"shape", "dtype", "batch_dims"             the whole parameter's, checked on load
     "step", "skipped": int64 0-d,              the step counter and the skipped steps (equal for all)
     "rows_<a>_<b>_cols_<c>_<d>": {             a block by the rows and columns it covers in
         "A", "Gt", "M": (r, c)                 the parameter's 2-D view: grafting moment,
         "L", "Lbar", "L_fallbacks": (r, r), ()     gradient EMA, momentum (when kept),
         "R", "Rbar", "R_fallbacks": (c, c), ()},   factors, roots, failed refreshes
     "m", "v": the parameter's shape}           AdamW moments of a vector

DCP saves a state dict in which every key means the same thing on every rank: a plain tensor
under a key is one global value (written once), a DTensor one global tensor in pieces. Only
the blocks this rank holds appear in its entries, and every block is held by one rank, so a
state saved by W ranks loads on W' ranks: each asks for the blocks it owns there. AdamW moments
are plain tensors when parameters are whole (the same on every rank) and DTensors placed like
the parameter under FSDP2. Under ``fsdp_blocks="local"`` blocks exist per shard: their keys
start with ``shard_<first row>_`` and the state loads only at the world size that saved it.

The power-iteration start vectors and the staggered schedule's tables are not saved: they are
fixed data, pure functions of the config and the plan (:func:`dash_fn.state.constants`),
made again on load for the target device.

A file of :func:`save_state` holds ``{"format": "dash_fn.state", "version": 4, "config":
fields, "state": entries, "shard": {"rank", "world_size"} (W > 1), "checksum"}``: strings,
numbers, lists, dicts and tensors only, so ``torch.load(weights_only=True)`` reads it.
``torch.load`` does not verify its zip records' CRCs, hence the checksum (CRC-32 of every
entry): without it a flipped byte in tensor data loads silently. Loading checks everything
before it builds anything, so a bad file or a mismatch raises a ``ValueError`` naming the first
problem and yields nothing.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from .config import FIELDS, STORAGE_FIELDS, DashConfig
from .distributed import process_group_info
from .inputs import flatten
from .plan import ADAMW
from .state import CONSTANTS, constants, init, mark_static

FORMAT = "dash_fn.state"
VERSION = 4
CONFIG_FIELDS = FIELDS


# --- the entries ------------------------------------------------------------------------------


def param_entries(state: TensorDict) -> dict[str, dict]:
    """This rank's part of the state as one entry per parameter name (the module doc).

    The tensors are views of the live state, as in ``torch.optim``'s ``state_dict``: DCP
    saves them without a copy and loads into them in place; save them before the next step."""
    _check_state(state, "param_entries")
    plan, shard = state["plan"], state["shard"]
    entries: dict[str, dict] = {
        p.name: {
            "shape": list(p.shape),
            "dtype": _dtype_name(p.dtype),
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
                entries[p.name][shard.key_prefix(i) + name] = shard.global_moment(i, plan.params[i], local)
    return entries


def load_param_entries(
    state: TensorDict, entries: Mapping, where: str = "state_from_dict", *, into: bool = False, exact: bool = False
) -> TensorDict:
    """A state laid out like ``state`` (this rank's blocks) holding the entries' values.

    ``entries`` maps each parameter name to its entry, from any world size (exact blocks). Every
    entry is checked first (a block or tensor missing, of another shape or dtype, step
    counters that disagree raise ``ValueError`` naming it; with ``exact``, so does anything
    this rank would not have saved). By default ``state`` is not modified and the new state
    shares no memory with ``entries``; ``into=True`` writes into ``state`` itself (a fresh
    ``init`` the caller owns) and returns it.
    """
    plan, shard, local = state["plan"], state["shard"], state["shard"].local
    if not isinstance(entries, Mapping):
        raise ValueError(f"{where}: expected a dict of per-parameter entries, got {type(entries).__name__}")
    for p in plan.params:
        _check_entry(entries.get(p.name), p.name, tuple(p.shape), p.dtype, p.batch_dims, where)
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
    new = state if into else state.exclude("config", "plan", "shard").clone()
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
                key = shard.key_prefix(i) + field
                source = shard.local_moment(i, plan.params[i], entries[p.name].get(key))
                copies.append(
                    (view, _tensor({key: source}, key, tuple(view.shape), view.dtype, f"{where}: parameter {p.name!r}"))
                )
    if exact:
        _check_nothing_else(entries, param_entries(state), where)
    for view, source in copies:
        view.copy_(source)
    if into:
        return state
    return mark_static(
        new.set_non_tensor("config", state["config"]).set_non_tensor("plan", plan).set_non_tensor("shard", shard)
    )


# --- the functional API's dict (and DCP's) ---------------------------------------------------------


def state_to_dict(state: TensorDict) -> dict:
    """The state as ``{"config": fields, "state": entries}`` (the module doc), ready for
    ``torch.distributed.checkpoint.save`` (every rank calls it). Its tensors are the live
    state's: save it before the next ``step``. ``state_from_dict`` is the way back, at
    any world size.

    Args:
        state: the state to save.

    Returns:
        ``{"config": fields, "state": entries}``: primitives and tensors only.

    Raises:
        TypeError: ``state`` is not a DASH state.
    """
    _check_state(state, "state_to_dict")
    return {"config": dataclasses.asdict(state["config"]), "state": param_entries(state)}


def state_from_dict(state: TensorDict, saved: Mapping) -> TensorDict:
    """The state of a ``state_to_dict`` dict, laid out like ``state`` (a fresh ``init`` on
    this rank: its world size may differ from the one that saved). ``state`` is not modified.

    Typical use: ``sd = dash_fn.state_to_dict(state); dcp.load(sd, checkpoint_id=path);
    state = dash_fn.state_from_dict(state, sd)``. A saved config that differs from the
    state's in any field raises ``ValueError`` naming the field, before anything is read.

    Args:
        state: a state made by ``init`` on this rank, with the config the checkpoint was saved with.
        saved: a dict of ``state_to_dict``'s form, filled by ``torch.distributed.checkpoint.load``.

    Returns:
        A new state laid out like ``state``, holding the saved values.

    Raises:
        TypeError: ``state`` is not a DASH state.
        ValueError: the saved config, a parameter or a block differs from ``state``'s.
    """
    _check_state(state, "state_from_dict")
    if not isinstance(saved, Mapping) or not isinstance(saved.get("config"), Mapping) or "state" not in saved:
        raise ValueError("state_from_dict: expected the dict of dash_fn.state_to_dict, with 'config' and 'state'")
    _check_config(read_config(saved.get("config"), "state_from_dict"), state["config"], "state_from_dict")
    return load_param_entries(state, saved["state"])


# --- files -----------------------------------------------------------------------------------------


def save_state(path, state: TensorDict) -> None:
    """Write the state to ``path`` (a file name or a binary file object) with ``torch.save``.

    The file holds the state's entries (the module doc) as CPU tensors, its config and a CRC-32
    checksum. A named file is written to a temporary name beside it and then renamed, so a
    crash mid-write never leaves a truncated checkpoint under ``path``. A rank's share of a
    distributed state is one file per rank (each rank saves its own); under FSDP2, and to move
    between world sizes, use ``state_to_dict`` with ``torch.distributed.checkpoint``.

    Args:
        path: a file name (``str`` or ``os.PathLike``) or a binary file object.
        state: the state to save.

    Raises:
        TypeError: ``state`` is not a DASH state, or it is an FSDP2 state.
    """
    _check_state(state, "save_state")
    shard = state["shard"]
    if shard.kind != "replicated":
        raise TypeError(
            "save_state: an FSDP2 state is saved with torch.distributed.checkpoint through dash_fn.state_to_dict"
        )
    entries = _map_tensors(param_entries(state), lambda x: x.detach().cpu())
    blob: dict = {"format": FORMAT, "version": VERSION, "config": dataclasses.asdict(state["config"])}
    blob["state"] = entries
    if shard.world_size > 1:
        blob["shard"] = {"rank": shard.rank, "world_size": shard.world_size}
    blob["checksum"] = _checksum(blob)
    atomic_save(blob, path)


def atomic_save(obj, path) -> None:
    """``torch.save(obj, path)`` that a crash cannot leave half-written under ``path``.

    The bytes go to a temporary file beside ``path``, are flushed to the disk, and the file is
    then renamed over ``path`` (an atomic step on POSIX file systems): a process killed at any
    moment leaves either the previous file or the new one. A killed writer may leave its
    temporary ``<path>.tmp-<pid>`` behind, never a partial ``path``. Use it for the adapter's
    checkpoints too: ``dash_fn.utils.atomic_save({"model": ..., "opt": opt.state_dict()}, path)``.
    ``path`` may also be a binary file object, written as it is.

    Args:
        obj: anything ``torch.save`` takes.
        path: a file name, or a binary file object.
    """
    if not isinstance(path, (str, os.PathLike)):
        torch.save(obj, path)
        return
    temporary = f"{os.fspath(path)}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def load_state(path, *, params=None, config: DashConfig | None = None, device=None, process_group=None) -> TensorDict:
    """Read a state written by ``save_state`` (``torch.load(weights_only=True)``).

    A rank's share of a distributed state loads with ``process_group`` of the same size, on
    the rank that saved it (each rank saves and loads its own file).

    ``params`` (a Mapping[str, Tensor] or TensorDict, e.g. the model's parameters) and
    ``config``, when given, must match the checkpoint: a different name, shape, dtype or config
    field raises ``ValueError`` naming the first one. The state goes to ``device``, by default
    the device of ``params``, else the CPU. A truncated or corrupted file, another format or
    version raise ``ValueError`` too; nothing is returned then.

    Args:
        path: a file name or a binary file object written by ``save_state``.
        params: the parameters the state will step, checked against the checkpoint; optional.
        config: the config the state must have; optional.
        device: where the state's tensors go (default: the device of ``params``, else the CPU).
        process_group: the group of a distributed state, of the size it was saved at.

    Returns:
        The state, as ``init`` would lay it out, with the saved values.

    Raises:
        ValueError: the file is truncated, corrupted or of another format or version, or
            ``params``, ``config`` or the world size differ from the checkpoint's.
    """
    where = f"checkpoint {os.fspath(path)!r}" if isinstance(path, (str, os.PathLike)) else "checkpoint"
    expected = None
    if params is not None:
        _, names, tensors = flatten(params, "params")
        expected = {n: (tuple(x.shape), x.dtype) for n, x in zip(names, tensors)}
        if device is None and tensors:
            device = tensors[0].device
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types for a damaged file
        raise ValueError(
            f"{where} cannot be read; it is truncated, corrupted or not a torch.save file "
            f"({type(error).__name__}: {error})"
        ) from error
    if not isinstance(blob, Mapping) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, Mapping) else type(blob).__name__
        raise ValueError(f"{where} is not a dash_fn state (format {found!r}, expected {FORMAT!r})")
    if blob.get("version") != VERSION:
        raise ValueError(
            f"{where} has format version {blob.get('version')!r}; this dash_fn reads version {VERSION} "
            "(files of dash_fn's unreleased development versions do not load)"
        )
    if "checksum" not in blob:
        raise ValueError(f"{where} has no checksum; dash_fn.load_state reads files written by dash_fn.save_state")
    if blob["checksum"] != _checksum(blob, where):
        raise ValueError(f"{where} is corrupted: its checksum does not match its contents")
    _check_placement(blob, process_group_info(process_group), where)
    saved_config = read_config(blob.get("config"), where)
    if config is not None:
        _check_config(saved_config, config, where)
    entries = blob["state"]
    if expected is not None:  # the model's parameters, each against its entry, and none missing
        for name, (shape, dtype) in expected.items():
            _check_entry(entries.get(name), name, shape, dtype, None, where)
        for name in entries:
            if name not in expected:
                raise ValueError(f"{where} has state for parameter {name!r}, which the model lacks")
    specs = {name: _check_entry(entry, name, None, None, None, where) for name, entry in entries.items()}
    device = torch.device("cpu" if device is None else device)
    values = {name: torch.empty(shape, dtype=dtype, device=device) for name, (shape, dtype, _) in specs.items()}
    batch_dims = {name: b for name, (_, _, b) in specs.items() if b}
    fresh = init(values, saved_config, process_group, batch_dims)
    return load_param_entries(fresh, entries, where, into=True, exact=True)


# --- config and layout -----------------------------------------------------------------------------


def settled_nesterov(fields: Mapping) -> dict:
    """Config fields saved when ``nesterov`` was a bool beside ``mu = 0`` (its default was
    True, which changed nothing there): None, what it is now, as the run computed."""
    if fields.get("mu") == 0 and isinstance(fields.get("nesterov"), bool):
        return {**fields, "nesterov": None}
    return dict(fields)


def read_config(fields, where: str) -> DashConfig:
    """The DashConfig of saved fields: every field present, none unknown. A file written before
    ``precision`` replaced ``matmul_dtype`` (which rounded the matmul solvers' operands only)
    loads with that dtype as its precision, which now covers every large product; one written
    before ``inv_root_warmup`` loads without a warm-up, as it ran; one written while ``nesterov``
    was a bool beside ``mu = 0`` loads with None (:func:`settled_nesterov`)."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: 'config' must be a dict of DashConfig fields, got {type(fields).__name__}")
    if "matmul_dtype" in fields and "precision" not in fields:
        fields = {**{k: v for k, v in fields.items() if k != "matmul_dtype"}, "precision": fields["matmul_dtype"]}
    fields = settled_nesterov({"inv_root_warmup": 0, **fields})
    for name in fields:
        if name not in CONFIG_FIELDS:
            raise ValueError(f"{where}: config has unknown field {name!r} (written by another dash_fn version?)")
    for name in CONFIG_FIELDS:
        if name not in fields:
            raise ValueError(f"{where}: config lacks field {name!r} (written by another dash_fn version?)")
    try:
        return DashConfig(**fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: invalid config: {error}") from None


def with_config(state: TensorDict, config: DashConfig, where: str = "state") -> TensorDict:
    """The state under another config of the same layout: same tensors (not copies), the new
    config, start vectors and schedule tables made for it. Raises if ``config`` changes the layout."""
    check_layout(state["config"], config, where, found_in="the state")
    new = state.exclude("config", *CONSTANTS)
    new.update(constants(state["plan"], state["shard"], config, state["step"].device))
    return mark_static(new.set_non_tensor("config", config))


def check_layout(found: DashConfig, expected: DashConfig, where: str, found_in: str = "the checkpoint") -> None:
    """Raise unless two configs give the state the same tensors: the blocking (block_size,
    one_dim, thin_ratio), which optional moments exist (Gt iff beta_G > 0, M iff mu > 0) and
    the storage dtypes."""
    for name, f, e in (
        ("block_size", found.block_size, expected.block_size),
        ("one_dim", found.one_dim, expected.one_dim),
        ("thin_ratio", found.thin_ratio, expected.thin_ratio),
        *((name, getattr(found, name), getattr(expected, name)) for name in STORAGE_FIELDS),
        ("beta_G > 0", found.beta_G > 0, expected.beta_G > 0),
        ("mu > 0", found.mu > 0, expected.mu > 0),
        ("fsdp_blocks", found.fsdp_blocks, expected.fsdp_blocks),
    ):
        if f != e:
            raise ValueError(
                f"{where}: {name} is {e!r} here but {f!r} in {found_in}; it fixes the layout of the state, "
                "which therefore cannot serve this config"
            )


# --- checks and helpers ----------------------------------------------------------------------------


def _check_state(state, where: str) -> None:
    if not isinstance(state, TensorDict) or "plan" not in state.keys():
        raise TypeError(f"{where}: state must be the TensorDict returned by dash_fn.init")


def _check_entry(entry, name: str, shape, dtype, batch_dims, where: str):
    """A parameter's entry, checked for form and, where given, against the parameter's shape,
    dtype and batch dims; returns the saved ones."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: the checkpoint has no state for parameter {name!r}")
    if "shape" not in entry or "step" not in entry:
        raise ValueError(
            f"{where}: the checkpoint's state for parameter {name!r} is not a dash_fn state (keys {sorted(entry)})"
        )
    saved_shape = entry["shape"]
    dtype_name = entry.get("dtype")
    saved_dtype = getattr(torch, dtype_name, None) if isinstance(dtype_name, str) else None
    saved_batch_dims = entry.get("batch_dims", 0)
    if (
        not isinstance(saved_shape, list)
        or not all(isinstance(d, int) and d >= 0 for d in saved_shape)
        or not isinstance(saved_dtype, torch.dtype)
        or not saved_dtype.is_floating_point
        or not isinstance(saved_batch_dims, int)
    ):
        raise ValueError(f"{where}: parameter {name!r} has a malformed shape, dtype or batch_dims in the checkpoint")
    if shape is not None and tuple(saved_shape) != shape:
        raise ValueError(f"{where}: parameter {name!r} has shape {shape} but {tuple(saved_shape)} in the checkpoint")
    if dtype is not None and saved_dtype != dtype:
        raise ValueError(f"{where}: parameter {name!r} has dtype {dtype} but {saved_dtype} in the checkpoint")
    if batch_dims is not None and saved_batch_dims != batch_dims:
        raise ValueError(
            f"{where}: parameter {name!r} has batch_dims {batch_dims} but {saved_batch_dims} in the checkpoint"
        )
    return tuple(saved_shape), saved_dtype, saved_batch_dims


def _check_nothing_else(entries: Mapping, expected: Mapping, where: str, path: str = "") -> None:
    """Raise on the first key of ``entries`` (nested) that ``expected`` lacks."""
    for key, value in entries.items():
        if key not in expected:
            raise ValueError(f"{where}: unexpected entry {path + str(key)!r}")
        if isinstance(value, Mapping) and isinstance(expected[key], Mapping):
            _check_nothing_else(value, expected[key], where, f"{path}{key}/")


def _check_config(saved: DashConfig, expected: DashConfig, where: str) -> None:
    for name in CONFIG_FIELDS:
        if getattr(saved, name) != getattr(expected, name):
            raise ValueError(
                f"{where}: config.{name} is {getattr(expected, name)!r} here but {getattr(saved, name)!r} "
                "in the checkpoint"
            )


def _check_placement(blob, placement, where: str) -> None:
    """Raise unless the file was saved by the rank and world size it is loaded on."""
    rank, world_size, _ = placement
    saved = blob.get("shard", {"rank": 0, "world_size": 1})
    if not isinstance(saved, Mapping) or not all(isinstance(saved.get(k), int) for k in ("rank", "world_size")):
        raise ValueError(f"{where}: 'shard' must be a dict with integer 'rank' and 'world_size'")
    if (saved["rank"], saved["world_size"]) != (rank, world_size):
        described = "one process" if saved["world_size"] == 1 else f"rank {saved['rank']} of {saved['world_size']}"
        here = "one process" if world_size == 1 else f"rank {rank} of {world_size}"
        raise ValueError(
            f"{where} holds the optimizer state of {described} but is loaded on {here}; each rank loads its own "
            "file, with a process_group of the size it was saved with (to move between world sizes, use "
            "dash_fn.state_to_dict with torch.distributed.checkpoint)"
        )


def _checksum(blob: Mapping, where: str = "checkpoint") -> int:
    """CRC-32 of the metadata and of every tensor's key, dtype, shape and bytes."""
    if not isinstance(blob.get("state"), Mapping):
        raise ValueError(f"{where}: 'state' must be a dict of per-parameter entries")
    metadata: list[tuple[str, object]] = []
    tensors: list[tuple[str, torch.Tensor]] = []
    for key, value in _leaves(blob["state"]):
        (tensors if isinstance(value, torch.Tensor) else metadata).append((key, value))
    header = (blob.get("format"), blob.get("version"), blob.get("config"), blob.get("shard"), metadata)
    crc = zlib.crc32(repr(header).encode())
    for key, x in tensors:
        x = x.detach().cpu().contiguous()
        crc = zlib.crc32(f"{key}:{x.dtype}:{tuple(x.shape)}".encode(), crc)
        crc = zlib.crc32(x.reshape(-1).view(torch.uint8).numpy().data, crc)
    return crc


def _leaves(tree: Mapping, prefix: str = ""):
    """``(path, value)`` of every leaf of nested dicts, in key order."""
    for key in sorted(tree, key=str):
        value = tree[key]
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value


def _map_tensors(tree: Mapping, fn) -> dict:
    return {
        k: _map_tensors(v, fn) if isinstance(v, Mapping) else fn(v) if isinstance(v, torch.Tensor) else v
        for k, v in tree.items()
    }


def _block_key(shard, i: int, row: int, col: int, g: int) -> str:
    """A block by the rows and columns it covers (so another block size never reuses a key)."""
    group = shard.local.groups[g]
    return f"{shard.key_prefix(i)}rows_{row}_{row + group.rows}_cols_{col}_{col + group.cols}"


def _block_views(state: TensorDict, local, g: int, pos: int) -> dict[str, torch.Tensor]:
    """Views of the state of block ``pos`` of this rank's group ``g`` stack."""
    group = local.groups[g]
    entry = state["groups", str(g)]
    views = {name: entry[name][pos] for name in entry.keys()}  # the preconditioner's slots and M
    for side, letter in ((group.left, "L"), (group.right, "R")):
        if side is not None:
            factors = state["factors", str(side.stack)]
            views[letter] = factors["F"][side.offset + pos]
            views[f"{letter}bar"] = factors["Fbar"][side.offset + pos]
            views[f"{letter}_fallbacks"] = factors["fallbacks"][side.offset + pos]
    return views


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
