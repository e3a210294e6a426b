"""``init``: the optimizer state as one TensorDict of stacked blocks (docs/ALGORITHM.md 3.4)."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import torch
from tensordict import TensorDict

from .config import DashConfig
from .distributed import make_fsdp_shard, make_shard, process_group_info
from .distributed.fsdp import check_dtensors, row_layout
from .distributed.layout import Layout, read_layout
from .inputs import check_params, flatten
from .plan import Plan, make_plan
from .preconditioners import UNITS, config_products, resolve_solver, unit_for
from .roots import prepare, start_vectors, uses_start_vectors
from .roots.matmul import LOW, device_refusal, has_tensor_cores
from .schedule import SCHEDULE_KEY, stagger_tables, staggers
from .storage import stored_dtype
from .strategy import for_device

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

    from .distributed import FsdpShard, Shard


def init(
    params, config: DashConfig = DashConfig(), process_group=None, batch_dims: Mapping[str, int] | None = None
) -> TensorDict:
    """Create the DASH state for ``params`` (a Mapping[str, Tensor] or a TensorDict).

    ``batch_dims={name: k}`` declares that the leading k dims of a parameter index independent
    matrices (mixture-of-experts weights, attention heads): an (E, m, n) parameter declared
    with k = 1 is E matrices of (m, n), each with its own blocks and factors, in the same
    stacks as every other block of its shape (the update is bitwise that of E separate
    parameters). Undeclared parameters of more than 2 dims are viewed as (first dim, rest)
    and get a warning saying so, except conv kernels (every dim after the second <= 11).

    With a ``torch.distributed`` ``process_group`` of W ranks, the state holds only this
    rank's share of the blocks (``dash_fn.distributed``) and ``dash_fn.step`` gathers
    the other ranks' directions itself; every rank must call ``init`` and ``step`` with the
    same params, grads (all-reduced), config and lr.

    DTensor parameters (FSDP2's ``fully_shard``, tensor parallelism's ``parallelize_module``,
    HSDP, or these together on a mesh of up to 3 dims: ``dash_fn.distributed.layout``) need no
    ``process_group``: the state holds the blocks this rank owns (``dash_fn.distributed.fsdp``),
    and ``step`` takes and returns the DTensors (or their local pieces). ``config.fsdp_blocks``
    picks exact blocks (as one process, the default), blocks cut at tensor-parallel edges
    ("aligned": as one process would cut each tensor-parallel piece) or blocks cut at every
    piece's edges ("local": no communication; results depend on the layout).

    Layout (all tensors in the plan's dtype, on the params' device, except where the config's
    storage dtypes narrow F, Fbar, Gt or A: ``dash_fn.storage``):

        step                      int64 0-d, the number of steps taken
        skipped                   int64 0-d, steps skipped for non-finite gradients (DashConfig.skip_nonfinite)
        groups/<g>/Gt, A, M       per block group (N, r, c): gradient EMA (if beta_G > 0),
                                  grafting moment, momentum (if mu > 0)
        factors/<k>/F, Fbar       per factor stack (K, b, b): factors and their inverse roots
        factors/<k>/fallbacks     int64 (K,), per factor: refreshes that failed and kept the old root
        start_vectors/<b>         (b, k) power-iteration start vectors, when the solver scales by PI
        schedule/<k>/phase, slices  int64 (K,), (<= f, m): the staggered schedule's tables (dash_fn.schedule)
        adamw/m, v                flat moments of the vectors under AdamW
        config, plan, shard       non-tensor data: the DashConfig, the blocking plan of all
                                  params, and this rank's share of its blocks (everything at W = 1)

    Matrix parameters cost 6 floats per entry at mu = 0 (factors 2, roots 2, Gt 1, A 1).

    Args:
        params: the parameters by name: a Mapping[str, Tensor] (``dict(model.named_parameters())``)
            or a TensorDict, floating point, on one device; or DTensors (FSDP2, tensor parallel).
        config: the hyper-parameters; their layout fields fix the state's shapes.
        process_group: a ``torch.distributed`` group whose ranks share the blocks (DDP), or None.
        batch_dims: for each named parameter, how many leading dims index independent matrices.

    Returns:
        The state: a TensorDict laid out as above, on the params' device.

    Raises:
        TypeError: ``config`` is not a DashConfig, a parameter is not a floating-point tensor,
            ``batch_dims`` is not a mapping, or DTensors come with a ``process_group``.
        ValueError: a name appears twice, ``batch_dims`` names a missing parameter or an
            impossible count, or a DTensor's piece is not the one its placements give.
    """
    if not isinstance(config, DashConfig):
        raise TypeError(f"init: config must be a DashConfig, got {type(config).__name__}")
    _, names, tensors = flatten(params, "params")
    check_params(names, tensors)
    if len(set(names)) != len(names):
        raise ValueError("init: params names a parameter twice")
    sharded = check_dtensors(names, tensors)
    specs = [(n, tuple(x.shape), x.dtype) for n, x in zip(names, tensors)]
    batch_dims = check_batch_dims(batch_dims, specs)
    _warn_about_mixed_precision(specs)
    if not sharded:
        device = tensors[0].device
        _check_precision(config, device)
        return make_state(specs, config, device, *process_group_info(process_group), batch_dims=batch_dims)
    if process_group is not None:
        raise TypeError("init: params are DTensors, whose DeviceMesh names the ranks; pass process_group=None")
    dtensors = cast("list[DTensor]", tensors)  # check_dtensors found every param a DTensor
    layout = read_layout(names, dtensors, batch_dims)
    device = dtensors[0].to_local().device
    _check_precision(config, device)
    return make_state(specs, config, device, sharding="fsdp", batch_dims=batch_dims, pieces=layout)


def make_state(
    specs,
    config: DashConfig,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    group_name: str | None = None,
    sharding: str = "replicated",
    batch_dims: Mapping[str, int] | None = None,
    pieces: Layout | None = None,
) -> TensorDict:
    """The initial state for parameters given as (name, shape, dtype), for one rank of W whose
    parameters are whole (``sharding="replicated"``) or DTensor pieces (``"fsdp"``): as
    ``pieces`` places them, by default FSDP2's row shards over W ranks."""
    tiles = None
    if pieces is not None and config.fsdp_blocks == "aligned" and pieces.tiles:
        tiles = {name: t for (name, _, _), t in zip(specs, pieces.tiles)}
        if all(t == (1, 1) for t in tiles.values()):
            warnings.warn(
                'fsdp_blocks="aligned" found no parameter that tensor parallelism cuts into equal bands (tensor-'
                'parallel dims: mesh dims named "tp", or where some parameter is replicated and others are not), '
                'so its blocks are the exact ones; name the mesh dim "tp" if it is one',
                stacklevel=3,
            )
    plan = make_plan(specs, config.block_size, config.one_dim, batch_dims, config.thin_ratio, tiles)
    shard: Shard | FsdpShard
    if sharding == "fsdp":
        pieces = pieces or row_layout(plan, rank, world_size, group_name)
        shard = make_fsdp_shard(plan, pieces, config.fsdp_blocks == "local", config.one_dim)
    else:
        shard = make_shard(plan, rank, world_size, group_name)
    layout = {**_layout(shard.local, config, device), **constants(plan, shard, config, device)}
    state = TensorDict(layout, batch_size=[], device=device)
    strategy = for_device(device)
    prepare(config, resolve_solver(config, strategy), strategy)
    return mark_static(
        state.set_non_tensor("config", config).set_non_tensor("plan", plan).set_non_tensor("shard", shard)
    )


def mark_static(state: TensorDict) -> TensorDict:
    """Mark every tensor of a state as a static address for torch.compile, and return it.

    The step updates the state's tensors in place, and CUDA graphs (``mode="reduce-overhead"``)
    skip a graph that mutates inputs whose addresses may change from call to call; Dynamo marks
    ``torch.optim`` optimizers' state static by itself, a TensorDict it cannot know about. The
    mark is unguarded: a new state (another address) re-records the CUDA graph, it does not
    recompile. States made by ``init``, ``load_state`` and ``load_state_dict`` come marked.

    Args:
        state: a state made by ``init`` (or loaded).

    Returns:
        The same TensorDict, its tensors marked.
    """
    for x in state.exclude("config", "plan", "shard").values(include_nested=True, leaves_only=True):
        torch._dynamo.mark_static_address(x, guard=False)
    return state


def check_batch_dims(batch_dims: Mapping[str, int] | None, specs) -> dict[str, int]:
    """The declared batch dims, checked against the parameters; one warning per undeclared
    parameter of more than 2 dims that is not recognisably a conv kernel."""
    if batch_dims is not None and not isinstance(batch_dims, Mapping):
        raise TypeError(f"init: batch_dims must map parameter names to integers, got {type(batch_dims).__name__}")
    batch_dims = dict(batch_dims or {})
    shapes = {name: shape for name, shape, _ in specs}
    for name, k in batch_dims.items():
        if name not in shapes:
            raise ValueError(
                f"init: batch_dims names {name!r}, which is not a parameter (parameters: {sorted(shapes)[:8]}...)"
            )
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < max(len(shapes[name]), 1):
            raise ValueError(
                f"init: batch_dims[{name!r}] must be an integer in [0, {max(len(shapes[name]) - 1, 0)}] "
                f"for shape {shapes[name]}, got {k!r}"
            )
    for name, shape, _ in specs:
        squeezed = [d for d in shape if d != 1]
        if name not in batch_dims and len(squeezed) > 2 and not all(d <= 11 for d in squeezed[2:]):
            warnings.warn(
                f"parameter {name!r} of shape {tuple(shape)} "
                f"is viewed as one ({squeezed[0]}, {math.prod(squeezed[1:])}) matrix; "
                "if its leading dims index independent matrices (experts, heads), declare them, so that each gets "
                f"its own factors: batch_dims={{{name!r}: 1}} in dash_fn.init, or in dash_fn.DASH a param group of "
                'its own with "batch_dims": 1 (e.g. {"params": [...], "batch_dims": 1})',
                stacklevel=3,
            )
    return batch_dims


def _layout(plan: Plan, config: DashConfig, device: torch.device) -> dict:
    def zeros(*shape, key=None):
        dtype = plan.dtype if key is None else stored_dtype(config, key, plan.dtype)
        return torch.zeros(shape, dtype=dtype, device=device)

    groups = {}
    slots = unit_for(config).group_slots(config)
    for g, group in enumerate(plan.groups):
        shape = (group.count, group.rows, group.cols)
        entry = {slot: zeros(*shape, key=slot) for slot in slots}
        if config.mu > 0:
            entry["M"] = zeros(*shape)
        groups[str(g)] = entry
    factors = {}
    for k, stack in enumerate(plan.factors):
        eye = torch.eye(stack.size, dtype=stored_dtype(config, "Fbar", plan.dtype), device=device)
        factors[str(k)] = {
            "F": zeros(stack.count, stack.size, stack.size, key="F"),
            "Fbar": eye.repeat(stack.count, 1, 1),  # roots start at I (contiguous even when empty)
            "fallbacks": torch.zeros(stack.count, dtype=torch.int64, device=device),
        }
    layout = {
        "step": torch.zeros((), dtype=torch.int64, device=device),
        "skipped": torch.zeros((), dtype=torch.int64, device=device),
        "groups": groups,
        "factors": factors,
    }
    if plan.adamw_numel:
        layout["adamw"] = {"m": zeros(plan.adamw_numel), "v": zeros(plan.adamw_numel)}
    return layout


# state entries derived from config and plan, never stored
CONSTANTS = ("start_vectors", SCHEDULE_KEY, *(key for unit in UNITS.values() for key in unit.constant_keys))


def constants(plan: Plan, shard, config: DashConfig, device: torch.device) -> dict:
    """The state's constant entries (:data:`CONSTANTS`) for a rank's ``shard`` of ``plan``:
    power-iteration start vectors when the solver scales by PI, the staggered schedule's
    tables, and the preconditioner's own (:meth:`Preconditioner.constants`). Made by ``init``
    and again on every load, for the target's config and device."""
    local = shard.local
    found = {}
    if uses_start_vectors(config, resolve_solver(config, for_device(device))):
        sizes = sorted({stack.size for stack in local.factors})
        found["start_vectors"] = {str(b): start_vectors(b, config, local.dtype, device) for b in sizes}
    if staggers(config):
        found[SCHEDULE_KEY] = stagger_tables(plan, shard, config.inv_root_freq, device)
    return {**found, **unit_for(config).constants(plan, shard, config, device)}


def _warn_about_mixed_precision(specs) -> None:
    """One state dtype serves all parameters (their blocks share stacks): float64 if any is."""
    wide = [name for name, _, dtype in specs if dtype == torch.float64]
    if wide and len(wide) < len(specs):
        narrow = next(name for name, _, dtype in specs if dtype != torch.float64)
        warnings.warn(
            f"params mix float64 ({wide[0]!r}) with lower precision ({narrow!r}): blocks of one shape share a stack, "
            "so the whole state is kept in float64; give the float64 parameters their own state (or param group) "
            "to keep the others' state in float32",
            stacklevel=3,
        )


_log = logging.getLogger("dash_fn")
_noticed: set[tuple[str, str]] = set()  # (device, reason) of the fallback notices already given


def _check_precision(config: DashConfig, device: torch.device) -> None:
    """Take the device's verdict on 16-bit products (once; :func:`dash_fn.roots.matmul.device_refusal`)
    and act on it: "auto" on a device that refuses them falls back to float32 with one notice;
    an explicit 16-bit precision there is an error now rather than mid-training. Warn where an
    explicit precision is emulated: its numerics at float32 speed, never what someone choosing
    16 bits or TF32 for speed wants. ("auto" never emulates: it picks float32 where the device
    has no faster form.)"""
    refusal = device_refusal(device) if has_tensor_cores(device) else None
    if refusal:
        if config.precision == "auto" and unit_for(config).auto_precision != "float32":
            if (str(device), refusal) not in _noticed:
                _noticed.add((str(device), refusal))
                _log.warning(
                    "precision='auto' on %s multiplies in float32: %s (pass precision='float32' to silence this)",
                    device,
                    refusal,
                )
        elif config.precision in LOW and device.type != "cpu":  # the simulated CPU emulates instead
            raise ValueError(
                f"init: precision={config.precision!r} needs 16-bit products with float32 results, which {device} "
                f"cannot run: {refusal}; use precision='auto' (float32 here) or 'float32'"
            )
    products = config_products(config, device)
    if products.kernel == "emulated":
        warnings.warn(
            f"precision={config.precision!r} on {device.type}: this device has no {config.precision} matrix unit "
            "that torch can use, so the products' operands are rounded and multiplied in float32 (the numerics "
            f"of {config.precision}, no speed-up); use precision='auto' or 'float32' here for speed",
            stacklevel=3,
        )
