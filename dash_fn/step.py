"""``step``: one DASH update on stacked blocks (docs/ALGORITHM.md section 4).

Data flows one way: grads -> plan.gather -> block stacks -> factor/moment updates -> roots
refreshed on schedule -> grafted Shampoo directions -> plan.scatter -> new params.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from tensordict import TensorDict

from . import guard
from .config import DashConfig
from .distributed.fsdp import like, to_local
from .inputs import check_step_inputs, flatten, order_like_plan, rebuild
from .plan import ADAMW, EMPTY, SEGMENTS, Plan
from .roots import refresh_roots
from .roots.matmul import aligned_width, stacked_matmul


def is_refresh_step(config: DashConfig, t: int) -> bool:
    """Whether step number ``t`` (the first step is 1) refreshes the roots.

    ``refresh(t) = t == s or (t > s and t % inv_root_freq == 0)`` with s = start_prec_step.
    A caller that passes ``refresh=`` to :func:`step` should pass ``is_refresh_step(config, t)``.
    """
    s = config.start_prec_step
    return t == s or (t > s and t % config.inv_root_freq == 0)


def step(params, grads, state: TensorDict, *, lr, refresh: bool | None = None):
    """Apply one DASH step; returns ``(new_params, state)``.

    ``params`` and ``grads`` are Mapping[str, Tensor] or TensorDicts with the names, shapes,
    dtypes and device the state was initialized with; ``new_params`` comes back in the same
    kind of container. ``lr`` is a float or a 0-d tensor (a tensor never recompiles).

    ``refresh=None`` decides on the device, from the step counter, whether this step
    recomputes the inverse roots (one ``torch.cond``: no host sync, one compiled graph). Eager
    on the CPU, where reading the counter is free, it reads it instead (an eager ``torch.cond``
    compiles its branches on first use, which takes seconds).
    ``refresh=True/False`` picks the branch statically (pass :func:`is_refresh_step` of the
    new step number); that form gives two graphs, which CUDA graphs capture most reliably,
    and compiled plain steps skip the ``torch.cond``'s passes over the root stacks (its
    branches return new stacks that are copied back): 28 ms instead of 34 for 3 x
    Linear(1024, 1024) at block 256 on a 2-core CPU (``benchmarks/plain_step.py``).

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
    with torch.no_grad():
        updated = dict(zip(plan.names, _apply(plan, shard, config, state, ordered_params, ordered_grads, lr, refresh)))
    return rebuild(params, keys, [like(x, updated[n]) for n, x in zip(names, param_list)]), state


def _apply(plan: Plan, shard, config: DashConfig, state: TensorDict, params, grads, lr, refresh) -> list[torch.Tensor]:
    """Steps b-h on this rank's blocks (``shard.local``), the directions brought to the
    parameters' rows (:mod:`dash_fn.distributed`), then a and i on this rank's params; under
    the non-finite guard (:mod:`dash_fn.guard`) a step that is not all finite changes nothing."""
    local = shard.local
    blocks = shard.gradient_blocks(plan, grads)
    vectors = [x for p, x in zip(local.params, grads) if p.kind == ADAMW]
    # eager on the CPU the factor EMAs run inside their products (baddbmm), when no product
    # can overflow (every rank must agree, so the bound is all-reduced); else the products are
    # formed first and their diagonals checked
    # (not guard.decided_on_host per stack: a state without blocks must still say "compiled")
    fuse = not torch.compiler.is_compiling() and all(G.device.type == "cpu" for G in blocks)
    if fuse and config.skip_nonfinite:
        fuse = bool(shard.all_ranks(guard.products_bounded(vectors, blocks)))
    products = [_factor_products(group, G, fuse) for group, G in zip(local.groups, blocks)]
    ok = None
    if config.skip_nonfinite and not fuse:
        ok = shard.all_ranks(guard.all_finite(vectors, [X for sides in products for _, X in sides]))
    if ok is not None and guard.decided_on_host(ok):  # eager on the CPU: branch instead of masking
        if not bool(ok):
            state["skipped"].add_(1)
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
    s = config.start_prec_step
    if s != math.inf and refresh is not False:
        _refresh(local, config, state, t, refresh, ok)
    directions = []
    for g, G in enumerate(blocks):
        Gt, D = _adam_direction(config, state["groups", str(g)], G, corrections, t, ok)
        directions.append(_direction(local, config, state, g, Gt, D, t))
    if config.mu > 0:
        directions = [_momentum(config, state["groups", str(g), "M"], P, ok) for g, P in enumerate(directions)]
    comm_dtype = None if config.comm_dtype is None else getattr(torch, config.comm_dtype)
    updates = shard.parameter_updates(plan, directions, comm_dtype)
    new = _update_params(local, config, state, params, grads, updates, lr, corrections, ok)
    return [guard.choose(ok, x, W) if x is not W else W for x, W in zip(new, params)]


def _factor_products(group, G: torch.Tensor, fuse: bool) -> list:
    """``(factor slice, G G^T)`` and, two-sided, ``(factor slice, G^T G)`` of a block stack.

    With ``fuse``, a side whose blocks are whole 64-byte rows gets its operands ``(G, G^T)``
    instead of the product: :func:`_factor_emas` multiplies them into the factor (baddbmm), which
    saves writing the product and two passes over the factor. (Other sizes keep the product:
    see :func:`stacked_matmul` on where MKL's rounding depends on the output's alignment.)"""
    sides = [(group.left, G, G.mT)]
    if group.right is not None:
        sides.append((group.right, G.mT, G))
    return [
        (side, (a, b) if fuse and aligned_width(a.shape[-2], a.dtype) == a.shape[-2] else stacked_matmul(a, b))
        for side, a, b in sides
    ]


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
        values = _corrections(t, [beta for beta, _ in wanted.values()], [root for _, root in wanted.values()], plan.dtype)
        found.update(zip(wanted, values))
    return found


@torch.library.custom_op("dash_fn::bias_corrections", mutates_args=())
def _corrections(t: torch.Tensor, betas: list[float], roots: list[bool], dtype: torch.dtype) -> torch.Tensor:
    """``1 - beta^t`` for each beta (its square root where ``roots`` says so), as one (n,) tensor.

    One opaque op for torch.compile's sake: inlined, each scalar ``pow`` was recomputed in every
    vector iteration of the Inductor kernels that read it (Inductor compiles its CPU kernels
    with libm's errno semantics, under which the compiler may not hoist the call): the kernel
    of the moment EMAs and the Adam direction's norm took 6.8 ms instead of 3.0 for 3 x
    Linear(1024, 1024) at block 256 on a 2-core CPU (``benchmarks/plain_step.py --profile``).
    One call, because entering a custom op costs about 0.05 ms."""
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
            if isinstance(X, tuple):  # the product's operands: F <- beta F + (1 - beta) a b in one call
                beta = config.beta_LR
                F.baddbmm_(*X, beta=beta, alpha=1 - beta if beta < 1 else 1.0)
            elif config.beta_LR < 1 and torch.compiler.is_compiling():
                # the same arithmetic as one write to the slice: Inductor turns each in-place op
                # on a slice into a masked scatter over the whole stack, and two of them per
                # side into a nest of masked loads (about 2 ms of a 30 ms plain step; same bits)
                F.copy_(torch.add(F * guard.gate(ok, config.beta_LR, dtype), X, alpha=1 - config.beta_LR))
            elif config.beta_LR < 1:
                F.mul_(guard.gate(ok, config.beta_LR, dtype)).add_(X, alpha=1 - config.beta_LR)
            else:
                F.add_(X)


def _adam_direction(config: DashConfig, entry: TensorDict, G: torch.Tensor, corrections: dict, t, ok):
    """Grafting moment (c), gradient EMA (e) and Adam direction (f) of one group's blocks:
    returns ``(Gt, D)`` (``Gt`` is G itself without a gradient EMA); decays gated by ``ok``.

    Eager on the CPU with Adam grafting, a gradient EMA and bias correction (the defaults),
    torch's fused Adam kernel (``torch.optim.Adam(fused=True)``'s) does all three in one pass
    over the blocks, where the op-by-op form makes nine: with ``lr = -1`` on a zero
    "parameter" it leaves ``D = (Gt / cG) / (sqrt(A) / sqrt(cA) + eps)``, the same formula
    in the kernel's rounding (its EMA is a lerp)."""
    A = entry["A"]
    fused = ok is None and config.grafting == "adam" and config.beta_G > 0 and config.bias_correction
    # The kernel walks its tensors as flat arrays (so all must be contiguous; the state's are),
    # in vectors of 64 bytes with scalar code for the rest, which rounds differently: with
    # whole vectors per block, every entry takes the vector path wherever its block sits, and a
    # rank holding part of the stack gets the bits of one process. The choice depends on the
    # block shape only, never on the layout (which differs between one process and its ranks).
    block_entries = G.shape[-2] * G.shape[-1]
    whole_vectors = aligned_width(block_entries, G.dtype) == block_entries
    if fused and whole_vectors and guard.decided_on_host(G) and A.is_contiguous() and entry["Gt"].is_contiguous():
        Gt, D = entry["Gt"], torch.zeros_like(A)
        torch._fused_adam_(
            [D], [G.contiguous()], [Gt], [A], [], [t], lr=-1.0, beta1=config.beta_G, beta2=config.beta_graft,
            weight_decay=0.0, eps=config.eps_graft, amsgrad=False, maximize=False,
        )
        return Gt, D
    dtype = A.dtype
    if config.grafting == "adam":
        A.mul_(guard.gate(ok, config.beta_graft, dtype)).addcmul_(G, G, value=1 - config.beta_graft)
    else:
        A.addcmul_(G, G)
    Gt, cG = G, None
    if config.beta_G > 0:
        Gt, cG = entry["Gt"], corrections["G"]
        Gt.mul_(guard.gate(ok, config.beta_G, dtype)).add_(guard.masked(ok, G, -0.0), alpha=1 - config.beta_G)
    # D = (Gt / cG) / (sqrt(A) / sqrt(cA) + eps), op for op, in place on its two temporaries
    denom = A.sqrt()
    if corrections["A"] is not None:
        denom.div_(corrections["A"])
    denom.add_(config.eps_graft)
    D = Gt / denom if cG is None else (Gt / cG).div_(denom)
    return Gt, D


def _refresh(plan: Plan, config: DashConfig, state: TensorDict, t, refresh, ok) -> None:
    """Recompute every root stack (d), on the device-side schedule or the caller's flag
    (never on a skipped step)."""
    F = [state["factors", str(k), "F"] for k in range(len(plan.factors))]
    Fbar = [state["factors", str(k), "Fbar"] for k in range(len(plan.factors))]
    V0 = [state["start_vectors", str(stack.size)] if "start_vectors" in state.keys() else None for stack in plan.factors]
    n = len(F)

    def solve(*operands):
        outs = [
            refresh_roots(f, fb, stack.order, config, v)
            for stack, f, fb, v in zip(plan.factors, operands[:n], operands[n : 2 * n], V0)
        ]
        return tuple(r for r, _ in outs) + tuple(c for _, c in outs)

    def keep(*operands):
        return tuple(fb.clone() for fb in operands[n : 2 * n]) + tuple(
            torch.zeros(fb.shape[0], dtype=torch.bool, device=fb.device) for fb in operands[n : 2 * n]
        )

    if refresh is None:
        s, f = config.start_prec_step, config.inv_root_freq
        due = (t == s) | ((t > s) & (t % f == 0))
        if ok is not None:
            due = due & ok
        if torch.compiler.is_compiling() or due.device.type != "cpu":
            out = torch.cond(due, solve, keep, tuple(F) + tuple(Fbar))
        elif bool(due):  # eager on CPU: reading the counter costs nothing, an eager torch.cond seconds
            out = solve(*F, *Fbar)
        else:
            return
    else:
        out = solve(*F, *Fbar)
    for k in range(n):
        Fbar[k].copy_(guard.choose(ok, out[k], Fbar[k]) if refresh else out[k])
        state["factors", str(k), "fallbacks"].add_(out[n + k] if ok is None or not refresh else out[n + k] & ok)


# a block norm in this range is taken directly: its squares neither overflow nor lose digits
# to underflow (what flushes below 1e-38 is under 1e-9 of a square sum above 1e-24)
DIRECT_NORM_RANGE = (1e-12, 1e18)


def _block_norm(X: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each block, (N, 1, 1), without overflow or underflow.

    Compiled or on an accelerator: max|X| * ||X / max|X|||, one formula for every block.
    Eager on the CPU, where reading the result is free, each block's direct norm ||X|| is
    kept when it lies in DIRECT_NORM_RANGE and only the other blocks are scaled: one pass
    where the scaled form takes four (equal to within rounding, and block by block, so a
    rank holding part of a stack gets the bits of one process)."""
    if guard.decided_on_host(X):
        norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
        low, high = DIRECT_NORM_RANGE
        outside = ((norm <= low) | (norm >= high)).flatten().nonzero().flatten()
        if outside.numel():
            norm[outside] = _scaled_norm(X[outside])
        return norm
    return _scaled_norm(X)


def _scaled_norm(X: torch.Tensor) -> torch.Tensor:
    """max|X| * ||X / max|X||| of each block, (N, 1, 1)."""
    peak = X.abs().amax(dim=(-2, -1), keepdim=True)
    safe = torch.where(peak > 0, peak, torch.ones_like(peak))
    return torch.linalg.vector_norm(X / safe, dim=(-2, -1), keepdim=True) * peak


def _direction(plan: Plan, config: DashConfig, state: TensorDict, g: int, Gt: torch.Tensor, D: torch.Tensor, t):
    """For t >= s the grafted Shampoo direction (g) from the gradient EMA ``Gt`` and the Adam
    direction ``D``; before, ``D``."""
    s = config.start_prec_step
    if s == math.inf:
        return D
    group = plan.groups[g]
    left = state["factors", str(group.left.stack), "Fbar"][group.left.offset : group.left.offset + group.count]
    U = stacked_matmul(left, Gt)
    if group.right is not None:
        U = stacked_matmul(U, state["factors", str(group.right.stack), "Fbar"][group.right.offset : group.right.offset + group.count])
    graft = torch.linalg.vector_norm(D, dim=(-2, -1), keepdim=True)
    P = U.mul_(graft / (_block_norm(U) + 1e-16))  # U: this step's own product
    return P if s == 1 else torch.where(t >= s, P, D)


def _momentum(config: DashConfig, M: torch.Tensor, P: torch.Tensor, ok) -> torch.Tensor:
    """Heavy-ball momentum (h): M <- mu M + P; Nesterov returns P + mu M."""
    M.mul_(guard.gate(ok, config.mu, M.dtype)).add_(guard.masked(ok, P, -0.0))
    return P + config.mu * M if config.nesterov else M.clone()


def _update_params(plan: Plan, config: DashConfig, state: TensorDict, params, grads, updates, lr, corrections: dict, ok):
    """Weight decay (a) and the update (i) for matrices; AdamW (j) for vectors (``plan``
    describes the tensors this rank holds)."""
    adamw_dirs = _adamw_directions(plan, config, state, grads, corrections, ok) if plan.adamw_numel else None
    out = []
    for p, W, update in zip(plan.params, params, updates):
        if p.kind == EMPTY or p.numel == 0:  # nothing of it on this rank
            out.append(W)
            continue
        if p.kind == ADAMW:
            update, decay = adamw_dirs[p.flat_offset : p.flat_offset + p.numel].reshape(p.shape), config.vector_decay
        else:
            decay = config.vector_decay if p.kind == SEGMENTS else config.weight_decay
        X = W.to(plan.dtype)
        if decay:
            X = X * (1 - lr * decay)
        # eager, where lr is a number or readable for free: one pass, X + (-lr) update (CPU
        # kernels fuse the multiply-add, as Inductor's code does); else two
        if not torch.compiler.is_compiling() and (isinstance(lr, Real) or lr.device.type == "cpu"):
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
    v.mul_(guard.gate(ok, b2, plan.dtype)).addcmul_(g, g, value=1 - b2)
    denom = v.sqrt() / corrections["v"] + config.adamw_eps
    return m / denom / corrections["m"]
