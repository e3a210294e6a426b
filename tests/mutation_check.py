"""Does the test suite fail when the math is wrong? A fixed list of plausible one-line bugs.

    python tests/mutation_check.py            # every mutation (a few minutes on 2 cores)
    python tests/mutation_check.py -k ndb     # the mutations whose name contains "ndb"

Each mutation replaces one exact line fragment in a temporary copy of the repository and runs
the tests that guard that code there (pytest -x); it is *caught* when they fail. The script
prints a table and exits non-zero if any mutation survives or no longer applies (its text
must occur exactly once, so that a refactor cannot silently retire it). A new option brings
its mutation here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files and -k expressions


MUTATIONS = [
    Mutation(
        "storage: a narrow EMA rounded twice (decayed in place, then added)",
        "dash_fn/storage.py",
        "return x.copy_(torch.add(x.to(update.dtype) * decay, update, alpha=alpha)).to(update.dtype)",
        "return x.mul_(decay).add_(update, alpha=alpha).to(update.dtype)",
        ("tests/test_storage.py",),
    ),
    Mutation(
        "storage: a narrow factor EMA rounded twice",
        "dash_fn/forms.py",
        "F.copy_(torch.add(F.to(dtype) * guard.decay(beta, dtype), X, alpha=1 - beta))",
        "F.mul_(guard.decay(beta, dtype)).add_(X, alpha=1 - beta)",
        ("tests/test_storage.py",),
    ),
    Mutation(
        "thin: a tall block's full factor on its long side",
        "dash_fn/plan.py",
        "    if rows >= thin_ratio * cols:\n        return TALL",
        "    if rows >= thin_ratio * cols:\n        return WIDE",
        ("tests/test_thin.py",),
    ),
    Mutation(
        "thin: the long side's diagonal root of order 2",
        "dash_fn/preconditioners/shampoo.py",
        "root(d + eps, p).reciprocal()",
        "root(d + eps, 2).reciprocal()",
        ("tests/test_thin.py", "-k", "reference"),
    ),
    Mutation(
        "schedule: each rank numbers its own blocks (phases depend on the world size)",
        "dash_fn/schedule.py",
        'if getattr(shard, "piecewise", False):',
        "if True:",
        ("tests/test_distributed.py", "tests/test_fsdp.py", "-k", "staggered"),
    ),
    Mutation(
        "schedule: staggered phase one step early",
        "dash_fn/schedule.py",
        "j = torch.remainder(t - s, config.inv_root_freq)",
        "j = torch.remainder(t - s + 1, config.inv_root_freq)",
        ("tests/test_staggered.py",),
    ),
    Mutation(
        "schedule: blocks preconditioned before their first refresh",
        "dash_fn/schedule.py",
        "else torch.zeros_like(phase)) <= t - int(config.start_prec_step)",
        "else torch.zeros_like(phase)) <= t",
        ("tests/test_staggered.py", "-k", "reference"),
    ),
    Mutation(
        "warm-up: one step short",
        "dash_fn/schedule.py",
        "return (t >= s) & (t < s + config.inv_root_warmup)",
        "return (t >= s) & (t < s + config.inv_root_warmup - 1)",
        ("tests/test_warmup.py",),
    ),
    Mutation(
        "warm-up: blocks still wait for their phase's first refresh",
        "dash_fn/schedule.py",
        "(phase if config.inv_root_warmup == 0 else torch.zeros_like(phase))",
        "phase",
        ("tests/test_warmup.py", "-k", "reference"),
    ),
    Mutation(
        "warm-up: a staggered warm-up step refreshes its slice only",
        "dash_fn/step.py",
        "    if refresh:\n        refresh_stack = _refresh_stack",
        "    if refresh and not staggered:\n        refresh_stack = _refresh_stack",
        ("tests/test_warmup.py",),
    ),
    Mutation(
        "warm-up: the eigenvalue-corrected mode rotates the due slice's moments only",
        "dash_fn/step.py",
        "ctx.unit.refresh(ctx, bool(refresh), refresh_stacks)",
        "ctx.unit.refresh(ctx, False, refresh_stacks)",
        ("tests/test_eigenvalue_corrected.py", "-k", "warmup"),
    ),
    Mutation(
        "schedule: short slices padded with a block of another phase",
        "dash_fn/schedule.py",
        "slices = [r + r[-1:] * (width - len(r)) if r else [0] * width for r in rows]",
        "slices = [r + [(r[-1] + 1) % len(phase)] * (width - len(r)) if r else [0] * width for r in rows]",
        ("tests/test_staggered.py",),
    ),
    Mutation(
        "step: a skipped staggered step still refreshes its slice",
        "dash_fn/step.py",
        "due = ctx.guard.flags(due)  # a skipped step refreshes nothing",
        "pass",
        ("tests/test_staggered.py", "-k", "skipped"),
    ),
    Mutation(
        "step: vectors under one-sided Shampoo decay with weight_decay",
        "dash_fn/step.py",
        "decay = config.vector_decay if p.kind == SEGMENTS else config.weight_decay",
        "decay = config.weight_decay",
        ("tests/test_reference_agreement.py", "-k", "two-decays"),
    ),
    Mutation(
        "step: no bias correction of the gradient EMA",
        "dash_fn/forms.py",
        "D = Gt / denom if cG is None else (Gt / cG).div_(denom)",
        "D = Gt / denom",
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "step: eps_graft dropped from the Adam direction",
        "dash_fn/forms.py",
        "denom.add_(config.eps_graft)",
        "pass",
        ("tests/test_reference_agreement.py", "-k", "tiny"),
    ),
    Mutation(
        "step: step counter off by one",
        "dash_fn/step.py",
        't = state["step"] + 1',
        't = state["step"] + 2',
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "step: no grafting onto the Adam norm",
        "dash_fn/step.py",
        "P = U.mul_(target / (norm(U) + 1e-16))",
        "P = U",
        ("tests/test_grafting.py",),
    ),
    Mutation(
        "step: factor EMA weights swapped",
        "dash_fn/forms.py",
        "X, alpha=1 - beta))",
        "X, alpha=beta))",
        ("tests/test_compile_step.py", "-k", "aot_eager_matches_eager"),
    ),
    Mutation(
        "step: bias correction's square root dropped",
        "dash_fn/step.py",
        "return torch.stack([c.sqrt() if root else c for c, root in zip(corrections, roots)])",
        "return torch.stack(corrections)",
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "step: left root not applied",
        "dash_fn/preconditioners/shampoo.py",
        "U = precondition(ctx.refreshed(group, group.left), U)",
        "U = U",
        ("tests/test_reference_agreement.py", "-k", "default-eigh and B8"),
    ),
    Mutation(
        "step: Nesterov ignored",
        "dash_fn/step.py",
        "return P + mu * M if ctx.config.nesterov is not False else M.clone()",
        "return M.clone()",
        ("tests/test_reference_agreement.py", "-k", "freq3 and B8"),
    ),
    Mutation(
        "step: AdamW vectors without the second-moment bias correction",
        "dash_fn/step.py",
        'denom = v.sqrt() / ctx.corrections["v"] + config.adamw_eps',
        "denom = v.sqrt() + config.adamw_eps",
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "step: refresh on every multiple of the frequency only",
        "dash_fn/schedule.py",
        "return (t == s) | ((t > s) & (t % config.inv_root_freq == 0)) | warmup_due(t, config)",
        "return (t % config.inv_root_freq == 0) | warmup_due(t, config)",
        ("tests/test_schedule.py",),
    ),
    Mutation(
        "guard: grafting moment decays on a skipped step",
        "dash_fn/forms.py",
        'ema_(entry["A"], guard.decay(config.beta_graft, dtype),',
        'ema_(entry["A"], config.beta_graft,',
        ("tests/test_nonfinite.py",),
    ),
    Mutation(
        "guard: step counter advances on a skipped step",
        "dash_fn/step.py",
        'state["step"].copy_(guard.choose(t, state["step"]))',
        'state["step"].copy_(t)',
        ("tests/test_nonfinite.py",),
    ),
    Mutation(
        "guard: only the left products checked",
        "dash_fn/forms.py",
        "guard.all_finite(vectors, [X for sides in products for _, X in sides])",
        "guard.all_finite(vectors, [sides[0][1] for sides in products])",
        ("tests/test_nonfinite.py",),
    ),
    Mutation(
        "guard: AdamW vectors unchecked",
        "dash_fn/guard.py",
        "checks = [torch.isfinite(g).all() for g in vectors if g.numel()]",
        "checks = []",
        ("tests/test_nonfinite.py",),
    ),
    Mutation(
        "refresh: a chunk written one block off",
        "dash_fn/roots/__init__.py",
        "out[a : a + chunk] = new",
        "out[a + 1 : a + chunk + 1] = new[: len(out[a + 1 : a + chunk + 1])]",
        ("tests/test_refresh_memory.py",),
    ),
    Mutation(
        "roots: the compiled CPU eigh refresh without its fallback",
        "dash_fn/roots/__init__.py",
        "return refresh_roots(factors, roots, p, config, None, CPU)",
        "return eigh_root(factors, p, config.eps, heuristic, config.eps_rel), "
        "factors.new_zeros(factors.shape[:1], dtype=torch.bool)",
        ("tests/test_solvers.py", "-k", "non_finite_blocks and eigh"),
    ),
    Mutation(
        "eigh: the abs heuristic without the absolute value",
        "dash_fn/roots/eigh.py",
        '"abs": lambda mu, lam, eps: (mu.abs(), False)',
        '"abs": lambda mu, lam, eps: (mu, False)',
        ("tests/test_solvers.py", "-k", "indefinite"),
    ),
    Mutation(
        "eigh: the abs heuristic on lambda, without eps",
        "dash_fn/roots/eigh.py",
        '"abs": lambda mu, lam, eps: (mu.abs(), False)',
        '"abs": lambda mu, lam, eps: (lam.abs(), False)',
        ("tests/test_reference_agreement.py", "-k", "abs-heuristic"),
    ),
    Mutation(
        "ndb: a wrong Newton-Schulz coefficient",
        "dash_fn/roots/ndb.py",
        "E = 1.5 * identity - 0.5 * ZY",
        "E = 1.5 * identity - 0.45 * ZY",
        ("tests/test_solvers.py", "-k", "ndb"),
    ),
    Mutation(
        "identity: an upper-triangular matrix of ones",
        "dash_fn/roots/identity.py",
        "(index[:, None] == index[None, :])",
        "(index[:, None] <= index[None, :])",
        ("tests/test_solvers.py", "-k", "test_identity"),
    ),
    Mutation(
        "chebyshev: the scale's root not divided out",
        "dash_fn/roots/chebyshev.py",
        "return flag_diverged(q / root(s, p), extrapolated)",
        "return flag_diverged(q, extrapolated)",
        ("tests/test_solvers.py", "-k", "chebyshev"),
    ),
    Mutation(
        "eigh: inverse square root instead of the p-th",
        "dash_fn/roots/eigh.py",
        "scale = 1 / root(d, p)",
        "scale = 1 / root(d, 2)",
        ("tests/test_solvers.py", "-k", "eigh"),
    ),
    Mutation(
        "scaling: scaling_dtype ignored",
        "dash_fn/roots/scaling.py",
        "dtype = torch.promote_types(X.dtype, getattr(torch, config.scaling_dtype))",
        "dtype = X.dtype",
        ("tests/test_scaling.py", "-k", "scaling_dtype"),
    ),
    Mutation(
        "scaling: pim takes the mean estimate, not the largest",
        "dash_fn/roots/scaling.py",
        "estimates.amax(dim=-1)[:, None, None]",
        "estimates.mean(dim=-1)[:, None, None]",
        ("tests/test_scaling.py",),
    ),
    Mutation(
        "config: eps_power_iter not validated",
        "dash_fn/config.py",
        'for name in ("eps", "eps_power_iter", "weight_decay", "mu"):',
        'for name in ("eps", "weight_decay", "mu"):',
        ("tests/test_config.py",),
    ),
    Mutation(
        "config: comm_dtype not validated",
        "dash_fn/config.py",
        '_check_choice(self, "comm_dtype", (None, "bfloat16"))',
        "pass",
        ("tests/test_config.py",),
    ),
    Mutation(
        "plan: blocks cut column-major",
        "dash_fn/plan.py",
        "return sub.reshape(region.n_rows, r, region.n_cols, c).permute(0, 2, 1, 3).reshape(region.count, r, c)",
        "return sub.reshape(region.n_rows, r, region.n_cols, c).permute(2, 0, 1, 3).reshape(region.count, r, c)",
        ("tests/test_plan.py",),
    ),
    Mutation(
        "plan: experts not blocked apart",
        "dash_fn/plan.py",
        "rows = R // count // row_tiles  # of each tile",
        "rows = R // row_tiles  # of each tile",
        ("tests/test_batch_dims.py",),
    ),
    Mutation(
        "ownership: extra blocks to the lowest ranks",
        "dash_fn/distributed/ownership.py",
        "extra = set(sorted(range(world_size), key=lambda k: (load[k], k))[:e])",
        "extra = set(range(e))",
        ("tests/test_distributed.py", "-k", "least_loaded or balance"),
    ),
    Mutation(
        "fsdp: straddling bands by load only",
        "dash_fn/distributed/ownership.py",
        "key=lambda k: (-held[k], load[k], k)",
        "key=lambda k: (load[k], k)",
        ("tests/test_fsdp.py", "-k", "prefer"),
    ),
    Mutation(
        "fsdp: shard rows as if dim 0 had the view's rows",
        "dash_fn/distributed/fsdp.py",
        "rects.append((lo * per_d0 // C, hi * per_d0 // C, 0, C) if numel and hi > lo else (0, 0, 0, 0))",
        "rects.append((lo, hi, 0, C) if numel and hi > lo else (0, 0, 0, 0))",
        ("tests/test_fsdp.py", "-k", "torch_chunk"),
    ),
    Mutation(
        "layout: a box's first flat index from its last dim's offset alone",
        "dash_fn/distributed/layout.py",
        "a = a * size + offset[d]",
        "a = offset[d]",
        ("tests/test_tensor_parallel.py", "-k", "nested_chunks"),
    ),
    Mutation(
        "fsdp: pieces of a rectangle assembled upside down",
        "dash_fn/distributed/fsdp.py",
        "piece[2] - target[2] : piece[3] - target[2]] = x",
        "piece[2] - target[2] : piece[3] - target[2]] = x.flip(0)",
        ("tests/test_tensor_parallel.py", "-k", "one_process_bitwise and eigh and 2x2"),
    ),
    Mutation(
        "fsdp: column strips at the ranks' column edges, inside blocks",
        "dash_fn/distributed/fsdp.py",
        "nearest = [min(edges, key=lambda e: (abs(e - c0), e)) for c0, _ in ranges[1:]]",
        "nearest = [c0 for c0, _ in ranges[1:]]",
        ("tests/test_tensor_parallel.py", "-k", "one_process_bitwise and eigh and 2x2"),
    ),
    Mutation(
        "plan: tensor-parallel tiles blocked from the parameter's first column, not their own",
        "dash_fn/plan.py",
        "[(c0 + a, n, b) for c0 in range(0, C, cols) for a, n, b in _parts(cols, block_size)]",
        "_parts(C, block_size)",
        ("tests/test_tensor_parallel.py", "-k", "aligned_blocks_are and 1x2"),
    ),
    Mutation(
        "layout: every sharded mesh dim taken for tensor parallel (FSDP2's edges cut blocks too)",
        "dash_fn/distributed/layout.py",
        'return [d for d in work if (names and names[d] == "tp") or any(p[d].is_replicate() for p in placements)]',
        "return list(work)",
        ("tests/test_tensor_parallel.py", "-k", "aligned_blocks_are and 2x2"),
    ),
    Mutation(
        "checkpoint: checksum not verified",
        "dash_fn/checkpoint.py",
        'if blob["checksum"] != _checksum(blob, where):',
        "if False:",
        ("tests/test_checkpoint.py", "-k", "damaged"),
    ),
    Mutation(
        "checkpoint: another step counter accepted per parameter",
        "dash_fn/checkpoint.py",
        "if not torch.equal(t, steps[first]):",
        "if False:",
        ("tests/test_checkpoint.py", "-k", "bad_entries"),
    ),
    Mutation(
        "optim: a parameter without grad loses its state",
        "dash_fn/optim.py",
        "            view.copy_(old)",
        "            pass",
        ("tests/test_optim.py", "-k", "grad_none"),
    ),
    Mutation(
        "optim: unknown param-group keys accepted",
        "dash_fn/optim.py",
        "unknown = set(param_group) - set(GROUP_KEYS)",
        "unknown = set()",
        ("tests/test_optim.py", "-k", "strict"),
    ),
    Mutation(
        "forms: the fused factor update's bound ignored",
        "dash_fn/forms.py",
        "bound = math.sqrt(torch.finfo(G.dtype).max / (4 * max(G.shape[-2:])))",
        "bound = math.inf",
        ("tests/test_nonfinite.py", "-k", "fused"),
    ),
    Mutation(
        "forms: fused factor EMA weights swapped",
        "dash_fn/forms.py",
        "F.baddbmm_(*X, beta=beta, alpha=1 - beta if beta < 1 else 1.0)",
        "F.baddbmm_(*X, beta=1 - beta, alpha=beta)",
        ("tests/test_reference_agreement.py", "-k", "default-eigh and B8"),
    ),
    Mutation(
        "forms: fused Adam direction with its betas swapped",
        "dash_fn/forms.py",
        "beta1=config.beta_G,\n            beta2=config.beta_graft,",
        "beta1=config.beta_graft,\n            beta2=config.beta_G,",
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "forms: eager parameter update with lr's sign flipped",
        "dash_fn/forms.py",
        "return torch.add(X, update, alpha=-float(lr))",
        "return torch.add(X, update, alpha=float(lr))",
        ("tests/test_adam_oracle.py",),
    ),
    Mutation(
        "strategy: the accelerator strategy reads the host",
        "dash_fn/strategy.py",
        'ACCELERATOR = Strategy("accelerator", host_reads=False, cpu_ops=False)',
        'ACCELERATOR = Strategy("accelerator", host_reads=True, cpu_ops=False)',
        ("tests/test_accelerator_path.py", "-k", "eager_steps_do_not_sync"),
    ),
    Mutation(
        "state: the state's tensors not marked static",
        "dash_fn/state.py",
        "torch._dynamo.mark_static_address(x, guard=False)",
        "pass",
        ("tests/test_accelerator_path.py", "-k", "compiled_step_graphs and ndb"),
    ),
    Mutation(
        "optim: the adapter's schedule follows the device counter",
        "dash_fn/optim.py",
        'self.state[params[0]] = {"dash": state, "step": t + 1}',
        'self.state[params[0]] = {"dash": state, "step": int(state["step"])}',
        ("tests/test_nonfinite.py", "-k", "adapter_schedule"),
    ),
    Mutation(
        "step: a skipped refresh step keeps its roots",
        "dash_fn/step.py",
        "if refresh:  # the roots of the unchanged factors",
        "if False:",
        ("tests/test_nonfinite.py", "-k", "skipped_step_itself"),
    ),
    Mutation(
        "cpu_memory: the trim threshold left at glibc's 128 KiB",
        "dash_fn/cpu_memory.py",
        " and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))",
        "",
        ("tests/test_cpu_memory.py",),
    ),
    Mutation(
        "update rules: rms grafting's norm from rows + cols",
        "dash_fn/grafting.py",
        "(block_norm, config.graft_rms * math.sqrt(group.rows * group.cols))",
        "(block_norm, config.graft_rms * math.sqrt(group.rows + group.cols))",
        ("tests/test_update_rules.py", "-k", "rms"),
    ),
    Mutation(
        "update rules: spectral grafting's norm as the RMS rule's",
        "dash_fn/grafting.py",
        "config.graft_rms * math.sqrt(max(group.rows, group.cols))",
        "config.graft_rms * math.sqrt(group.rows * group.cols)",
        ("tests/test_update_rules.py", "-k", "spectral_grafting"),
    ),
    Mutation(
        "update rules: the spectral-norm estimate after one power iteration",
        "dash_fn/roots/scaling.py",
        "    for _ in range(steps):\n        v = _unit(",
        "    for _ in range(1):\n        v = _unit(",
        ("tests/test_update_rules.py", "-k", "spectral_norm_estimate"),
    ),
    Mutation(
        "update rules: rms grafting's moment summed as AdaGrad's",
        "dash_fn/grafting.py",
        '"rms": Grafting(\n        False,',
        '"rms": Grafting(\n        True,',
        ("tests/test_reference_agreement.py", "-k", "rms"),
    ),
    Mutation(
        "update rules: Nesterov's look-ahead of the uncorrected gradient EMA",
        "dash_fn/forms.py",
        "Gt = torch.add((Gt if cG is None else Gt / cG) * config.beta_G, G, alpha=1 - config.beta_G)",
        "Gt = torch.add(Gt * config.beta_G, G, alpha=1 - config.beta_G)",
        ("tests/test_reference_agreement.py", "-k", "nesterov"),
    ),
    Mutation(
        "update rules: eigh's floor absolute, not relative to lambda_max",
        "dash_fn/roots/eigh.py",
        "floor = eps_rel * lam.amax(dim=-1, keepdim=True)",
        "floor = eps_rel",
        ("tests/test_update_rules.py", "-k", "pseudo_inverse"),
    ),
    Mutation(
        "update rules: the Newton solvers damped by the scale, not by its lambda_max estimate",
        "dash_fn/roots/scaling.py",
        "lambda_hat = SCALINGS[config.scaling].largest(s, config)",
        "lambda_hat = s",
        ("tests/test_update_rules.py", "-k", "newton"),
    ),
    Mutation(
        "update rules: root_order ignored by the refresh",
        "dash_fn/step.py",
        "return config.resolved_root_order if order == 4 else order",
        "return order",
        ("tests/test_reference_agreement.py", "-k", "order3"),
    ),
    Mutation(
        "update rules: a thin block's diagonal root of order 4 whatever root_order",
        "dash_fn/preconditioners/shampoo.py",
        "root(d + eps, p).reciprocal()",
        "root(d + eps, 4).reciprocal()",
        ("tests/test_reference_agreement.py", "-k", "order3"),
    ),
    Mutation(
        "eigenvalue-corrected: the eigenbasis in eigh's increasing order",
        "dash_fn/roots/basis.py",
        "return Q[..., :b, Q.shape[-1] - b :].flip(-1).contiguous()",
        "return Q[..., :b, Q.shape[-1] - b :].contiguous()",
        ("tests/test_eigenvalue_corrected.py", "-k", "bases_diagonalize"),
    ),
    Mutation(
        "eigenvalue-corrected: orthogonal iteration forgets the factor (qr of Q alone)",
        "dash_fn/roots/basis.py",
        "Y = pad_aligned(product(X, Q), 1.0)",
        "Y = pad_aligned(Q, 1.0)",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: the moments of a gradient rotated on its right side only",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        "        G = rotate(left.mT, G)",
        "        G = G",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: the gradient EMA left in the old bases at a refresh",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        "        _rotate_gradient_ema(ctx, g, blocks, old)",
        "        pass",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: the gradient EMA moved out of the old right basis untransposed",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        "rotate(rotate(X, Q_old.mT), Q_new)",
        "rotate(rotate(X, Q_old), Q_new)",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: the staggered schedule moves the gradient EMAs of the next phase's blocks",
        "dash_fn/schedule.py",
        "j = torch.remainder(t - int(config.start_prec_step), config.inv_root_freq)",
        "j = torch.remainder(t + 1 - int(config.start_prec_step), config.inv_root_freq)",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: rotated back by Q_L^T",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        "        D = rotate(left, D)",
        "        D = rotate(left.mT, D)",
        ("tests/test_eigenvalue_corrected.py", "-k", "soap_reference"),
    ),
    Mutation(
        "eigenvalue-corrected: eigh bases on the accelerator (a sync per refresh)",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        '        return "qr"',
        '        return "eigh"',
        ("tests/test_eigenvalue_corrected.py", "-k", "one_compiled_graph"),
    ),
    Mutation(
        "update rules: auto takes NDB off the CPU whatever the root order (refused at init)",
        "dash_fn/roots/__init__.py",
        'return "ndb" if ndb_serves(config.resolved_root_order) else "cn"',
        'return "ndb"',
        ("tests/test_update_rules.py", "-k", "tuned_preset"),
    ),
    Mutation(
        "defaults: an unset root order is 4 (Shampoo's) under every solver",
        "dash_fn/config.py",
        'return 4 if self.solver == "ndb" else 3',
        "return 4",
        ("tests/test_reference_agreement.py",),
    ),
    Mutation(
        "roots: the compiled CPU eigh refresh skips its due slices too",
        "dash_fn/roots/__init__.py",
        "if due is not None and not bool(due.any()):",
        "if due is not None:",
        ("tests/test_staggered.py", "-k", "trains_alike and eigh"),
    ),
    Mutation(
        "guard: a negative tensor lr let through",
        "dash_fn/guard.py",
        "return torch.isfinite(lr) & (lr >= 0)",
        "return torch.isfinite(lr)",
        ("tests/test_nonfinite.py", "-k", "bad_tensor_lr"),
    ),
    Mutation(
        "guard: the lr's check left out of the device form's mask (compiled, accelerator)",
        "dash_fn/forms.py",
        "checks = [lr_ok] if lr_ok is not None else []",
        "checks = []",
        ("tests/test_nonfinite.py", "-k", "compiled_step_skips"),
    ),
    Mutation(
        "guard: a bad tensor lr not checked on the host (eager on the CPU)",
        "dash_fn/forms.py",
        "if lr_ok is not None and not bool(shard.all_ranks(lr_ok)):",
        "if False:",
        ("tests/test_nonfinite.py", "-k", "bad_tensor_lr"),
    ),
    Mutation(
        "guard: a skip known on the host goes unheard",
        "dash_fn/step.py",
        'announce_skip(int(state["skipped"]))',
        "pass",
        ("tests/test_nonfinite.py", "-k", "heard"),
    ),
    Mutation(
        "guard: the skips heard at every count, not at a growing interval",
        "dash_fn/guard.py",
        'if str(count).rstrip("0") != "1":',
        "if count < 1:",
        ("tests/test_nonfinite.py", "-k", "heard"),
    ),
    Mutation(
        "precision: the factor products left in float32",
        "dash_fn/forms.py",
        '[(side, self.products.of("factors")(a, b)) for side, a, b in factor_sides(group, G)]',
        "[(side, a @ b) for side, a, b in factor_sides(group, G)]",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: the preconditioning products left in float32",
        "dash_fn/preconditioners/shampoo.py",
        'U, precondition = Gt, ctx.forms.products.of("precondition")',
        "U, precondition = Gt, torch.matmul",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: the eigenvalue-corrected rotations left in float32",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        '        rotate = ctx.forms.products.of("rotate")\n        if left is not None:',
        "        rotate = torch.matmul\n        if left is not None:",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: the gradient EMA moved into new bases in float32",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        '        rotate = ctx.forms.products.of("rotate")\n        moved',
        "        rotate = torch.matmul\n        moved",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: the root iterations left in float32",
        "dash_fn/roots/__init__.py",
        "return entry.root(X, p, config, start, products.of(solver))",
        "return entry.root(X, p, config, start, PLAIN)",
        ("tests/test_precision.py", "tests/test_solvers.py", "-k", "precision"),
    ),
    Mutation(
        "precision: NDB run in 16 bits, where it is unstable",
        "dash_fn/roots/matmul.py",
        "        if self.precision in STAYS_FLOAT32 and part in STAYS_FLOAT32[self.precision]:",
        "        if False:",
        ("tests/test_precision.py", "tests/test_solvers.py", "-k", "precision"),
    ),
    Mutation(
        "precision: the emulated rounding a plain cast pair (which Inductor elides)",
        "dash_fn/roots/matmul.py",
        "return stacked_matmul(round_to(a, self.precision), round_to(b, self.precision))",
        'return stacked_matmul(*(x if self.precision == "tf32" else x.to(LOW[self.precision]).to(x.dtype) '
        "for x in (a, b)))",
        ("tests/test_precision.py", "-k", "inductor and bfloat16"),
    ),
    Mutation(
        "precision: TF32 operands truncated instead of rounded",
        "dash_fn/roots/matmul.py",
        "rounded = (bits + ((1 << (TF32_FRACTION_DROP - 1)) - 1) + odd)",
        "rounded = (bits + 0 * odd)",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: float16 operands not scaled into range",
        "dash_fn/roots/matmul.py",
        'if self.precision == "float16":\n            ea',
        "if False:\n            ea",
        ("tests/test_precision.py",),
    ),
    Mutation(
        "precision: the native CPU product accumulated in bf16",
        "dash_fn/roots/matmul.py",
        "return stacked_matmul(a.to(low), b.to(low)).to(a.dtype)",
        "return torch.stack([sum(torch.outer(a.to(low)[k][:, j], b.to(low)[k][j]) for j in range(a.shape[-1])) "
        "for k in range(a.shape[0])]).to(a.dtype)",
        ("tests/test_precision.py", "-k", "accumulate"),
    ),
    Mutation(
        "tensor cores: 'auto' float32 off the CPU even where the device serves float16",
        "dash_fn/roots/matmul.py",
        'return "float32" if device_refusal(device) else auto',
        'return "float32"',
        ("tests/test_tensor_cores.py",),
    ),
    Mutation(
        "tensor cores: a GPU below compute capability 7.0 taken for one with tensor cores",
        "dash_fn/roots/matmul.py",
        "if facts.capability is not None and facts.capability < FIRST_TENSOR_CORE_CAPABILITY:",
        "if False:",
        ("tests/test_tensor_cores.py",),
    ),
    Mutation(
        "tensor cores: the verdict taken again at every step (a flag set mid-run changes the products)",
        "dash_fn/roots/matmul.py",
        "    if key not in _VERDICTS:\n",
        "    if True:\n",
        ("tests/test_tensor_cores.py",),
    ),
    Mutation(
        "preconditioner units: the registry runs Shampoo's whatever the config names",
        "dash_fn/preconditioners/__init__.py",
        "    return UNITS[config.preconditioner]",
        '    return UNITS["shampoo"]',
        ("tests/test_preconditioner_unit.py",),
    ),
    Mutation(
        "solver fields: coupled Newton's masking left out of the fields it reads",
        "dash_fn/roots/__init__.py",
        '("eps", "eps_rel", "newton_steps", "cn_tol", "cn_masking")',
        '("eps", "eps_rel", "newton_steps", "cn_tol")',
        ("tests/test_solver_fields.py",),
    ),
    Mutation(
        "solver fields: eigh's bases said to read qr_steps",
        "dash_fn/preconditioners/eigenvalue_corrected.py",
        "eigenbasis(X, strategy.cpu_ops), ())",
        'eigenbasis(X, strategy.cpu_ops), ("qr_steps",))',
        ("tests/test_solver_fields.py",),
    ),
]


def run(mutation: Mutation, workdir: str) -> tuple[str, float]:
    """'caught', 'SURVIVED' or 'stale' (its text is not in the file exactly once)."""
    path = os.path.join(workdir, mutation.path)
    with open(path) as f:
        original = f.read()
    if original.count(mutation.old) != 1:
        return "stale", 0.0
    with open(path, "w") as f:
        f.write(original.replace(mutation.old, mutation.new))
    start = time.perf_counter()
    try:
        env = {**os.environ, "PYTHONPATH": workdir + os.pathsep + os.environ.get("PYTHONPATH", "")}
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    finally:
        with open(path, "w") as f:
            f.write(original)
    return (
        "caught" if result.returncode == 1 else "SURVIVED" if result.returncode == 0 else f"error {result.returncode}"
    ), time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("-k", default="", help="run only the mutations whose name contains this text")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.k in m.name]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = os.path.join(tmp, "repo")
        shutil.copytree(
            ROOT, workdir, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", ".cache", "runs", "*.egg-info")
        )
        print("| mutation | file | tests | result | s |\n|---|---|---|---|---|")
        results = []
        for mutation in chosen:
            outcome, seconds = run(mutation, workdir)
            results.append(outcome)
            print(
                f"| {mutation.name} | {mutation.path} | {' '.join(mutation.tests)} | {outcome} | {seconds:.0f} |",
                flush=True,
            )
    caught = results.count("caught")
    print(f"\n{caught} of {len(results)} mutations caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
