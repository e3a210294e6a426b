"""``step``: one DASH update on stacked blocks (docs/ALGORITHM.md section 4).

Data flows one way: grads -> plan.gather -> block stacks -> factor/moment updates -> roots
refreshed on schedule -> the preconditioner's directions, grafted -> momentum -> plan.scatter ->
new params. The preconditioner (:mod:`dash_fn.preconditioners`) and the device forms
(:mod:`dash_fn.forms`) are picked once, at the entry; the pipeline here is every one's.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from .config import DashConfig
from .distributed.fsdp import like, to_local
from .forms import DeviceForms, forms_for
from .grafting import GRAFTINGS
from .guard import announce_skip, lr_in_range
from .inputs import check_step_inputs, flatten, order_like_plan, rebuild
from .plan import ADAMW, EMPTY, SEGMENTS, Plan
from .preconditioners import Directions, Preconditioner, StepContext, config_products, unit_for
from .schedule import SCHEDULE_KEY, due_slice, is_refresh_step, periodic_due, staggered, takes_flag, warmup_due
from .strategy import for_device

__all__ = ["step", "is_refresh_step"]


def step(params, grads, state: TensorDict, *, lr, refresh: bool | None = None):
    """Apply one DASH step; returns ``(new_params, state)``.

    ``params`` and ``grads`` are Mapping[str, Tensor] or TensorDicts with the names, shapes,
    dtypes and device the state was initialized with; ``new_params`` comes back in the same
    kind of container. ``lr`` is a float or a 0-d tensor (a tensor never recompiles).

    ``refresh`` says whether this step recomputes the inverse roots under the periodic
    schedule: pass ``is_refresh_step`` of the step's number, counted on the host (two
    compiled graphs, a plain step and a refresh step, with no data-dependent control flow: what
    CUDA graphs capture). ``refresh=None`` reads the state's step counter on the host, which
    only eager CPU calls may do (a sync elsewhere; a compiled step would break its graph):
    elsewhere it raises ValueError. A step skipped by the non-finite guard still refreshes when
    ``refresh=True``, from the factors it left unchanged (``dash_fn.guard``). Under
    ``refresh_schedule="staggered"`` (the default) every step refreshes its slice of the roots
    (``dash_fn.schedule``) and takes no flag: ``refresh`` must be None (as
    ``is_refresh_step`` returns). With ``inv_root_warmup`` it takes the flag as the periodic
    schedule does: True on the warm-up steps, which refresh every root, False after (its slice).

    Buffer donation: the input params are never modified, but the state's tensors are updated
    in place and the same TensorDict is returned (like JAX's donated buffers), so memory holds
    one copy of the state. Clone the state first if you need the old one.

    A state made for a process group (``init(..., process_group=...)``) holds this rank's
    blocks: the step updates them and all-gathers every rank's directions (one collective),
    so every rank must call it, with the same params, grads, lr and refresh.

    A call whose inputs do not match the state raises ValueError/TypeError naming the first
    mismatch, before anything is modified.

    Args:
        params: the current parameters by name, as given to ``init``.
        grads: their gradients, the same names, shapes, dtypes and device.
        state: the state from ``init`` (or from the previous step); updated in place.
        lr: the learning rate, a float or a 0-d floating tensor. A tensor's value is checked
            where it lives, without a host read: a step whose tensor lr is NaN, infinite or
            negative changes nothing and is counted in ``state["skipped"]``, as a step with a
            non-finite gradient is (whatever ``skip_nonfinite`` says).
        refresh: the periodic schedule's flag (``is_refresh_step``); None under the staggered
            one, or its warm-up flag where it has a warm-up.

    Returns:
        ``(new_params, state)``: the updated parameters, in the container kind of ``params``,
        and the same state TensorDict.

    Raises:
        TypeError: ``params``, ``grads`` or ``state`` is not of the kinds above, or ``refresh``
            is neither None nor a bool.
        ValueError: a name, shape, dtype or device differs from the state's, ``lr`` is a
            float that is not a finite number >= 0 or is neither a float nor a 0-d floating
            tensor, or ``refresh`` does not fit the schedule.
    """
    if not isinstance(state, TensorDict) or "plan" not in state.keys():
        raise TypeError("step: state must be the TensorDict returned by dash_fn.init")
    config: DashConfig = state["config"]
    plan: Plan = state["plan"]
    shard = state["shard"]
    keys, names, param_list = flatten(params, "params")
    _, grad_names, grad_list = flatten(grads, "grads")
    ordered_params = order_like_plan(plan, names, [to_local(x) for x in param_list], "params")
    ordered_grads = order_like_plan(plan, grad_names, [to_local(x) for x in grad_list], "grads")
    check_step_inputs(shard.local, state, ordered_params, ordered_grads, lr, refresh)
    strategy = for_device(state["step"].device)
    flagged = takes_flag(config)
    if not flagged and refresh is not None:
        raise ValueError(
            f"step: refresh={refresh!r}, but the staggered schedule refreshes a slice of the roots on every "
            "step and takes no flag; pass refresh=None (dash_fn.is_refresh_step returns None for it), or choose "
            "refresh_schedule='periodic'"
        )
    if refresh is None and not strategy.host_reads and flagged:
        raise ValueError(
            f"step: refresh=None reads the step counter on the host, which the {strategy.name} strategy does not do "
            "(a device sync, or a break in a compiled graph); pass refresh=dash_fn.is_refresh_step(config, t) with the "
            "step's number t counted on the host"
        )
    with torch.no_grad():
        unit = unit_for(config)
        forms = forms_for(strategy, config_products(config, state["step"].device, shard.local.dtype))
        new = _apply(unit, forms, plan, shard, config, state, ordered_params, ordered_grads, lr, refresh)
        updated = dict(zip(plan.names, new))
    return rebuild(params, keys, [like(x, updated[n]) for n, x in zip(names, param_list)]), state


def _apply(
    unit: Preconditioner,
    forms: DeviceForms,
    plan: Plan,
    shard,
    config: DashConfig,
    state: TensorDict,
    params,
    grads,
    lr,
    refresh,
) -> list:
    """docs/ALGORITHM.md section 4 on this rank's blocks (``shard.local``): b-h, the directions
    brought to the parameters' rows (:mod:`dash_fn.distributed`), then a, i and j. Under the
    non-finite guard (:mod:`dash_fn.guard`) a step that is not all finite, or whose tensor
    ``lr`` is not a finite number >= 0, changes nothing but the roots of a refresh step."""
    local = shard.local
    blocks = shard.gradient_blocks(plan, grads)
    vectors = [x for p, x in zip(local.params, grads) if p.kind == ADAMW]
    products, guard = forms.products_and_guard(config, shard, vectors, blocks, lr_in_range(lr, state["step"].device))
    if guard.skipped:  # known on the host: nothing changes
        state["skipped"].add_(1)
        announce_skip(int(state["skipped"]))
        if refresh:  # the roots of the unchanged factors
            _refresh(StepContext(config, local, state, unit, forms, guard, state["step"], {}), refresh)
        return list(params)
    guard.count_skip(state["skipped"])
    blocks = [guard.masked(G, 0.0) for G in blocks]
    products = [[(side, guard.masked(X, -0.0)) for side, X in sides] for sides in products]
    grads = [guard.masked(g, 0.0) for g in grads]
    t = state["step"] + 1
    state["step"].copy_(guard.choose(t, state["step"]))
    ctx = StepContext(config, local, state, unit, forms, guard, t, _bias_corrections(config, local, t))
    _factor_emas(ctx, products)  # b
    _refresh(ctx, refresh)  # d
    directions = [_graft(ctx, local.groups[g], unit.direction(ctx, g, G)) for g, G in enumerate(blocks)]  # c, e-g, k
    if config.mu > 0:  # h
        directions = [_momentum(ctx, state["groups", str(g), "M"], P) for g, P in enumerate(directions)]
    comm_dtype = None if config.comm_dtype is None else getattr(torch, config.comm_dtype)
    updates = shard.parameter_updates(plan, directions, comm_dtype)
    new = _update_params(ctx, params, grads, updates, lr)  # a, i, j
    return [guard.choose(x, W) if x is not W else W for x, W in zip(new, params)]


def _bias_corrections(config: DashConfig, plan: Plan, t: torch.Tensor) -> dict:
    """This step's bias corrections ``1 - beta^t`` by use, 0-d tensors (None where unused):
    ``G`` of the gradient EMA, ``A`` of the grafting moment (its square root), ``m`` and ``v``
    of the AdamW vectors (``v``'s square root)."""
    wanted = {}
    if config.bias_correction and config.beta_G > 0:
        wanted["G"] = (config.beta_G, False)
    if config.bias_correction and not GRAFTINGS[config.grafting].sums:
        wanted["A"] = (config.beta_graft, True)
    if plan.adamw_numel:
        wanted["m"], wanted["v"] = (config.adamw_beta1, False), (config.adamw_beta2, True)
    found = dict.fromkeys(("G", "A", "m", "v"))
    if wanted:
        values = _corrections(
            t, [beta for beta, _ in wanted.values()], [root for _, root in wanted.values()], plan.dtype
        )
        found.update(zip(wanted, values))
    return found


@torch.library.custom_op("dash_fn::bias_corrections", mutates_args=())
def _corrections(t: torch.Tensor, betas: list[float], roots: list[bool], dtype: torch.dtype) -> torch.Tensor:
    """``1 - beta^t`` for each beta (its square root where ``roots`` says so), as one (n,) tensor.

    One opaque op for torch.compile's sake: inlined, each scalar ``pow`` was recomputed in every
    vector iteration of the Inductor kernels that read it (Inductor compiles its CPU kernels
    with libm's errno semantics, under which the compiler may not hoist the call), which
    doubled the time of the kernel of the moment EMAs (``benchmarks/plain_step.py --profile``).
    One call for all of them, because entering a custom op has a fixed cost."""
    corrections = [1 - beta ** t.to(dtype) for beta in betas]
    return torch.stack([c.sqrt() if root else c for c, root in zip(corrections, roots)])


@_corrections.register_fake
def _(t: torch.Tensor, betas: list[float], roots: list[bool], dtype: torch.dtype) -> torch.Tensor:
    return t.new_empty((len(betas),), dtype=dtype)


def _factor_emas(ctx: StepContext, products) -> None:
    """Factor EMAs (b): each group's products into its slice of the factor stacks."""
    for group, sides in zip(ctx.local.groups, products):
        for side, X in sides:
            F = ctx.state["factors", str(side.stack), "F"][side.offset : side.offset + group.count]
            ctx.forms.factor_ema(F, X, ctx.config.beta_LR, ctx.guard, ctx.local.dtype)


def _refresh(ctx: StepContext, refresh: bool | None) -> None:
    """New inverse roots (d) on the config's schedule (:mod:`dash_fn.schedule`): every stack on
    the caller's flag (a periodic refresh step, or a warm-up step), or with ``refresh=None``
    (host reads only: ``step`` checked it) where the counter says so; otherwise, staggered,
    the due slice of every stack."""
    config = ctx.config
    if config.start_prec_step == math.inf:
        return
    if refresh is None and takes_flag(config):  # host reads only: step checked it
        refresh = ctx.forms.holds(ctx.guard.flags((warmup_due if staggered(config) else periodic_due)(ctx.t, config)))
    if refresh:
        refresh_stack = _refresh_stack
    elif staggered(config):
        refresh_stack = _refresh_slice
    else:
        return

    def refresh_stacks() -> None:
        for k in range(len(ctx.local.factors)):
            refresh_stack(ctx, k)

    ctx.unit.refresh(ctx, bool(refresh), refresh_stacks)


def _refresh_stack(ctx: StepContext, k: int) -> None:
    """Every root of factor stack ``k`` from its factors (a skipped step's: unchanged)."""
    entry, stack, dtype = ctx.state["factors", str(k)], ctx.local.factors[k], ctx.local.dtype
    F, old = entry["F"].to(dtype), entry["Fbar"].to(dtype)
    p = _root_order(ctx.config, stack.order)
    roots, fell_back = _refresh_roots(ctx, F, old, p, stack)
    entry["Fbar"].copy_(roots)
    entry["fallbacks"].add_(fell_back)


def _refresh_slice(ctx: StepContext, k: int) -> None:
    """The staggered refresh of factor stack ``k``: the slice of blocks whose phase is due at
    step ``t`` gets new roots; nothing changes where no block is due, before start_prec_step,
    or on a skipped step."""
    stack, dtype = ctx.local.factors[k], ctx.local.dtype
    if stack.count == 0:
        return
    entry = ctx.state["factors", str(k)]
    positions, due = due_slice(ctx.state[SCHEDULE_KEY, str(k)], ctx.t, ctx.config)
    due = ctx.guard.flags(due)  # a skipped step refreshes nothing
    solved = ctx.forms.slice_to_solve(positions, due)
    if solved is None:
        return
    old = entry["Fbar"].index_select(0, solved).to(dtype)
    F = entry["F"].index_select(0, solved).to(dtype)
    p = _root_order(ctx.config, stack.order)
    roots, fell_back = _refresh_roots(ctx, F, old, p, stack, due)
    roots = ctx.forms.select(due[:, None, None], roots, old)
    entry["Fbar"].index_copy_(0, solved, roots.to(entry["Fbar"].dtype))
    fallbacks = entry["fallbacks"]
    fallbacks.index_copy_(0, solved, fallbacks.index_select(0, solved) + (fell_back & due))


def _refresh_roots(ctx: StepContext, F: torch.Tensor, old: torch.Tensor, p: int, stack, due=None):
    """The preconditioner's new roots (or bases) of factors ``F`` of a stack, keeping ``old``
    where a refresh fails (``due``: the blocks the caller keeps, None: all)."""
    start = _start_vectors(ctx, stack)
    return ctx.unit.solve(F, old, p, ctx.config, start, ctx.forms.strategy, ctx.forms.products, due)


def _root_order(config: DashConfig, order: int) -> int:
    """p of a stack's roots: the config's ``root_order`` for matrix blocks (the plan's order 4),
    2 for one-sided segments."""
    return config.resolved_root_order if order == 4 else order


def _start_vectors(ctx: StepContext, stack) -> torch.Tensor | None:
    """The power iteration's start vectors of a stack's block size (None for solvers without)."""
    return ctx.state["start_vectors", str(stack.size)] if "start_vectors" in ctx.state.keys() else None


def _graft(ctx: StepContext, group, directions: Directions) -> torch.Tensor:
    """A group's direction (f, g): the preconditioned one, where ready, with the norm of Adam's
    direction (or the fixed norm); elsewhere Adam's direction (under a fixed norm, with that
    norm). A preconditioner without a preconditioned direction and without a fixed norm gives
    its own (the eigenvalue-corrected one's)."""
    config = ctx.config
    D, U, ready = directions
    grafting = GRAFTINGS[config.grafting]
    if U is None and not grafting.fixed:
        return D
    norm, target = grafting.norm_and_target(ctx.forms.block_norm, config, group, D)
    if grafting.fixed and ready is not True:  # D: this step's own temporary
        D = D.mul_(target / (norm(D) + 1e-16))
    if U is None:
        return D
    P = U.mul_(target / (norm(U) + 1e-16))  # U: this step's own product
    if isinstance(ready, bool):
        return P if ready else D
    return ctx.forms.select(ready, P, D)


def _momentum(ctx: StepContext, M: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Heavy-ball momentum (h): M <- mu M + P; Nesterov returns P + mu M."""
    mu = ctx.config.mu
    M.mul_(ctx.guard.decay(mu, M.dtype)).add_(ctx.guard.masked(P, -0.0))
    return P + mu * M if ctx.config.nesterov is not False else M.clone()  # None: Nesterov's


def _update_params(ctx: StepContext, params, grads, updates, lr) -> list[torch.Tensor]:
    """Weight decay (a) and the update (i) for matrices; AdamW (j) for vectors (this rank's)."""
    config, local = ctx.config, ctx.local
    adamw_dirs = _adamw_directions(ctx, grads) if local.adamw_numel else None
    out = []
    for p, W, update in zip(local.params, params, updates):
        if p.kind == EMPTY or p.numel == 0:  # nothing of it on this rank
            out.append(W)
            continue
        if p.kind == ADAMW:
            assert adamw_dirs is not None  # a plan with ADAMW params has adamw_numel > 0
            update, decay = adamw_dirs[p.flat_offset : p.flat_offset + p.numel].reshape(p.shape), config.vector_decay
        else:
            decay = config.vector_decay if p.kind == SEGMENTS else config.weight_decay
        X = W.to(local.dtype)
        if decay:
            X = X * (1 - lr * decay)
        out.append(ctx.forms.descend(X, update, lr).to(W.dtype))
    return out


def _adamw_directions(ctx: StepContext, grads) -> torch.Tensor:
    """Bias-corrected Adam direction of all AdamW vectors, in one flat buffer (j)."""
    config, local, guard = ctx.config, ctx.local, ctx.guard
    g = torch.cat([x.reshape(-1) for p, x in zip(local.params, grads) if p.kind == ADAMW]).to(local.dtype)
    m, v = ctx.state["adamw", "m"], ctx.state["adamw", "v"]
    b1, b2 = config.adamw_beta1, config.adamw_beta2
    m.mul_(guard.decay(b1, local.dtype)).add_(guard.masked(g, -0.0), alpha=1 - b1)
    v.mul_(guard.decay(b2, local.dtype)).add_(g * g, alpha=1 - b2)
    denom = v.sqrt() / ctx.corrections["v"] + config.adamw_eps
    return m / denom / ctx.corrections["m"]
