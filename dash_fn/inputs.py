"""Reading params/grads containers and checking them against the state, before anything moves.

``step`` validates everything here first, so a rejected call raises a clear error naming the
first mismatch and leaves params and state untouched. The checks read only metadata (names,
shapes, dtypes, devices), so they cost nothing on the device and trace under torch.compile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real

import torch
from tensordict import TensorDictBase

from .plan import Plan


def flatten(tree, what: str) -> tuple[list, list[str], list[torch.Tensor]]:
    """(keys, dotted names, tensors) of a Mapping[str, Tensor] or a (nested) TensorDict."""
    if isinstance(tree, TensorDictBase):
        items = [(k, v) for k, v in tree.items(include_nested=True, leaves_only=True)]
    elif isinstance(tree, Mapping):
        items = list(tree.items())
    else:
        raise TypeError(f"{what} must be a Mapping[str, Tensor] or a TensorDict, got {type(tree).__name__}")
    names, tensors = [], []
    for key, value in items:
        name = ".".join(key) if isinstance(key, tuple) else key
        if not isinstance(name, str):
            raise TypeError(f"{what}: keys must be strings, got {key!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{what}[{name!r}] must be a torch.Tensor, got {type(value).__name__}")
        names.append(name)
        tensors.append(value)
    return [k for k, _ in items], names, tensors


def rebuild(tree, keys: list, tensors: list[torch.Tensor]):
    """A container of the same kind as ``tree`` holding ``tensors`` under ``keys``."""
    if isinstance(tree, TensorDictBase):
        return tree.empty(recurse=True).update(dict(zip(keys, tensors)))
    return dict(zip(keys, tensors))


def check_params(names: list[str], tensors: list[torch.Tensor]) -> None:
    """What ``init`` accepts: named floating-point tensors on one device."""
    if not tensors:
        raise ValueError("init: params is empty; DASH needs at least one parameter")
    device = tensors[0].device
    for name, x in zip(names, tensors):
        if not x.is_floating_point():
            raise TypeError(f"init: params[{name!r}] has dtype {x.dtype}; DASH optimizes floating-point tensors only")
        if x.device != device:
            raise ValueError(
                f"init: params[{name!r}] is on {x.device} but params[{names[0]!r}] is on {device}; "
                "all must share one device"
            )


def _check_names(plan: Plan, names: list[str], what: str) -> None:
    expected = plan.names
    if tuple(names) == expected:
        return
    for name in expected:
        if name not in names:
            raise ValueError(f"step: {what} lacks parameter {name!r} that the state was initialized with")
    for name in names:
        if name not in expected:
            raise ValueError(f"step: {what} has parameter {name!r} that the state was not initialized with")
    if len(set(names)) != len(names):
        raise ValueError(f"step: {what} names a parameter twice")


def order_like_plan(plan: Plan, names: list[str], tensors: list[torch.Tensor], what: str) -> list[torch.Tensor]:
    """The tensors in the plan's canonical order (checking that the names match exactly)."""
    _check_names(plan, names, what)
    if tuple(names) == plan.names:
        return tensors
    by_name = dict(zip(names, tensors))
    return [by_name[name] for name in plan.names]


def check_step_inputs(local: Plan, state, params: list[torch.Tensor], grads: list[torch.Tensor], lr, refresh) -> None:
    """Raise on the first way params, grads, lr or refresh disagree with the state, whose
    ``local`` plan describes the tensors this rank holds (whole parameters, or FSDP2 shards)."""
    device = state["step"].device
    for p, param, grad in zip(local.params, params, grads):
        name = p.name
        if tuple(param.shape) != p.shape:
            raise ValueError(f"step: params[{name!r}] has shape {tuple(param.shape)}, the state expects {p.shape}")
        if param.dtype != p.dtype:
            raise ValueError(f"step: params[{name!r}] has dtype {param.dtype}, the state expects {p.dtype}")
        if tuple(grad.shape) != p.shape:
            raise ValueError(f"step: grads[{name!r}] has shape {tuple(grad.shape)}, the parameter has {p.shape}")
        if grad.dtype != param.dtype:
            raise ValueError(f"step: grads[{name!r}] has dtype {grad.dtype}, the parameter has {param.dtype}")
        for what, x in (("params", param), ("grads", grad)):
            if x.device != device:
                raise ValueError(f"step: {what}[{name!r}] is on {x.device}, the state is on {device}")
    for k, stack in enumerate(local.factors):
        shape = tuple(state["factors", str(k), "F"].shape)
        if shape != (stack.count, stack.size, stack.size):
            raise ValueError(
                f"step: state factor stack {k} has shape {shape}, the plan expects "
                f"{(stack.count, stack.size, stack.size)}"
            )
    if isinstance(lr, torch.Tensor):
        if lr.ndim != 0 or not lr.is_floating_point():
            raise ValueError(
                "step: lr must be a float or a 0-d floating tensor, "
                f"got a tensor of shape {tuple(lr.shape)} and dtype {lr.dtype}"
            )
    elif not isinstance(lr, Real) or isinstance(lr, bool):
        raise ValueError(f"step: lr must be a finite number >= 0 or a 0-d tensor, got {lr!r}")
    elif not torch.compiler.is_compiling() and not (math.isfinite(lr) and lr >= 0):  # type: ignore[operator]
        # a compiled step may see lr as a symbolic float, whose value is not known at trace time
        raise ValueError(f"step: lr must be a finite number >= 0 or a 0-d tensor, got {lr!r}")
    if refresh is not None and not isinstance(refresh, bool):
        raise TypeError(f"step: refresh must be None or a bool, got {type(refresh).__name__}")
