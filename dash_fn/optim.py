"""``DASH``: the ``torch.optim.Optimizer`` adapter over :func:`dash_fn.init` and :func:`dash_fn.step`.

One functional state per param group. A group's hyper-parameters live in its dict, as in
``torch.optim`` (``lr`` plus every :class:`DashConfig` field), so schedulers, per-group
settings and ``state_dict()["param_groups"]`` work unchanged; each step rebuilds the group's
DashConfig from its dict. Parameters are named as ``model.named_parameters()`` names them
when the optimizer is given names (as ``torch.optim`` accepts), else by their index in the
group ("0", "1", ...); errors use those names.

The state of a group lives in ``optimizer.state[first parameter of the group]`` as
``{"dash": TensorDict, "step": int}``; ``step`` counts the group's steps on the host, skipped
or not (the state's ``step + skipped``), and picks each step's refresh flag
(:func:`dash_fn.is_refresh_step`), so eager and compiled steps on every device follow one
schedule with no device read (the staggered schedule, the default, takes no flag: one compiled
graph; with ``inv_root_warmup`` it takes one). A step skipped for
non-finite gradients does not advance the state's own counter (its bias corrections), and on a
periodic refresh step it still refreshes the roots, from the factors it left unchanged
(:mod:`dash_fn.guard`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping
from copy import deepcopy
from numbers import Real

import torch

from .checkpoint import CONFIG_FIELDS, check_layout, load_param_entries, param_entries, settled_nesterov, with_config
from .config import DashConfig
from .distributed import process_group_info
from .foreign import FOREIGN, unknown_option_message
from .plan import ADAMW
from .preconditioners import resolve_solver
from .schedule import is_refresh_step
from .state import init
from .step import step as functional_step
from .strategy import for_device

# the logger of the compile notice: getLogger("dash_fn").setLevel(logging.ERROR) silences it
_log = logging.getLogger(__name__)
_compile_notice_given = False  # the notice is said once per process, not once per optimizer

# what a param group may hold: torch.optim's keys, the lr, the DashConfig fields, batch dims
GROUP_KEYS = ("params", "param_names", "lr", "batch_dims", *CONFIG_FIELDS)


class DASH(torch.optim.Optimizer):
    """DASH (block Shampoo with stacked blocks) as a ``torch.optim`` optimizer.

    ``DASH(params, lr=1e-3, compile=False, process_group=None, **config_fields)``: ``params`` is an iterable of
    tensors or of param-group dicts, as for any ``torch.optim`` optimizer; ``config_fields``
    are ``DashConfig`` fields (``block_size``, ``solver``, ``weight_decay``, ...), the
    defaults of every group, which a group dict may override (``lr`` and any field).

    ``step(closure=None)`` runs ``dash_fn.step`` once per group and writes the new values
    into the parameters. A parameter whose ``.grad`` is None is skipped: its value and every
    slice of state it owns (its blocks' ``Gt``, ``A``, ``M``, its factors, roots and fallback
    counters, its AdamW ``m``, ``v``) stay bitwise as they were. What the group shares still
    moves: its step counter (the group's bias corrections use it, so a parameter skipped for
    k steps resumes at the group's t, not at its own count as in ``torch.optim``). The skip
    is exact but not free: the group steps with zero gradients for those parameters and then
    restores them, so keep frozen parameters out of the optimizer. A group whose gradients
    are all None is skipped entirely, counter included.

    ``compile=True`` (or a dict of ``torch.compile`` keyword arguments) runs
    ``torch.compile(dash_fn.step, fullgraph=True)``, built once per optimizer, with ``lr``
    passed as a 0-d tensor, so schedulers never recompile. Each group has one graph under the
    staggered schedule (the default), or two under the periodic one (or with ``inv_root_warmup``),
    a plain step and a refresh step picked on the host (``refresh=`` of ``dash_fn.step``), with no data-dependent
    control flow; the parameters and the state's tensors, which the step updates in place, are
    static addresses, so ``compile={"mode": "reduce-overhead"}`` captures each
    step in a CUDA graph (with a matmul solver: eigh syncs, and is refused there). (Dynamo caches
    graphs, and counts its ``recompile_limit``, per code object: each group and kind of step
    gets a copy of its own, so any number of groups of different shapes compile.)

    ``process_group`` (a ``torch.distributed`` group, e.g. ``dist.group.WORLD`` under DDP)
    shards every group's state across its ranks (``dash_fn.distributed``): each rank
    keeps and refreshes its share of the blocks and the step gathers the directions. Every
    rank must step with the same (all-reduced) gradients, as DDP provides. Parameters sharded
    by FSDP2's ``fully_shard`` or tensor parallelism (DTensors) need no process group: each
    rank steps the blocks of its pieces (``dash_fn.distributed.fsdp``; ``fsdp_blocks`` picks
    exact or piece-local blocks).

    ``state_dict()`` / ``load_state_dict()`` use ``torch.optim``'s layout and load with
    ``torch.load(weights_only=True)``: see ``state_dict``. With a process group each
    rank's dict holds its share, and the dicts of W ranks load at any W' (each rank takes the
    blocks it owns there): through ``torch.distributed.checkpoint`` (the user guide's
    "torch.distributed, FSDP2, tensor parallel and DCP").

    Args:
        params: an iterable of tensors, of (name, tensor) pairs, or of param-group dicts.
        lr: the learning rate of every group that does not set its own; a float or a tensor.
        compile: False, True, or a dict of ``torch.compile`` keyword arguments.
        process_group: a ``torch.distributed`` group whose ranks share the blocks (DDP), or None.
        **config_fields: ``DashConfig`` fields, the defaults of every group.

    Raises:
        TypeError: an unknown keyword, a ``compile`` that is neither a bool nor a dict, or a
            group that is not a dict of tensors.
        ValueError: an invalid ``lr`` or config field, a parameter in two groups, or a
            group's ``batch_dims`` that its parameters cannot have.
    """

    def __init__(
        self,
        params,
        lr: float | torch.Tensor = 1e-3,
        *,
        compile: bool | Mapping = False,
        process_group=None,
        **config_fields,
    ):
        unknown = set(config_fields) - set(CONFIG_FIELDS)
        if unknown:
            listed = "its options are lr, compile, process_group and the fields of help(dash_fn.DashConfig)"
            raise TypeError(
                unknown_option_message("DASH", unknown, ("lr", "compile", "process_group", *CONFIG_FIELDS), listed)
            )
        if not isinstance(compile, (bool, Mapping)):
            raise TypeError(
                f"DASH: compile must be a bool or a dict of torch.compile arguments, got {type(compile).__name__}"
            )
        _check_lr(lr, "DASH")  # before the base class looks at params, as torch.optim's optimizers do
        _warn_if_adam_eps(config_fields, "DASH")
        # no "momentum" (nor "betas") among the defaults: a scheduler that cycles momentum by
        # default (OneCycleLR, CyclicLR) then refuses DASH at its construction, naming
        # cycle_momentum, instead of changing a key DASH never reads
        defaults = {"lr": lr, **dataclasses.asdict(DashConfig(**config_fields))}
        self._compile = dict(compile) if isinstance(compile, Mapping) else compile
        self._compiled_steps: dict[tuple[bool | None, str], Callable] = {}
        process_group_info(process_group)  # a bad group fails here, not at the first step
        self._process_group = process_group
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Add a group; its keys, lr, config and batch dims are checked before it is added (a
        bad one is not). Keys: ``params``, ``lr``, any DashConfig field, and ``batch_dims``
        (an int: the leading dims of each of the group's parameters that index independent
        matrices, e.g. 1 for mixture-of-experts weights (E, m, n); see ``dash_fn.init``).

        Args:
            param_group: a dict with ``params`` and any of the keys above.

        Raises:
            TypeError: an unknown key, or ``params`` that are not tensors.
            ValueError: an invalid ``lr``, config field or ``batch_dims``, or a parameter
                that is already in another group.
        """
        if not isinstance(param_group, Mapping):
            raise TypeError(f"param group must be a dict, got {type(param_group).__name__}")
        unknown = set(param_group) - set(GROUP_KEYS)
        if unknown:
            listed = "a group takes params, param_names, lr, batch_dims and the fields of help(dash_fn.DashConfig)"
            raise TypeError(unknown_option_message("param group", unknown, GROUP_KEYS, listed))
        merged = {**self.defaults, **param_group}
        _check_lr(merged["lr"], "param group")
        _warn_if_adam_eps(param_group, "param group")
        group_config(merged, "param group")
        k = param_group.get("batch_dims", 0)
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"param group: batch_dims must be an integer >= 0, got {k!r}")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for name, p in zip(_names(group), group["params"]):
            if k and k >= p.ndim:
                self.param_groups.pop()
                raise ValueError(
                    f"param group: batch_dims={k} leaves no matrix in parameter {name!r} of shape {tuple(p.shape)}"
                )

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_compile": self._compile, "_process_group": self._process_group}

    def __setstate__(self, state: dict) -> None:
        self._compiled_steps = {}  # rebuilt on first use: compiled functions do not pickle
        state.setdefault("_process_group", None)  # pickled before process groups existed
        super().__setstate__(state)

    @torch.no_grad()
    def step(self, closure=None):
        """One DASH step for every group that has a gradient.

        Args:
            closure: a callable that recomputes the loss (its gradients too), or None.

        Returns:
            The closure's loss, or None without a closure.

        Raises:
            RuntimeError: a gradient is sparse.
            ValueError: a group's ``lr`` or config fields have become invalid.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            self._step_group(group, f"param_groups[{index}]")
        return loss

    def _step_group(self, group: dict, where: str) -> None:
        params = group["params"]
        grads = [p.grad for p in params]
        if all(g is None for g in grads):
            return
        if any(g is not None and g.is_sparse for g in grads):
            raise RuntimeError(f"{where}: DASH does not support sparse gradients")
        config = group_config(group, where)
        lr = group["lr"]
        _check_lr(lr, where)
        lr = lr.reshape(()) if isinstance(lr, torch.Tensor) else lr  # torch.optim's 1-element form
        names = _names(group)
        values = {n: p.detach() for n, p in zip(names, params)}
        entry = self.state.get(params[0])
        if not entry:  # never stepped (an empty dict is what a defaultdict look-up leaves)
            state, t = init(values, config, self._process_group, _batch_dims(group)), 0
        else:
            state, t = entry["dash"], entry["step"]
            if state["config"] != config:
                state = with_config(state, config, where)
        skipped = {n for n, g in zip(names, grads) if g is None}

        def untouched(state):  # what a parameter without a gradient must keep: its value, its state
            return [*owned_slices(state, skipped), *(values[n] for n in names if n in skipped)]

        kept = [x.clone() for x in untouched(state)]
        refresh = is_refresh_step(config, t + 1)  # counted on the host: no device read on any device
        if self._compile is False:
            new, state = functional_step(values, _grads_of(names, params), state, lr=lr, refresh=refresh)
            for n, p in zip(names, params):
                p.copy_(new[n])
        else:
            _check_cuda_graph_solver(self._compile, config, state["step"].device, where)
            lr = (
                lr
                if isinstance(lr, torch.Tensor)
                else torch.full((), lr, dtype=torch.float64, device=state["step"].device)
            )
            # the parameters themselves, which Dynamo takes as static addresses (their detached
            # views are new tensors every step)
            state = self._compiled(refresh, where)(dict(zip(names, params)), _grads_of(names, params), state, lr)
        for view, old in zip(untouched(state), kept):
            view.copy_(old)
        self.state[params[0]] = {"dash": state, "step": t + 1}

    def skipped_steps(self) -> list[int]:
        """Per param group, the steps skipped because a gradient was not finite (a host read).

        Returns:
            One count per group, in the order of ``param_groups`` (0 for a group not yet stepped).
        """
        return [
            int(self.state[g["params"][0]]["dash"]["skipped"]) if self.state.get(g["params"][0]) else 0
            for g in self.param_groups
        ]

    def _compiled(self, refresh: bool | None, group: str = ""):
        """The compiled step that refreshes the roots (True) or does not (False), or the
        staggered schedule's one step (None), for one param group (``group`` names it)."""
        if (refresh, group) not in self._compiled_steps:
            global _compile_notice_given
            if not _compile_notice_given:  # said once per process: the first step compiles
                _compile_notice_given = True
                on_cpu = self.param_groups[0]["params"][0].device.type == "cpu"
                _log.warning(
                    "DASH(compile=...): the first step compiles the optimizer step (torch.compile, "
                    "fullgraph=True), which can take a minute on a cold cache; later steps reuse it.%s "
                    "Silence this with logging.getLogger('dash_fn').setLevel(logging.ERROR).",
                    " On a CPU whether it pays depends on the model (benchmarks/RESULTS.md, 'Where compiling pays "
                    "on a CPU': faster for tiny and for wide layers, slower for small transformers): time both on "
                    "yours. On accelerators the compiled step is the fast one."
                    if on_cpu
                    else "",
                )
            # dynamic=False: Dynamo caches graphs per function, so a second optimizer (another
            # model) would otherwise turn the plan's ints symbolic, which the step cannot trace
            options = {"dynamic": False, **({} if isinstance(self._compile, bool) else self._compile)}
            step = _own_code(_STEPS_INTO[refresh])  # per group: see _own_code
            self._compiled_steps[refresh, group] = torch.compile(step, fullgraph=True, **options)
        return self._compiled_steps[refresh, group]

    def state_dict(self) -> dict:
        """``torch.optim``'s layout: ``{"state": ..., "param_groups": [...]}``.

        ``param_groups`` holds each group's hyper-parameters (lr and the DashConfig fields) and
        its parameters' indices, as in ``torch.optim``. ``state`` maps each parameter's index
        to its share of its group's state, keyed by the global coordinates of its blocks
        (``dash_fn.checkpoint``): the same keys at every world size, so that
        ``torch.distributed.checkpoint`` (``get_state_dict`` / ``set_state_dict``) saves it at
        W ranks and loads it at W'. Primitives and tensors only, so
        ``torch.load(weights_only=True)`` reads it. The tensors are the live state's, as in
        ``torch.optim``: save the dict before the next step.

        Returns:
            ``{"state": {index: entry}, "param_groups": [group, ...]}``.
        """
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        groups: list[dict] = []
        state: dict = {}
        index_of: dict[int, int] = {}
        start = 0
        for group in self.param_groups:
            params = group["params"]
            # one index per distinct tensor, numbered as torch.optim numbers them (a tensor listed twice
            # in a group: the index of its last listing)
            index_of.update({id(p): i for i, p in enumerate(params, start) if id(p) not in index_of})
            hyper = {k: v for k, v in group.items() if k != "params"}
            groups.append({**hyper, "params": [index_of[id(p)] for p in params]})
            entry = self.state.get(params[0]) if params else None
            if entry:
                entries = param_entries(entry["dash"])
                for name, p in zip(_names(group), params):
                    state.setdefault(index_of[id(p)], entries[name])
            start += len(params)
        # what others keep in optimizer.state under keys that are not parameters, kept as torch.optim keeps it
        state.update((k, v) for k, v in self.state.items() if not isinstance(k, torch.Tensor))
        state_dict = {"state": state, "param_groups": groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            state_dict = post_hook(self, state_dict) or state_dict
        return state_dict

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a ``state_dict()``, as ``torch.optim`` does: the saved hyper-parameters
        replace the groups' (schedulers rely on it), and the states go to the parameters' device.

        The checkpoint must fit this optimizer: as many groups, each with as many parameters of
        the same shapes and dtypes, and the same layout fields (``block_size``, ``one_dim``,
        whether ``beta_G`` and ``mu`` are zero). Everything is checked and every state built
        before anything is replaced, so an error (``ValueError`` naming the first mismatch)
        leaves the optimizer as it was. The states never share memory with ``state_dict``.
        Another optimizer's state_dict (a group holding ``betas``, ``amsgrad``, ``foreach``,
        Muon's or Distributed Shampoo's options...) is refused, with state or without: its
        ``eps`` and ``weight_decay`` would mean something else here.

        Args:
            state_dict: a dict made by ``state_dict()`` (possibly loaded from a file).

        Raises:
            ValueError: the dict does not fit this optimizer (groups, parameters, layout), or
                is another optimizer's.
        """
        state_dict = dict(state_dict)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = pre_hook(self, state_dict) or state_dict
        groups, entries, others = self._restored(state_dict)
        self.state = defaultdict(dict, others)
        for group in groups:
            if group["params"] and group["params"][0] in entries:
                self.state[group["params"][0]] = entries[group["params"][0]]
        self.param_groups = groups
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _restored_state(self, group: dict, config: DashConfig, found: list, where: str) -> dict:
        """One group's state entry from its parameters' saved entries."""
        params = group["params"]
        if len(found) != len(params):
            raise ValueError(f"{where}: the checkpoint has state for {len(found)} of its {len(params)} parameters")
        values = {n: p.detach() for n, p in zip(_names(group), params)}
        fresh = init(values, config, self._process_group, _batch_dims(group))
        state = load_param_entries(fresh, dict(zip(values, found)), where, into=True)
        return {"dash": state, "step": int(state["step"]) + int(state["skipped"])}  # the group's calls

    def _restored(self, state_dict) -> tuple[list[dict], dict, dict]:
        """The new param groups, state entries and non-parameter state (keys that are not
        parameter indices, which others put in ``optimizer.state``) of a state dict, checked
        against this optimizer."""
        if (
            not isinstance(state_dict, Mapping)
            or not isinstance(state_dict.get("param_groups"), list)
            or not isinstance(state_dict.get("state"), Mapping)
        ):
            raise ValueError(
                "load_state_dict: expected a dict with 'state' (a dict) and 'param_groups' (a list), "
                "as DASH.state_dict() returns"
            )
        saved_groups = deepcopy(state_dict["param_groups"])
        _refuse_foreign_groups(saved_groups)
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"load_state_dict: the checkpoint has {len(saved_groups)} param groups, "
                f"this optimizer {len(self.param_groups)}"
            )
        saved_state = dict(state_dict["state"])
        groups, entries, used = [], {}, set()
        for index, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            where = f"load_state_dict: param_groups[{index}]"
            params = group["params"]
            if not isinstance(saved, Mapping) or len(saved.get("params", ())) != len(params):
                raise ValueError(
                    f"{where} has {len(saved.get('params', ())) if isinstance(saved, Mapping) else '?'} parameters in "
                    f"the checkpoint, {len(params)} here"
                )
            # keys the checkpoint's group lacks keep this group's values (torch.optim's rule for keys
            # added since, e.g. foreach)
            new_group = settled_nesterov(
                {**group, **{k: v for k, v in saved.items() if k != "params"}, "params": params}
            )
            config = group_config(new_group, where)
            _check_lr(new_group["lr"], where)
            check_layout(config, group_config(group, where), where)
            found = [_tensor_counters(saved_state[key]) for key in saved.get("params", ()) if key in saved_state]
            used.update(saved.get("params", ()))
            if found:
                entries[params[0]] = self._restored_state(new_group, config, found, where)
            groups.append(new_group)
        others = {k: v for k, v in saved_state.items() if k not in used}
        strays = [k for k in others if isinstance(k, int)]
        if strays:
            raise ValueError(
                f"load_state_dict: the checkpoint has state under key {strays[0]!r}, which names no parameter of this "
                "optimizer (a state dict of another optimizer?)"
            )
        return groups, entries, others


def _refuse_foreign_groups(groups: list) -> None:
    """Raise ValueError on a group that holds another optimizer's options: it would bring its
    ``eps`` and ``weight_decay``, which mean something else here (a fresh AdamW's state_dict
    holds no state, so nothing else would tell)."""
    for index, group in enumerate(groups):
        if not isinstance(group, Mapping):
            continue
        # (momentum=None: DASH's own groups held it once, for the schedulers that cycle momentum)
        foreign = sorted(k for k in group if k in FOREIGN and not (k == "momentum" and group[k] is None))
        if foreign:
            raise ValueError(
                f"load_state_dict: param_groups[{index}] holds {', '.join(foreign)}: the state_dict of another "
                f"optimizer ({foreign[0]} is {FOREIGN[foreign[0]][0]} option), whose eps and weight_decay would "
                "mean something else here (DASH's eps is Shampoo's damping); load a DASH state_dict, or only the "
                "model's weights"
            )


def _step_into(values: dict, grads: dict, state, lr, refresh: bool | None):
    """:func:`dash_fn.step` that writes the new values into ``values`` (the parameters'
    storage) inside the compiled graph, where the copy fuses into the kernel that computes
    them: one pass over the parameters fewer than a copy after the call."""
    new, state = functional_step(values, grads, state, lr=lr, refresh=refresh)
    for n, x in values.items():
        x.copy_(new[n])
    return state


# one function per kind of step: Dynamo caches graphs per function, and its recompile limit
# then counts each kind apart
def _plain_step_into(values: dict, grads: dict, state, lr):
    return _step_into(values, grads, state, lr, False)


def _refresh_step_into(values: dict, grads: dict, state, lr):
    return _step_into(values, grads, state, lr, True)


def _staggered_step_into(values: dict, grads: dict, state, lr):
    return _step_into(values, grads, state, lr, None)


_STEPS_INTO = {False: _plain_step_into, True: _refresh_step_into, None: _staggered_step_into}


def _check_cuda_graph_solver(options, config: DashConfig, device: torch.device, where: str) -> None:
    """eigh cannot run under CUDA graphs: ``torch.linalg.eigh`` reads its error flags on the
    host once per call. Refused up front (on the accelerator strategy, the one CUDA graphs serve)."""
    options = {} if options is True else options
    cuda_graphs = options.get("mode") in ("reduce-overhead", "max-autotune") or (options.get("options") or {}).get(
        "triton.cudagraphs"
    )
    strategy = for_device(device)
    if cuda_graphs and not strategy.cpu_ops and resolve_solver(config, strategy) == "eigh":
        raise ValueError(
            f"{where}: solver='eigh' cannot run under CUDA graphs (compile mode {options.get('mode')!r}): "
            "torch.linalg.eigh reads its error flags on the host once per call; "
            "use a matmul solver (solver='ndb', 'cn' or 'chebyshev') or compile without CUDA graphs"
        )


def _own_code(fn):
    """A copy of ``fn`` with a code object of its own. Dynamo keeps its graph cache, and counts
    its ``recompile_limit`` (8), per code object: one copy per param group and kind of step
    gives each group its own graphs, so any number of groups of different shapes (per-layer
    learning rates) compile, and no group's call walks the other groups' guards."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def group_config(group: Mapping, where: str) -> DashConfig:
    """The DashConfig of a param group's dict (its DashConfig fields), validated."""
    try:
        return DashConfig(**{name: group[name] for name in CONFIG_FIELDS})
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}: {error}") from None


def owned_slices(state, names: set[str]) -> list[torch.Tensor]:
    """Views of every slice of state that the named parameters own alone (see ``DASH``):
    on this rank, the blocks of theirs it holds and their factors, and their AdamW moments."""
    shard = state["shard"]
    local = shard.local
    views = []
    for index, p in enumerate(local.params):
        if p.name not in names:
            continue
        for g, start, stop in shard.owned_ranges(index):
            views += [x[start:stop] for x in state["groups", str(g)].values()]
            group = local.groups[g]
            for side in group.factor_sides:  # block offset + i has its factors at side.offset + offset + i
                views += [
                    x[side.offset + start : side.offset + stop] for x in state["factors", str(side.stack)].values()
                ]
        if p.kind == ADAMW and p.numel:
            views += [x[p.flat_offset : p.flat_offset + p.numel] for x in state["adamw"].values()]
    return views


def _names(group: Mapping) -> list[str]:
    """The group's parameter names: from ``named_parameters()`` when given, else their indices."""
    names = group.get("param_names")
    if names and len(set(names)) == len(group["params"]):
        return list(names)
    return [str(i) for i in range(len(group["params"]))]


def _batch_dims(group: Mapping) -> dict[str, int]:
    k = group.get("batch_dims", 0)
    return {name: k for name in _names(group)} if k else {}


def _grads_of(names: list[str], params: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient; zeros stand in for a missing one (restored after the step)."""
    return {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in zip(names, params)}


def _tensor_counters(entry):
    """A saved parameter entry with its ``step`` / ``skipped`` counters as int64 0-d tensors,
    when they are Python numbers (as older ``torch.optim`` dicts hold ``step``) or 0-d tensors
    of another dtype (``torch.optim`` keeps ``step`` in float32)."""
    if not isinstance(entry, Mapping):
        return entry
    counters = {}
    for k in ("step", "skipped"):
        v = entry.get(k)
        other_tensor = isinstance(v, torch.Tensor) and v.ndim == 0 and v.dtype != torch.int64
        if isinstance(v, bool) or not (isinstance(v, Real) or other_tensor):
            continue
        counters[k] = torch.as_tensor(v).to(torch.int64)
        if counters[k] != v:
            raise ValueError(f"load_state_dict: a parameter's {k!r} must be a whole number, got {v!r}")
    return {**entry, **counters} if counters else entry


def _check_lr(lr, where: str) -> None:
    """A number >= 0 or a 1-element floating tensor (0-d or of shape (1,), as ``torch.optim`` takes it)."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError(f"{where}: Tensor lr must be 1-element, got a tensor of shape {tuple(lr.shape)}")
        if not lr.is_floating_point():
            raise ValueError(f"{where}: a tensor lr must be floating point, got dtype {lr.dtype}")
    elif not isinstance(lr, Real) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
        raise ValueError(f"{where}: lr must be a finite number >= 0 or a 1-element tensor, got {lr!r}")


def _warn_if_adam_eps(options: Mapping, where: str) -> None:
    """Warn when ``eps`` looks ported from Adam: DASH's ``eps`` is Shampoo's damping (default
    1e-10), Adam's epsilon is ``eps_graft`` (grafting) and ``adamw_eps`` (vectors). An ``eps`` of
    at least Adam's default 1e-8 set without either of those is most likely meant for Adam."""
    eps = options.get("eps")
    if isinstance(eps, (int, float)) and eps >= 1e-8 and "eps_graft" not in options and "adamw_eps" not in options:
        warnings.warn(
            f"{where}: eps={eps:g} sets Shampoo's damping (the roots of X + eps I; default {DashConfig.eps:g}), "
            "not Adam's epsilon as in torch.optim.AdamW: DASH's Adam epsilons are eps_graft (grafting) and "
            "adamw_eps (vectors), default 1e-8 each. To port AdamW(eps=...), pass eps_graft= and adamw_eps= "
            "instead; to mean the damping, pass either of them too (even at its default) and this warning goes away.",
            stacklevel=3,
        )
