"""``step``: one DASH update on stacked blocks (docs/ALGORITHM.md section 4).

Data flows one way: grads -> plan.gather -> block stacks -> factor/moment updates -> roots
refreshed on schedule -> grafted Shampoo directions -> plan.scatter -> new params.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from . import cpu, guard
from .config import DashConfig
from .distributed.fsdp import like, to_local
from .inputs import check_step_inputs, flatten, order_like_plan, rebuild
from .plan import ADAMW, EMPTY, SEGMENTS, Plan
from .roots import refresh_roots
from .roots.matmul import stacked_matmul
from .schedule import SCHEDULE_KEY, due_slice, has_root, is_refresh_step
from .storage import ema_
from .strategy import Strategy, for_device

__all__ = ["step", "is_refresh_step"]


def step(params, grads, state: TensorDict, *, lr, refresh: bool | None = None):
    """Apply one DASH step; returns ``(new_params, state)``.

    ``params`` and ``grads`` are Mapping[str, Tensor] or TensorDicts with the names, shapes,
    dtypes and device the state was initialized with; ``new_params`` comes back in the same
    kind of container. ``lr`` is a float or a 0-d tensor (a tensor never recompiles).

    ``refresh`` says whether this step recomputes the inverse roots under the periodic
    schedule: pass :func:`is_refresh_step` of the step's number, counted on the host (two
    compiled graphs, a plain step and a refresh step, with no data-dependent control flow: what
    CUDA graphs capture). ``refresh=None`` reads the state's step counter on the host, which
    only eager CPU calls may do (a sync elsewhere; a compiled step would break its graph):
    elsewhere it raises ValueError. A step skipped by the non-finite guard still refreshes when
    ``refresh=True``, from the factors it left unchanged (:mod:`dash_fn.guard`). Under
    ``refresh_schedule="staggered"`` (the default) every step refreshes its slice of the roots
    (:mod:`dash_fn.schedule`) and takes no flag: ``refresh`` must be None (as
    :func:`is_refresh_step` returns).

    Buffer donation: the input params are never modified, but the state's tensors are updated
    in place and the same TensorDict is returned (like JAX's donated buffers), so memory holds
    one copy of the state. Clone the state first if you need the old one.

    A state made for a process group (``init(..., process_group=...)``) holds this rank's
    blocks: the step updates them and all-gathers every rank's directions (one collective),
    so every rank must call it, with the same params, grads, lr and refresh.

    A call whose inputs do not match the state raises ValueError/TypeError naming the first
    mismatch, before anything is modified.
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
    if schedule == "staggered" and refresh is not None:
        raise ValueError(
            f"step: refresh={refresh!r}, but the staggered schedule refreshes a slice of the roots on every "
            "step and takes no flag; pass refresh=None (dash_fn.is_refresh_step returns None for it), or choose "
            "refresh_schedule='periodic'"
        )
    if refresh is None and not strategy.host_reads and schedule == "periodic":
        raise ValueError(
            f"step: refresh=None reads the step counter on the host, which the {strategy.name} strategy does not do "
            "(a device sync, or a break in a compiled graph); pass refresh=dash_fn.is_refresh_step(config, t) with the "
            "step's number t counted on the host"
        )
    with torch.no_grad():
        new = _apply(strategy, plan, shard, config, state, ordered_params, ordered_grads, lr, refresh, schedule)
        updated = dict(zip(plan.names, new))
    return rebuild(params, keys, [like(x, updated[n]) for n, x in zip(names, param_list)]), state


def _apply(
    strategy: Strategy, plan: Plan, shard, config: DashConfig, state: TensorDict, params, grads, lr, refresh, schedule
) -> list[torch.Tensor]:
    """Steps b-h on this rank's blocks (``shard.local``), the directions brought to the
    parameters' rows (:mod:`dash_fn.distributed`), then a and i on this rank's params; under
    the non-finite guard (:mod:`dash_fn.guard`) a step that is not all finite changes nothing
    but the roots of a refresh step."""
    local = shard.local
    blocks = shard.gradient_blocks(plan, grads)
    vectors = [x for p, x in zip(local.params, grads) if p.kind == ADAMW]
    # eager on the CPU the factor EMAs may run inside their products (dash_fn.cpu); else the
    # products are formed first and, under the guard, their diagonals checked
    fuse = strategy.host_reads and cpu.fuses_factor_emas(config, shard, vectors, blocks)
    products = [_factor_products(group, G, fuse) for group, G in zip(local.groups, blocks)]
    ok = None
    if config.skip_nonfinite and not fuse:
        ok = shard.all_ranks(guard.all_finite(vectors, [X for sides in products for _, X in sides]))
    s = config.start_prec_step
    staggered = schedule == "staggered" and s != math.inf
    if ok is not None and strategy.host_reads:  # branch instead of masking
        if not cpu.all_true(ok):
            state["skipped"].add_(1)
            if s != math.inf and refresh:  # the roots of the unchanged factors
                _refresh(strategy, local, config, state, state["step"], True, None)
            return list(params)
        ok = None  # every input is finite: the unguarded arithmetic, bit for bit
    if ok is not None:
        state["skipped"].add_(~ok)
        blocks = [guard.masked(ok, G, 0.0) for G in blocks]
        products = [[(side, guard.masked(ok, X, -0.0)) for side, X in sides] for sides in products]
        grads = [guard.masked(ok, g, 0.0) for g in grads]
    t = state["step"] + 1
    state["step"].copy_(guard.choose(ok, t, state["step"]))
    corrections = _bias_corrections(config, local, t)
    _factor_emas(local, config, state, products, ok)
    if staggered:
        _refresh_slices(strategy, local, config, state, t, ok)
    elif s != math.inf and refresh is not False:
        _refresh(strategy, local, config, state, t, refresh, ok)
    directions = []
    for g, G in enumerate(blocks):
        Gt, D = _adam_direction(strategy, config, state["groups", str(g)], G, corrections, t, ok)
        directions.append(_direction(strategy, local, config, state, g, Gt, D, t, staggered))
    if config.mu > 0:
        directions = [_momentum(config, state["groups", str(g), "M"], P, ok) for g, P in enumerate(directions)]
    comm_dtype = None if config.comm_dtype is None else getattr(torch, config.comm_dtype)
    updates = shard.parameter_updates(plan, directions, comm_dtype)
    new = _update_params(strategy, local, config, state, params, grads, updates, lr, corrections, ok)
    return [guard.choose(ok, x, W) if x is not W else W for x, W in zip(new, params)]


def _factor_products(group, G: torch.Tensor, fuse: bool) -> list:
    """``(factor slice, G G^T)`` and, two-sided, ``(factor slice, G^T G)`` of a block stack
    (with ``fuse``, where :func:`dash_fn.cpu.factor_operands` says so, the product's operands
    instead, which :func:`_factor_emas` multiplies into the factor)."""
    sides = [(group.left, G, G.mT), (group.right, G.mT, G)]
    return [(side, cpu.factor_operands(a, b) if fuse else stacked_matmul(a, b)) for side, a, b in sides if side]


def _bias_corrections(config: DashConfig, plan: Plan, t: torch.Tensor) -> dict:
    """This step's bias corrections ``1 - beta^t`` by use, 0-d tensors (None where unused):
    ``G`` of the gradient EMA, ``A`` of the grafting moment (its square root), ``m`` and ``v``
    of the AdamW vectors (``v``'s square root)."""
    wanted = {}
    if config.bias_correction and config.beta_G > 0:
        wanted["G"] = (config.beta_G, False)
    if config.bias_correction and config.grafting == "adam":
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


def _factor_emas(plan: Plan, config: DashConfig, state: TensorDict, products, ok) -> None:
    """Factor EMAs (b), every decay gated by ``ok``."""
    dtype = plan.dtype
    for group, sides in zip(plan.groups, products):
        for side, X in sides:
            F = state["factors", str(side.stack), "F"][side.offset : side.offset + group.count]
            if isinstance(X, tuple):  # the product's operands (dash_fn.cpu; F kept in the working dtype)
                a, b = X
                cpu.factor_ema_in_product(F, a, b, config.beta_LR)
            elif config.beta_LR < 1:
                # one write to the slice: Inductor turns each in-place op on a slice into a
                # masked scatter over the whole stack, and two of them per side into a nest of
                # masked loads (same bits as F.mul_(beta).add_(X, alpha)); a narrow F is widened
                # for the arithmetic and rounded once, when written
                F.copy_(torch.add(F.to(dtype) * guard.gate(ok, config.beta_LR, dtype), X, alpha=1 - config.beta_LR))
            elif F.dtype == dtype:
                F.add_(X)
            else:
                F.copy_(F.to(dtype) + X)


def _adam_direction(
    strategy: Strategy, config: DashConfig, entry: TensorDict, G: torch.Tensor, corrections: dict, t, ok
):
    """Grafting moment (c), gradient EMA (e) and Adam direction (f) of one group's blocks:
    returns ``(Gt, D)`` (``Gt`` is G itself without a gradient EMA); decays gated by ``ok``
    (eager on the CPU, unguarded, in one pass: :func:`dash_fn.cpu.fused_adam_direction`)."""
    if strategy.host_reads and ok is None and cpu.fused_adam_applies(config, entry, G):
        return cpu.fused_adam_direction(config, entry, G, t)
    dtype = G.dtype
    # squares as G * G, not addcmul: AOTAutograd decomposes addcmul into an fma, which rounds
    # otherwise, and the compiled step would not give eager's bits; a narrow A or Gt is updated
    # in the state dtype and rounded when stored (dash_fn.storage)
    if config.grafting == "adam":
        A = ema_(entry["A"], guard.gate(ok, config.beta_graft, dtype), G * G, 1 - config.beta_graft)
    else:
        A = ema_(entry["A"], 1.0, G * G, 1.0)
    Gt, cG = G, None
    if config.beta_G > 0:
        decay = guard.gate(ok, config.beta_G, dtype)
        Gt, cG = ema_(entry["Gt"], decay, guard.masked(ok, G, -0.0), 1 - config.beta_G), corrections["G"]
    # D = (Gt / cG) / (sqrt(A) / sqrt(cA) + eps), op for op, in place on its two temporaries
    denom = A.sqrt()
    if corrections["A"] is not None:
        denom.div_(corrections["A"])
    denom.add_(config.eps_graft)
    D = Gt / denom if cG is None else (Gt / cG).div_(denom)
    return Gt, D


def _refresh(strategy: Strategy, plan: Plan, config: DashConfig, state: TensorDict, t, refresh, ok) -> None:
    """Recompute every root stack (d) on the caller's flag (a skipped step's from its unchanged
    factors), or, with ``refresh=None`` under host reads, when the counter ``t`` says so."""
    F = [state["factors", str(k), "F"].to(plan.dtype) for k in range(len(plan.factors))]
    Fbar = [state["factors", str(k), "Fbar"] for k in range(len(plan.factors))]
    start = [
        state["start_vectors", str(stack.size)] if "start_vectors" in state.keys() else None for stack in plan.factors
    ]

    if refresh is None:  # host reads only (step checked it)
        s, f = config.start_prec_step, config.inv_root_freq
        due = (t == s) | ((t > s) & (t % f == 0))
        if ok is not None:
            due = due & ok
        if not cpu.all_true(due):
            return
    for k, (stack, V0) in enumerate(zip(plan.factors, start)):
        roots, fell_back = refresh_roots(F[k], Fbar[k].to(plan.dtype), stack.order, config, V0, strategy)
        Fbar[k].copy_(roots)
        state["factors", str(k), "fallbacks"].add_(fell_back)


def _refresh_slices(strategy: Strategy, plan: Plan, config: DashConfig, state: TensorDict, t, ok) -> None:
    """The staggered schedule's refresh (d): in every factor stack, the slice of blocks whose
    phase is due at step ``t`` gets new roots; nothing changes where no block is due, before
    start_prec_step, or on a skipped step (:mod:`dash_fn.schedule`)."""
    for k, stack in enumerate(plan.factors):
        if stack.count == 0:
            continue
        entry = state["factors", str(k)]
        positions, due = due_slice(state[SCHEDULE_KEY, str(k)], t, config)
        due = due if ok is None else due & ok  # a skipped step refreshes nothing
        if strategy.host_reads:  # skip a slice that is not due; solve no padding twice
            if not cpu.all_true(due):
                continue
            positions = positions[: int((positions != positions[-1]).sum()) + 1]
        V0 = state["start_vectors", str(stack.size)] if "start_vectors" in state.keys() else None
        old = entry["Fbar"].index_select(0, positions).to(plan.dtype)
        F = entry["F"].index_select(0, positions).to(plan.dtype)
        roots, fell_back = refresh_roots(F, old, stack.order, config, V0, strategy)
        if not strategy.host_reads:  # (with host reads every position is due here)
            roots = torch.where(due[:, None, None], roots, old)
        entry["Fbar"].index_copy_(0, positions, roots.to(entry["Fbar"].dtype))
        fallbacks = entry["fallbacks"]
        fallbacks.index_copy_(0, positions, fallbacks.index_select(0, positions) + (fell_back & due))


def _block_norm(strategy: Strategy, X: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each block, (N, 1, 1), without overflow or underflow: max|X| *
    ||X / max|X||| (with host reads the direct norm where it is safe: :func:`dash_fn.cpu.block_norm`)."""
    if strategy.host_reads:
        return cpu.block_norm(X, _scaled_norm)
    return _scaled_norm(X)


def _scaled_norm(X: torch.Tensor) -> torch.Tensor:
    """max|X| * ||X / max|X||| of each block, (N, 1, 1)."""
    peak = X.abs().amax(dim=(-2, -1), keepdim=True)
    safe = torch.where(peak > 0, peak, torch.ones_like(peak))
    return torch.linalg.vector_norm(X / safe, dim=(-2, -1), keepdim=True) * peak


def _direction(
    strategy: Strategy,
    plan: Plan,
    config: DashConfig,
    state: TensorDict,
    g: int,
    Gt: torch.Tensor,
    D: torch.Tensor,
    t,
    staggered: bool,
):
    """For t >= s the grafted Shampoo direction (g) from the gradient EMA ``Gt`` and the Adam
    direction ``D`` (staggered: from each block's first refresh on); before, ``D``."""
    s = config.start_prec_step
    if s == math.inf:
        return D
    group = plan.groups[g]

    def roots(side):  # widened to the state dtype (dash_fn.storage)
        return state["factors", str(side.stack), "Fbar"][side.offset : side.offset + group.count].to(plan.dtype)

    U = Gt
    if group.left is not None:
        U = stacked_matmul(roots(group.left), U)
    if group.right is not None:
        U = stacked_matmul(U, roots(group.right))
    if group.diagonal_dim is not None:  # a thin block's long side (docs/ALGORITHM.md 2.5)
        U = U * _diagonal_root(state["groups", str(g), "A"].to(plan.dtype), group.diagonal_dim, config.eps)
    graft = torch.linalg.vector_norm(D, dim=(-2, -1), keepdim=True)
    P = U.mul_(graft / (_block_norm(strategy, U) + 1e-16))  # U: this step's own product
    if staggered:  # a block's Adam direction until its first refresh
        side = group.factor_sides[0]
        ready = has_root(state[SCHEDULE_KEY, str(side.stack)], side.offset, group.count, t, config)
        if strategy.host_reads and cpu.all_true(ready):  # every block past its first refresh
            return P
        return torch.where(ready[:, None, None], P, D)
    return P if s == 1 else torch.where(t >= s, P, D)


def _diagonal_root(A: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """``(d + eps)^(-1/4)`` of the long side's diagonal factor d: the grafting moment summed
    over ``dim``, which is diag(G G^T)'s EMA (tall blocks; diag(G^T G)'s for wide ones) at the
    grafting moment's decay; 0 where d = 0 (a row that never had a gradient gets no update)."""
    d = A.sum(dim, keepdim=True)
    # two square roots and a division, each correctly rounded, not pow: torch's CPU kernels take
    # pow in vector code but a loop's tail in scalar code, which round differently, so a block's
    # root would depend on how many blocks its stack holds (DDP ranks hold fewer)
    return torch.where(d > 0, (d + eps).sqrt().sqrt().reciprocal(), torch.zeros_like(d))


def _momentum(config: DashConfig, M: torch.Tensor, P: torch.Tensor, ok) -> torch.Tensor:
    """Heavy-ball momentum (h): M <- mu M + P; Nesterov returns P + mu M."""
    M.mul_(guard.gate(ok, config.mu, M.dtype)).add_(guard.masked(ok, P, -0.0))
    return P + config.mu * M if config.nesterov else M.clone()


def _update_params(
    strategy: Strategy,
    plan: Plan,
    config: DashConfig,
    state: TensorDict,
    params,
    grads,
    updates,
    lr,
    corrections: dict,
    ok,
):
    """Weight decay (a) and the update (i) for matrices; AdamW (j) for vectors (``plan``
    describes the tensors this rank holds)."""
    adamw_dirs = _adamw_directions(plan, config, state, grads, corrections, ok) if plan.adamw_numel else None
    out = []
    for p, W, update in zip(plan.params, params, updates):
        if p.kind == EMPTY or p.numel == 0:  # nothing of it on this rank
            out.append(W)
            continue
        if p.kind == ADAMW:
            assert adamw_dirs is not None  # a plan with ADAMW params has adamw_numel > 0
            update, decay = adamw_dirs[p.flat_offset : p.flat_offset + p.numel].reshape(p.shape), config.vector_decay
        else:
            decay = config.vector_decay if p.kind == SEGMENTS else config.weight_decay
        X = W.to(plan.dtype)
        if decay:
            X = X * (1 - lr * decay)
        # with host reads, lr is a number or readable for free: one pass, X + (-lr) update (CPU
        # kernels fuse the multiply-add, as Inductor's code does); else two
        if strategy.host_reads:
            X = torch.add(X, update, alpha=-float(lr))
        else:
            X = X - lr * update
        out.append(X.to(W.dtype))
    return out


def _adamw_directions(plan: Plan, config: DashConfig, state: TensorDict, grads, corrections: dict, ok) -> torch.Tensor:
    """Bias-corrected Adam direction of all AdamW vectors, in one flat buffer (j)."""
    g = torch.cat([x.reshape(-1) for p, x in zip(plan.params, grads) if p.kind == ADAMW]).to(plan.dtype)
    m, v = state["adamw", "m"], state["adamw", "v"]
    b1, b2 = config.adamw_beta1, config.adamw_beta2
    m.mul_(guard.gate(ok, b1, plan.dtype)).add_(guard.masked(ok, g, -0.0), alpha=1 - b1)
    v.mul_(guard.gate(ok, b2, plan.dtype)).add_(g * g, alpha=1 - b2)
    denom = v.sqrt() / corrections["v"] + config.adamw_eps
    return m / denom / corrections["m"]
