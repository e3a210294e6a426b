"""``step``: one DASH update on stacked blocks (docs/ALGORITHM.md section 4).

Data flows one way: grads -> plan.gather -> block stacks -> factor/moment updates -> roots
refreshed on schedule -> grafted Shampoo directions -> plan.scatter -> new params.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from .config import DashConfig
from .distributed.fsdp import like, to_local
from .forms import DeviceForms, forms_for
from .guard import Guard, announce_skip, lr_in_range
from .inputs import check_step_inputs, flatten, order_like_plan, rebuild
from .plan import ADAMW, EMPTY, SEGMENTS, Plan
from .roots import refresh_roots
from .roots.matmul import products_for
from .roots.scaling import root, spectral_norm_estimate
from .schedule import (
    DUE_BLOCKS_KEY,
    SCHEDULE_KEY,
    due_blocks,
    due_slice,
    has_root,
    is_refresh_step,
    periodic_due,
    warmup_due,
)
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
    schedule = config.refresh_schedule
    flagged = schedule == "periodic" or config.inv_root_warmup > 0  # the schedules whose steps take a flag
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
        forms = forms_for(
            strategy, products_for(config.precision, state["step"].device, shard.local.dtype, config.preconditioner)
        )
        new = _apply(forms, plan, shard, config, state, ordered_params, ordered_grads, lr, refresh)
        updated = dict(zip(plan.names, new))
    return rebuild(params, keys, [like(x, updated[n]) for n, x in zip(names, param_list)]), state


@dataclass(frozen=True)
class _Step:
    """What the operations of one step read: this rank's blocks (``local``, the shard's plan;
    the model's is needed only to gather and scatter), the forms the call runs
    (:mod:`dash_fn.forms`), the non-finite guard, the step number ``t`` (0-d, on the device)
    and its bias corrections."""

    config: DashConfig
    local: Plan
    state: TensorDict
    forms: DeviceForms
    guard: Guard
    t: torch.Tensor
    corrections: dict


def _apply(
    forms: DeviceForms, plan: Plan, shard, config: DashConfig, state: TensorDict, params, grads, lr, refresh
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
            _refresh(_Step(config, local, state, forms, guard, state["step"], {}), refresh)
        return list(params)
    guard.count_skip(state["skipped"])
    blocks = [guard.masked(G, 0.0) for G in blocks]
    products = [[(side, guard.masked(X, -0.0)) for side, X in sides] for sides in products]
    grads = [guard.masked(g, 0.0) for g in grads]
    t = state["step"] + 1
    state["step"].copy_(guard.choose(t, state["step"]))
    ctx = _Step(config, local, state, forms, guard, t, _bias_corrections(config, local, t))
    _factor_emas(ctx, products)  # b
    _refresh(ctx, refresh)  # d
    directions = []
    for g, G in enumerate(blocks):
        if config.preconditioner == "eigenvalue_corrected":
            directions.append(_corrected_direction(ctx, g, G))  # k
            continue
        Gt, D = forms.adam_direction(config, state["groups", str(g)], G, ctx.corrections, t, guard)  # c, e, f
        directions.append(_direction(ctx, g, Gt, D))  # g
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
    if config.bias_correction and config.grafting != "adagrad":
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


def _factor_emas(ctx: _Step, products) -> None:
    """Factor EMAs (b): each group's products into its slice of the factor stacks."""
    for group, sides in zip(ctx.local.groups, products):
        for side, X in sides:
            F = ctx.state["factors", str(side.stack), "F"][side.offset : side.offset + group.count]
            ctx.forms.factor_ema(F, X, ctx.config.beta_LR, ctx.guard, ctx.local.dtype)


def _refresh(ctx: _Step, refresh: bool | None) -> None:
    """New inverse roots (d) on the config's schedule (:mod:`dash_fn.schedule`): every stack on
    the caller's flag (a periodic refresh step, or a warm-up step), or with ``refresh=None``
    (host reads only: ``step`` checked it) where the counter says so; otherwise, staggered,
    the due slice of every stack."""
    config = ctx.config
    if config.start_prec_step == math.inf:
        return
    staggered = config.refresh_schedule == "staggered"
    if refresh is None and (not staggered or config.inv_root_warmup):  # host reads only: step checked it
        refresh = ctx.forms.holds(ctx.guard.flags((warmup_due if staggered else periodic_due)(ctx.t, config)))
    if refresh:
        refresh_stack = _refresh_stack
    elif staggered:
        refresh_stack = _refresh_slice
    else:
        return
    before = []
    if config.preconditioner == "eigenvalue_corrected" and config.beta_G > 0:
        before = _bases_before(ctx, every=bool(refresh))
    for k in range(len(ctx.local.factors)):
        refresh_stack(ctx, k)
    for g, blocks, old in before:
        _rotate_gradient_ema(ctx, g, blocks, old)


def _refresh_stack(ctx: _Step, k: int) -> None:
    """Every root of factor stack ``k`` from its factors (a skipped step's: unchanged)."""
    entry, stack, dtype = ctx.state["factors", str(k)], ctx.local.factors[k], ctx.local.dtype
    F, old = entry["F"].to(dtype), entry["Fbar"].to(dtype)
    p = _root_order(ctx.config, stack.order)
    roots, fell_back = _refresh_roots(ctx, F, old, p, stack)
    entry["Fbar"].copy_(roots)
    entry["fallbacks"].add_(fell_back)


def _refresh_slice(ctx: _Step, k: int) -> None:
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


def _refresh_roots(ctx: _Step, F: torch.Tensor, old: torch.Tensor, p: int, stack, due: torch.Tensor | None = None):
    """New roots (or bases) of factors ``F`` of a stack, keeping ``old`` where a refresh fails
    (``due``: the blocks the caller keeps, None: all)."""
    start = _start_vectors(ctx, stack)
    return refresh_roots(F, old, p, ctx.config, start, ctx.forms.strategy, ctx.forms.products, due)


def _bases_before(ctx: _Step, every: bool) -> list:
    """``[(g, blocks, bases)]``: for each group, the blocks this step may refresh (the
    staggered schedule's due blocks; None: all, as on a step that refreshes ``every`` root) and
    their bases before it, one per side (None for a side without a basis)."""
    found = []
    for g, group in enumerate(ctx.local.groups):
        blocks = None
        if ctx.config.refresh_schedule == "staggered" and not every:
            blocks = due_blocks(ctx.state[DUE_BLOCKS_KEY, str(g)], ctx.t, ctx.config)
        # (all of them: copied, as the refresh writes them in place)
        bases = [None if side is None else _bases(ctx, group, side, blocks) for side in (group.left, group.right)]
        found.append((g, blocks, [b if b is None or blocks is not None else b.clone() for b in bases]))
    return found


def _bases(ctx: _Step, group, side, blocks: torch.Tensor | None) -> torch.Tensor:
    """The group's stored ``Fbar`` (bases, or inverse roots) of ``blocks`` (None: all, a view)
    on one side."""
    bases = ctx.state["factors", str(side.stack), "Fbar"][side.offset : side.offset + group.count]
    return bases if blocks is None else bases.index_select(0, blocks)


def _rotate_gradient_ema(ctx: _Step, g: int, blocks: torch.Tensor | None, before: list) -> None:
    """The gradient EMA of a group's ``blocks`` (None: all) moved into their new bases (k):
    kept as ``Gt' = Q_L^T Gt Q_R``, it becomes ``Q_L'^T Q_L Gt' Q_R^T Q_R'``, one side at a
    time and only where that side's basis changed (elsewhere its bits stay)."""
    group, dtype = ctx.local.groups[g], ctx.local.dtype
    entry = ctx.state["groups", str(g), "Gt"]
    X = (entry if blocks is None else entry.index_select(0, blocks)).to(dtype)
    for is_left, side, old in ((True, group.left, before[0]), (False, group.right, before[1])):
        if side is None or old is None:
            continue
        new = _bases(ctx, group, side, blocks)
        changed = (new != old).flatten(1).any(1)
        Q_old, Q_new = old.to(dtype), new.to(dtype)
        rotate = ctx.forms.products.of("rotate")
        moved = rotate(Q_new.mT, rotate(Q_old, X)) if is_left else rotate(rotate(X, Q_old.mT), Q_new)
        X = ctx.forms.select(changed[:, None, None], moved, X)
    if blocks is None:
        entry.copy_(X)
    else:
        entry.index_copy_(0, blocks, X.to(entry.dtype))


def _root_order(config: DashConfig, order: int) -> int:
    """p of a stack's roots: the config's ``root_order`` for matrix blocks (the plan's order 4),
    2 for one-sided segments."""
    return config.resolved_root_order if order == 4 else order


def _start_vectors(ctx: _Step, stack) -> torch.Tensor | None:
    """The power iteration's start vectors of a stack's block size (None for solvers without)."""
    return ctx.state["start_vectors", str(stack.size)] if "start_vectors" in ctx.state.keys() else None


def _direction(ctx: _Step, g: int, Gt: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """For t >= s the grafted Shampoo direction (g) from the gradient EMA ``Gt`` and the Adam
    direction ``D`` (staggered: from each block's first refresh on); before, ``D``. Under a
    fixed norm (``grafting`` "rms" or "spectral") either has that norm."""
    config, local = ctx.config, ctx.local
    group = local.groups[g]
    norm, graft = _norm_and_target(ctx, group, D)
    s = config.start_prec_step
    # D is returned only before a block's first root: never under the periodic schedule from step 1
    if config.grafting in FIXED_NORMS and (s != 1 or config.refresh_schedule == "staggered"):
        D = D.mul_(graft / (norm(D) + 1e-16))  # D: this step's own temporary
    if s == math.inf:
        return D
    U, precondition = Gt, ctx.forms.products.of("precondition")
    if group.left is not None:
        U = precondition(_refreshed(ctx, group, group.left), U)
    if group.right is not None:
        U = precondition(U, _refreshed(ctx, group, group.right))
    if group.diagonal_dim is not None:  # a thin block's long side (docs/ALGORITHM.md 2.5)
        A = ctx.state["groups", str(g), "A"].to(local.dtype)
        U = U * _diagonal_root(A, group.diagonal_dim, config.resolved_root_order, config.eps, config.eps_rel)
    P = U.mul_(graft / (norm(U) + 1e-16))  # U: this step's own product
    if config.refresh_schedule == "staggered":  # a block's Adam direction until its first refresh
        side = group.factor_sides[0]
        ready = has_root(ctx.state[SCHEDULE_KEY, str(side.stack)], side.offset, group.count, ctx.t, config)
        return ctx.forms.select(ready[:, None, None], P, D)
    return P if s == 1 else torch.where(ctx.t >= s, P, D)


FIXED_NORMS = ("rms", "spectral")


def _refreshed(ctx: _Step, group, side) -> torch.Tensor:
    """The group's slice of a factor stack's refreshed matrices ``Fbar`` (inverse roots, or
    eigenbases under the eigenvalue-corrected preconditioner), widened to the state dtype
    (:mod:`dash_fn.storage`)."""
    return _bases(ctx, group, side, None).to(ctx.local.dtype)


def _corrected_direction(ctx: _Step, g: int, G: torch.Tensor) -> torch.Tensor:
    """The eigenvalue-corrected direction (k): Adam's direction of ``rot(G) = Q_L^T G Q_R``,
    with both moments kept in the eigenbases ``Q_L, Q_R`` of the block's factors (the gradient
    EMA moved into new bases where they change, :func:`_rotate_gradient_ema`), rotated back:
    ``Q_L [Gt_hat / (sqrt(A_hat) + eps)] Q_R^T``. A thin block's diagonal side and a one-sided
    segment's missing side are not rotated (their basis is I), as is every block before its
    first basis (its ``Fbar`` is still I: Adam's direction)."""
    group = ctx.local.groups[g]
    left = None if group.left is None else _refreshed(ctx, group, group.left)
    right = None if group.right is None else _refreshed(ctx, group, group.right)
    rotate = ctx.forms.products.of("rotate")
    if left is not None:
        G = rotate(left.mT, G)
    if right is not None:
        G = rotate(G, right)
    _, D = ctx.forms.adam_direction(ctx.config, ctx.state["groups", str(g)], G, ctx.corrections, ctx.t, ctx.guard)
    if left is not None:
        D = rotate(left, D)
    return D if right is None else rotate(D, right.mT)


def _norm_and_target(ctx: _Step, group, D: torch.Tensor):
    """The norm a block's direction is measured by and the value it is given (f, g): the
    Frobenius norm and Adam's ``||D||_F`` (Adam and AdaGrad grafting); the Frobenius norm and
    ``graft_rms sqrt(rows cols)`` (``"rms"``: that per-entry RMS); the spectral norm and
    ``graft_rms sqrt(max(rows, cols))`` (``"spectral"``: Muon's norm for a full-rank
    orthogonal direction, whose RMS is then graft_rms)."""
    config = ctx.config
    if config.grafting == "rms":
        return ctx.forms.block_norm, config.graft_rms * math.sqrt(group.rows * group.cols)
    if config.grafting == "spectral":
        return spectral_norm_estimate, config.graft_rms * math.sqrt(max(group.rows, group.cols))
    return ctx.forms.block_norm, torch.linalg.vector_norm(D, dim=(-2, -1), keepdim=True)


def _diagonal_root(A: torch.Tensor, dim: int, p: int, eps: float, eps_rel: float) -> torch.Tensor:
    """``(d + eps)^(-1/p)`` of the long side's diagonal factor d: the grafting moment summed
    over ``dim``, which is diag(G G^T)'s EMA (tall blocks; diag(G^T G)'s for wide ones) at the
    grafting moment's decay; 0 where ``d <= eps_rel max(d)`` (the relative floor on the
    diagonal's eigenvalues; at eps_rel = 0, a row that never had a gradient gets no update)."""
    d = A.sum(dim, keepdim=True)
    floor = eps_rel * d.amax(dim=(-2, -1), keepdim=True) if eps_rel > 0 else 0.0
    # for p a power of two, square roots and a division, each correctly rounded, not pow:
    # torch's CPU kernels take pow in vector code but a loop's tail in scalar code, which round
    # differently, so a block's root would depend on how many blocks its stack holds
    return torch.where(d > floor, root(d + eps, p).reciprocal(), torch.zeros_like(d))


def _momentum(ctx: _Step, M: torch.Tensor, P: torch.Tensor) -> torch.Tensor:
    """Heavy-ball momentum (h): M <- mu M + P; Nesterov returns P + mu M."""
    mu = ctx.config.mu
    M.mul_(ctx.guard.decay(mu, M.dtype)).add_(ctx.guard.masked(P, -0.0))
    return P + mu * M if ctx.config.nesterov is not False else M.clone()  # None: Nesterov's


def _update_params(ctx: _Step, params, grads, updates, lr) -> list[torch.Tensor]:
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


def _adamw_directions(ctx: _Step, grads) -> torch.Tensor:
    """Bias-corrected Adam direction of all AdamW vectors, in one flat buffer (j)."""
    config, local, guard = ctx.config, ctx.local, ctx.guard
    g = torch.cat([x.reshape(-1) for p, x in zip(local.params, grads) if p.kind == ADAMW]).to(local.dtype)
    m, v = ctx.state["adamw", "m"], ctx.state["adamw", "v"]
    b1, b2 = config.adamw_beta1, config.adamw_beta2
    m.mul_(guard.decay(b1, local.dtype)).add_(guard.masked(g, -0.0), alpha=1 - b1)
    v.mul_(guard.decay(b2, local.dtype)).add_(g * g, alpha=1 - b2)
    denom = v.sqrt() / ctx.corrections["v"] + config.adamw_eps
    return m / denom / ctx.corrections["m"]
