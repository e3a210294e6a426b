"""How far one DASH update moves when one gradient entry moves by one ulp, per solver and eps;
and (``--determinism``) the race that made examples/train_lm.py irreproducible, and its cure's cost.

    python -m benchmarks.sensitivity                         # solvers eigh, ndb, cn x eps 1e-10, 1e-8, 1e-6
                                                             # (13 min on 2 busy cores)
    python -m benchmarks.sensitivity --solvers eigh --eps 1e-10 1e-4
    python -m benchmarks.sensitivity --determinism           # the race, and deterministic mode's cost (~3 min)

**1-ulp table.** The model, data, initialization and schedule are examples/train_lm.py's default
job (byte-level Llama, d_model 128, 2 layers, context 64, batch 16, seed 0; DASH block 128, roots
every 10 steps, peak lr 3e-3). For each (solver, eps) it trains with eager ``dash_fn.step`` and
at two steps, the first root refresh after ``--warmup`` steps (step 10 by default: the roots
are recomputed from factors that include this gradient) and the step after it (roots kept), it takes the step
once with the true gradients and once per trial with one entry of one matrix gradient moved
one ulp up (``torch.nextafter``): the entry of largest magnitude and one random entry, of every
matrix parameter. Each trial's change is ``max |u' - u| / max |u|`` over the perturbed
parameter's update ``u = new_params - params`` (the other parameters' updates do not move: the
blocks are independent); the table gives the largest and the median over trials. One ulp of a
float32 entry is 2^-23 relative (1.2e-7); the control row steps twice with the same gradient
(0: the eager step is deterministic, so every difference is the perturbation's).

**--determinism.** Inductor compiles train_lm's gradient function into C++ whose embedding
backward (``index_put`` with accumulate, from ``embedding_dense_backward``) adds each token's
row into the embedding gradient with ``atomic_add_vec`` inside an ``#pragma omp for`` over the
batch: with more than one thread, rows of a byte that occurs in both threads' sequences are
summed in an order set by thread timing. It calls the compiled function ``--repeats`` times on
the same inputs and counts distinct bit patterns of each gradient, with and without
``torch.use_deterministic_algorithms(True)`` (which makes Inductor fall back to ATen's
deterministic ``index_put_``), then times train_lm's whole step (compiled gradient, then the
compiled DASH step or foreach AdamW, whose eager ops deterministic mode could also change) in
both modes, interleaved in blocks of 10 steps in one process.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

import dash_fn
from examples.compiled_step import lr_at
from examples.llama import Llama, LlamaConfig, next_byte_loss
from examples.train_lm import batch_at, stdlib_corpus

BATCH, CONTEXT, STEPS, PEAK_LR, WARMUP_LR = 16, 64, 300, 3e-3, 20  # train_lm's defaults


def main_job(seed: int = 0):
    """train_lm's default model with its seed-``seed`` initialization: (model, params, loss_fn)."""
    model = Llama(LlamaConfig(d_model=128, n_layers=2, n_heads=4, mlp_hidden=(8 * 128) // 3, context=CONTEXT))
    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.02)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return model, params, lambda p, tokens: next_byte_loss(model, p, tokens)


def one_ulp_up(grads: dict, name: str, index: int) -> dict:
    out = dict(grads)
    flat = grads[name].flatten().clone()
    flat[index] = torch.nextafter(flat[index], torch.tensor(float("inf")))
    out[name] = flat.view_as(grads[name])
    return out


def update(params, grads, state, lr):
    new, _ = dash_fn.step(params, grads, state.clone(), lr=lr)
    return {k: new[k] - params[k] for k in params}


def sensitivity(solver: str, eps: float, warmup: int, train_data, trials_seed: int = 0) -> dict:
    """{'refresh': [(change, parameter)], 'kept': [...], 'control': max change} for one config."""
    _, params, loss_fn = main_job()
    grad_fn = torch.func.grad_and_value(loss_fn)
    # periodic: the step that refreshes every root is the one measured
    config = dash_fn.DashConfig(block_size=128, solver=solver, inv_root_freq=10, eps=eps, refresh_schedule="periodic")
    state = dash_fn.init(params, config)
    matrices = [k for k, v in params.items() if v.ndim >= 2]
    gen = torch.Generator().manual_seed(trials_seed)
    out = {"control": 0.0}
    refresh = next(
        t
        for t in range(warmup + 1, warmup + 1 + config.inv_root_freq + config.start_prec_step)
        if dash_fn.is_refresh_step(config, t)
    )
    for t in range(1, refresh + 2):
        lr = lr_at(t, STEPS, PEAK_LR, WARMUP_LR)
        grads, _ = grad_fn(params, batch_at(train_data, t, BATCH, CONTEXT, 0))
        if t >= refresh:
            kind = "refresh" if t == refresh else "kept"
            base = update(params, grads, state, lr)
            again = update(params, grads, state, lr)
            out["control"] = max(out["control"], max(float((again[k] - base[k]).abs().max()) for k in params))
            changes = []
            for name in matrices:
                g = grads[name].flatten()
                for index in (int(g.abs().argmax()), int(torch.randint(g.numel(), (1,), generator=gen))):
                    moved = update(params, one_ulp_up(grads, name, index), state, lr)
                    changes.append((float((moved[name] - base[name]).abs().max() / base[name].abs().max()), name))
            out[kind] = changes
        params, state = dash_fn.step(params, grads, state, lr=lr)
    return out


def ulp_table(args) -> None:
    train_data, _ = stdlib_corpus(4_000_000)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"{args.warmup} steps before the measured refresh; one float32 ulp = 2^-23 = {2.0**-23:.1e} relative"
    )
    print("\n| solver | eps | refresh step: max (median) change | next step, roots kept: max (median) | control | s |")
    print("|---|---|---|---|---|---|")
    for solver in args.solvers:
        for eps in args.eps:
            start = time.perf_counter()
            r = sensitivity(solver, eps, args.warmup, train_data)
            fmt = lambda xs: f"{max(xs)[0]:.1e} ({statistics.median(x for x, _ in xs):.1e}; max at {max(xs)[1]})"
            print(
                f"| {solver} | {eps:g} | {fmt(r['refresh'])} | {fmt(r['kept'])} | {r['control']:g} | "
                f"{time.perf_counter() - start:.0f} |",
                flush=True,
            )


def determinism(args) -> None:
    """Distinct gradient bit patterns over repeated calls, and the step time, per mode."""
    torch._dynamo.config.cache_size_limit = 64
    train_data, _ = stdlib_corpus(4_000_000)
    _, params, loss_fn = main_job()
    grad_fn = torch.compile(torch.func.grad_and_value(loss_fn), fullgraph=True)
    config = dash_fn.DashConfig(block_size=128, solver="auto", inv_root_freq=10)
    state = dash_fn.init(params, config)
    dash_step = torch.compile(dash_fn.step, fullgraph=True, dynamic=False)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    tokens = batch_at(train_data, 1, BATCH, CONTEXT, 0)
    for det in (False, True):
        torch.use_deterministic_algorithms(det)
        seen: dict[str, set] = {k: set() for k in params}
        for _ in range(args.repeats):
            grads, _ = grad_fn(params, tokens)
            for k, g in grads.items():
                seen[k].add(hashlib.sha1(g.numpy().tobytes()).hexdigest())
        varying = {k: len(v) for k, v in seen.items() if len(v) > 1}
        print(
            f"deterministic={det}: {args.repeats} calls on the same inputs; gradients with more than one bit pattern: "
            f"{varying or 'none'}"
        )
    lr = torch.tensor(0.0)
    leaves = {k: v.clone() for k, v in params.items()}  # train_lm's AdamW: foreach, betas (0.9, 0.95)
    adamw = torch.optim.AdamW(list(leaves.values()), lr=0.0, betas=(0.9, 0.95), weight_decay=0.0, foreach=True)

    def dash_train_step(tokens):
        nonlocal params, state
        grads, loss = grad_fn(params, tokens)
        params, state = dash_step(params, grads, state, lr=lr)
        return loss

    def adamw_train_step(tokens):
        grads, loss = grad_fn(leaves, tokens)
        for k, g in grads.items():
            leaves[k].grad = g
        adamw.param_groups[0]["lr"] = float(lr)
        adamw.step()
        return loss

    times: dict[tuple[str, bool], list[float]] = {(o, d): [] for o in ("dash", "adamw") for d in (False, True)}
    t = 0
    for block in range(args.blocks + 1):  # block 0 compiles both modes' graphs and is not timed
        for det in (False, True) if block % 2 == 0 else (True, False):
            torch.use_deterministic_algorithms(det)
            for optimizer, train_step in (("dash", dash_train_step), ("adamw", adamw_train_step)):
                for _ in range(10):
                    t += 1
                    lr.fill_(lr_at(t, STEPS, PEAK_LR, WARMUP_LR))
                    start = time.perf_counter()
                    float(train_step(batch_at(train_data, t, BATCH, CONTEXT, 0)))
                    if block:
                        times[optimizer, det].append(time.perf_counter() - start)
    torch.use_deterministic_algorithms(False)
    print(
        "\ntrain_lm's step (compiled gradient, then the compiled DASH step with roots every 10 steps or foreach "
        f"AdamW), {args.blocks} blocks of 10 steps per mode and optimizer, interleaved:"
    )
    for optimizer in ("dash", "adamw"):
        for det in (False, True):
            ms = sorted(1e3 * x for x in times[optimizer, det])
            print(
                f"  {optimizer:5s} deterministic={det!s:5s}: median {statistics.median(ms):.1f} ms, "
                f"mean {statistics.mean(ms):.1f} ms, 10th-90th percentile "
                f"{ms[len(ms) // 10]:.1f}-{ms[9 * len(ms) // 10]:.1f} ms ({len(ms)} steps)"
            )
        ratio = statistics.median(times[optimizer, True]) / statistics.median(times[optimizer, False])
        print(f"  {optimizer:5s} median ratio deterministic / default: {ratio:.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--solvers", nargs="+", default=["eigh", "ndb", "cn"], help="root solvers")
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-10, 1e-8, 1e-6], help="DashConfig.eps values")
    parser.add_argument(
        "--warmup",
        type=int,
        default=9,
        help="train steps before the first measured step, the next root refresh "
        "(roots refresh at steps 1, 10, 20, ...)",
    )
    parser.add_argument(
        "--determinism",
        action="store_true",
        help="instead: the compiled gradient's race, and deterministic mode's step time",
    )
    parser.add_argument(
        "--repeats", type=int, default=10, help="--determinism: calls of the compiled gradient per mode"
    )
    parser.add_argument("--blocks", type=int, default=10, help="--determinism: timed blocks of 10 steps per mode")
    args = parser.parse_args(argv)
    if args.determinism:
        determinism(args)
    else:
        torch.use_deterministic_algorithms(True)  # the eager gradients too: every difference is the ulp's
        ulp_table(args)


if __name__ == "__main__":
    main()
