"""Checkpoints of the DASH state: a versioned dict of primitives and tensors, and files of it.

The dict (format ``dash_fn.state``, version 2) holds nothing but strings, numbers, lists,
dicts and tensors, so ``torch.load(weights_only=True)`` reads it::

    {"format": "dash_fn.state", "version": 2,
     "config": {field: value, ...},                 # the DashConfig, as primitives
     "params": [[name, [shape...], "float32"], ...], # in init order: the plan is rebuilt from it
     "tensors": {"step": ..., "groups/0/A": ..., "factors/0/F": ..., "adamw/m": ...},
     "shard": {"rank": r, "world_size": W},         # only for one rank's share (W > 1)
     "checksum": int}                               # files only: CRC-32 of all the above

The power-iteration start vectors and the staggered schedule's tables are not stored: they are
fixed data, pure functions of the config and the plan (:func:`dash_fn.state.constants`),
regenerated on load for the target device (whose solver, under ``solver="auto"``, decides
whether start vectors are needed).

Loading checks everything before it builds anything (format, version, checksum, config,
parameters, and every tensor's key, shape and dtype against the layout ``init`` would make),
so a bad file or a mismatch raises a ``ValueError`` naming the first problem and yields nothing.
A distributed state is saved by each rank (one file each) and loads on the same rank of a
group of the same size; to move between world sizes, use the DCP dict of
:mod:`dash_fn.distributed.dcp`, which also serves FSDP2 states. Version 1 files (fallback
counters per stack, not per factor) still load: a stack's count goes to its first factor.
``torch.load`` does not verify its zip records' CRCs, hence the file checksum: without it a
flipped byte in tensor data loads silently.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zlib
from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDict

from .config import STORAGE_FIELDS, DashConfig
from .distributed import process_group_info
from .inputs import flatten
from .roots import resolve_solver
from .state import CONSTANTS, constants, make_state, mark_static
from .strategy import for_device

FORMAT = "dash_fn.state"
VERSION = 2
READABLE = (1, 2)
Placement = tuple[int, int, "str | None"]  # (rank, world size, process group name)
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(DashConfig))

ParamSpec = tuple[str, tuple[int, ...], torch.dtype]


def state_to_dict(state: TensorDict) -> dict:
    """The state as a checkpoint dict (no checksum). Its tensors are the state's own, not
    copies, as in ``torch.optim``'s ``state_dict``: save it before the next ``step``."""
    if not isinstance(state, TensorDict) or "plan" not in state.keys():
        raise TypeError("state_to_dict: state must be the TensorDict returned by dash_fn.init")
    if state["shard"].kind != "replicated":
        raise TypeError(
            "state_to_dict: an FSDP2 state is saved with torch.distributed.checkpoint through dash_fn.state_dict"
        )
    stored = state.exclude("config", "plan", "shard", *CONSTANTS)
    blob = {
        "format": FORMAT,
        "version": VERSION,
        "config": dataclasses.asdict(state["config"]),
        "params": [
            [p.name, list(p.shape), _dtype_name(p.dtype)] + ([p.batch_dims] if p.batch_dims else [])
            for p in state["plan"].params
        ],
        "tensors": {_join(key): x for key, x in stored.items(include_nested=True, leaves_only=True)},
    }
    shard = state["shard"]
    if shard.world_size > 1:
        blob["shard"] = {"rank": shard.rank, "world_size": shard.world_size}
    return blob


def read_config(blob, where: str = "checkpoint") -> DashConfig:
    """The DashConfig of a checkpoint dict, after checking its format and version."""
    _check_header(blob, where)
    config = blob.get("config")
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}: 'config' must be a dict, got {type(config).__name__}")
    for name in config:
        if name not in CONFIG_FIELDS:
            raise ValueError(f"{where}: config has unknown field {name!r} (written by another dash_fn version?)")
    # A field the writer did not know yet takes its default, the behaviour the writer had; but
    # for the refresh schedule, periodic in every writer that had no such field,
    # and thin blocks, two-sided in every writer before thin_ratio.
    try:
        return DashConfig(**{"refresh_schedule": "periodic", "thin_ratio": math.inf, **config})
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: invalid config: {error}") from None


def state_from_dict(
    blob,
    *,
    device: torch.device | str | None = None,
    params: Sequence[ParamSpec] | None = None,
    config: DashConfig | None = None,
    copy: bool = True,
    where: str = "checkpoint",
    process_group=None,
) -> TensorDict:
    """Rebuild the state from a checkpoint dict, on ``device`` (default CPU).

    ``params`` (name, shape, dtype) and ``config``, when given, must match the checkpoint's
    exactly (names in any order). ``copy=False`` may reuse the dict's tensors when they are
    already on ``device``; by default the state shares no memory with ``blob``, whose tensors
    may be another live state's (``step`` updates its state in place). A rank's share of a
    distributed state needs ``process_group``, of the size and rank it was saved from.
    """
    return _state_from_dict(blob, device, params, config, copy, where, process_group_info(process_group))


def _state_from_dict(blob, device, params, config, copy: bool, where: str, placement: Placement) -> TensorDict:
    device = torch.device("cpu" if device is None else device)
    _check_placement(blob, placement, where)
    saved_config = read_config(blob, where)
    saved_params, batch_dims = _read_params(blob.get("params"), where)
    if params is not None:
        _check_params(saved_params, params, where)
    if config is not None:
        _check_config(saved_config, config, where)
    template = _template(saved_params, saved_config, device, placement, batch_dims)
    tensors = _check_tensors(_upgrade_version_1(blob, template), template, where)
    state = TensorDict(
        constants(template["plan"], template["shard"], saved_config, device), batch_size=[], device=device
    )
    for key, _ in template.exclude(*CONSTANTS).items(include_nested=True, leaves_only=True):
        state.set(key, tensors[_join(key)].to(device, copy=copy))
    state = (
        state.set_non_tensor("config", saved_config)
        .set_non_tensor("plan", template["plan"])
        .set_non_tensor("shard", template["shard"])
    )
    return mark_static(state)


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


def save_state(path, state: TensorDict) -> None:
    """Write the state to ``path`` (a file name or a binary file object) with ``torch.save``.

    The file holds the checkpoint dict (see the module docstring) with CPU tensors and a
    CRC-32 checksum. A named file is written to a temporary name beside it and then renamed,
    so a crash mid-write never leaves a truncated checkpoint under ``path``.
    """
    blob = state_to_dict(state)
    blob["tensors"] = {key: x.detach().cpu() for key, x in blob["tensors"].items()}
    blob["checksum"] = _checksum(blob)
    atomic_save(blob, path)


def atomic_save(obj, path) -> None:
    """``torch.save(obj, path)`` that a crash cannot leave half-written under ``path``.

    The bytes go to a temporary file beside ``path``, are flushed to the disk, and the file is
    then renamed over ``path`` (an atomic step on POSIX file systems): a process killed at any
    moment leaves either the previous file or the new one. A killed writer may leave its
    temporary ``<path>.tmp-<pid>`` behind, never a partial ``path``. Use it for the adapter's
    checkpoints too: ``dash_fn.atomic_save({"model": ..., "opt": opt.state_dict()}, path)``.
    ``path`` may also be a binary file object, written as it is."""
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
    """Read a state written by :func:`save_state` (``torch.load(weights_only=True)``).

    A rank's share of a distributed state loads with ``process_group`` of the same size, on
    the rank that saved it (each rank saves and loads its own file).

    ``params`` (a Mapping[str, Tensor] or TensorDict, e.g. the model's parameters) and
    ``config``, when given, must match the checkpoint: a different name, shape, dtype or config
    field raises ``ValueError`` naming the first one. The state goes to ``device``, by default
    the device of ``params``, else the CPU. A truncated or corrupted file, another format or
    version raise ``ValueError`` too; nothing is returned then.
    """
    where = f"checkpoint {os.fspath(path)!r}" if isinstance(path, (str, os.PathLike)) else "checkpoint"
    specs = None
    if params is not None:
        _, names, tensors = flatten(params, "params")
        specs = [(n, tuple(x.shape), x.dtype) for n, x in zip(names, tensors)]
        if device is None and tensors:
            device = tensors[0].device
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load raises many types for a damaged file
        raise ValueError(
            f"{where} cannot be read; it is truncated, corrupted or not a torch.save file "
            f"({type(error).__name__}: {error})"
        ) from error
    _check_header(blob, where)
    if "checksum" not in blob:
        raise ValueError(f"{where} has no checksum; dash_fn.load_state reads files written by dash_fn.save_state")
    if blob["checksum"] != _checksum(blob, where):
        raise ValueError(f"{where} is corrupted: its checksum does not match its contents")
    return state_from_dict(
        blob, device=device, params=specs, config=config, copy=False, where=where, process_group=process_group
    )


def _join(key) -> str:
    return "/".join(key) if isinstance(key, tuple) else key


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_header(blob, where: str) -> None:
    if not isinstance(blob, Mapping) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, Mapping) else type(blob).__name__
        raise ValueError(f"{where} is not a dash_fn state (format {found!r}, expected {FORMAT!r})")
    if blob.get("version") not in READABLE:
        raise ValueError(f"{where} has format version {blob.get('version')!r}; this dash_fn reads versions {READABLE}")


def _checksum(blob: Mapping, where: str = "checkpoint") -> int:
    """CRC-32 of the metadata and of every tensor's key, dtype, shape and bytes."""
    tensors = blob.get("tensors")
    if not isinstance(tensors, Mapping) or not all(isinstance(x, torch.Tensor) for x in tensors.values()):
        raise ValueError(f"{where}: 'tensors' must be a dict of tensors")
    metadata: tuple = (blob["format"], blob["version"], blob.get("config"), blob.get("params"))
    if "shard" in blob:
        metadata += (blob["shard"],)
    crc = zlib.crc32(repr(metadata).encode())
    for key in sorted(tensors):
        x = tensors[key].detach().cpu().contiguous()
        crc = zlib.crc32(f"{key}:{x.dtype}:{tuple(x.shape)}".encode(), crc)
        crc = zlib.crc32(x.reshape(-1).view(torch.uint8).numpy(), crc)
    return crc


def _read_params(entries, where: str) -> tuple[list[ParamSpec], dict[str, int]]:
    """(name, shape, dtype) of the checkpoint's parameters, checked for form, and their
    declared batch dims (an optional fourth item)."""
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: 'params' must be a non-empty list of [name, shape, dtype]")
    specs, batch_dims = [], {}
    for entry in entries:
        ok = isinstance(entry, list) and len(entry) in (3, 4) and isinstance(entry[0], str)
        ok = ok and isinstance(entry[1], list) and all(isinstance(d, int) and d >= 0 for d in entry[1])
        ok = ok and (len(entry) == 3 or (isinstance(entry[3], int) and 0 < entry[3] < len(entry[1])))
        dtype = getattr(torch, entry[2], None) if ok and isinstance(entry[2], str) else None
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(
                f"{where}: bad parameter entry {entry!r}; expected [name, shape, floating dtype name(, batch dims)]"
            )
        specs.append((entry[0], tuple(entry[1]), dtype))
        if len(entry) == 4:
            batch_dims[entry[0]] = entry[3]
    return specs, batch_dims


def _check_params(saved: Sequence[ParamSpec], expected: Sequence[ParamSpec], where: str) -> None:
    """Raise on the first parameter that the model and the checkpoint disagree on."""
    saved_by_name = {name: (shape, dtype) for name, shape, dtype in saved}
    expected_names = {name for name, _, _ in expected}
    for name, shape, dtype in expected:
        if name not in saved_by_name:
            raise ValueError(f"{where} has no state for parameter {name!r}")
        saved_shape, saved_dtype = saved_by_name[name]
        if tuple(shape) != saved_shape:
            raise ValueError(
                f"{where}: parameter {name!r} has shape {tuple(shape)} but {saved_shape} in the checkpoint"
            )
        if dtype != saved_dtype:
            raise ValueError(f"{where}: parameter {name!r} has dtype {dtype} but {saved_dtype} in the checkpoint")
    for name, _, _ in saved:
        if name not in expected_names:
            raise ValueError(f"{where} has state for parameter {name!r}, which the model lacks")


def _check_config(saved: DashConfig, expected: DashConfig, where: str) -> None:
    for name in CONFIG_FIELDS:
        if getattr(saved, name) != getattr(expected, name):
            raise ValueError(
                f"{where}: config.{name} is {getattr(expected, name)!r} but {getattr(saved, name)!r} in the checkpoint"
            )


def _check_placement(blob, placement: Placement, where: str) -> None:
    """Raise unless the checkpoint was saved by the rank and world size it is loaded on."""
    rank, world_size, _ = placement
    saved = blob.get("shard", {"rank": 0, "world_size": 1})
    if not isinstance(saved, Mapping) or not all(isinstance(saved.get(k), int) for k in ("rank", "world_size")):
        raise ValueError(f"{where}: 'shard' must be a dict with integer 'rank' and 'world_size'")
    if (saved["rank"], saved["world_size"]) != (rank, world_size):
        described = "one process" if saved["world_size"] == 1 else f"rank {saved['rank']} of {saved['world_size']}"
        here = "one process" if world_size == 1 else f"rank {rank} of {world_size}"
        raise ValueError(
            f"{where} holds the optimizer state of {described} but is loaded on {here}; each rank loads its own "
            "file, with a process_group of the size it was saved with (resharding is not supported)"
        )


def _template(
    params: Sequence[ParamSpec], config: DashConfig, device: torch.device, placement: Placement, batch_dims
) -> TensorDict:
    """The state ``init`` would make, on the meta device (no memory): keys, shapes, dtypes, plan.

    ``auto`` is resolved for the target device first, as it decides whether start vectors exist.
    """
    layout_config = config.replace(solver=resolve_solver(config, for_device(device)))
    return make_state(list(params), layout_config, torch.device("meta"), *placement, batch_dims=batch_dims)


def _check_tensors(tensors, template: TensorDict, where: str) -> dict:
    """The checkpoint's tensors, after checking them against the template: every key, shape, dtype."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"{where}: 'tensors' must be a dict of tensors")
    expected = {
        _join(key): spec
        for key, spec in template.items(include_nested=True, leaves_only=True)
        if key[0] not in CONSTANTS
    }
    for key, spec in expected.items():
        if key not in tensors:
            raise ValueError(f"{where} lacks state tensor {key!r}")
        x = tensors[key]
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{where}: state entry {key!r} is a {type(x).__name__}, not a tensor")
        if x.shape != spec.shape or x.dtype != spec.dtype:
            raise ValueError(
                f"{where}: state tensor {key!r} has shape {tuple(x.shape)} and dtype {x.dtype}, "
                f"expected {tuple(spec.shape)} and {spec.dtype}"
            )
    for key in tensors:
        if key not in expected:
            raise ValueError(f"{where} has unexpected state tensor {key!r}")
    return dict(tensors)


def _upgrade_version_1(blob, template: TensorDict):
    """The tensors of a version-1 dict in today's layout: each stack's 0-d fallback count given
    to its first factor, and a zero ``skipped`` counter (version 1 never skipped a step)."""
    tensors = blob.get("tensors")
    if blob.get("version") != 1 or not isinstance(tensors, Mapping):
        return tensors
    tensors = dict(tensors)
    tensors.setdefault("skipped", torch.zeros((), dtype=torch.int64))
    for key, spec in template.items(include_nested=True, leaves_only=True):
        name = _join(key)
        old = tensors.get(name)
        if key[-1] == "fallbacks" and isinstance(old, torch.Tensor) and old.ndim == 0 and spec.ndim == 1:
            counts = torch.zeros(spec.shape, dtype=old.dtype)
            if spec.shape[0]:
                counts[0] = old
            tensors[name] = counts
    return tensors
