"""Optimizer-step time of the ``DASH`` adapter under its defaults, the old defaults, the paper's
setting, the main job's setting and the tuned preset, beside AdamW, on the main job's model (or
benchmarks/peers.py's), as a markdown table.

    python -m benchmarks.defaults_bench              # examples/train_lm.py's default Llama, the first four
    python -m benchmarks.defaults_bench --quick      # a tiny model: a smoke run
    python -m benchmarks.defaults_bench --peers-model 1024 --only defaults tuned   # peers.py's model

The model is examples/llama.py's Llama at examples/train_lm.py's default sizes (d_model 128, 2
layers, 4 heads, SwiGLU 341, context 64, batch 16). One backward pass on one fixed batch gives
the gradients; every optimizer reuses them, and only ``opt.step()`` is timed (eager, as a
newcomer calls it). Steady state: each optimizer first takes ``--warmup-periods`` whole refresh
periods (past the first root refresh at step 1, which is the costliest), then each timed window
is a whole number of refresh periods of every configuration (a multiple of the least common
multiple of their ``inv_root_freq``), so the refresh steps are amortised into the mean as in
training. The windows are interleaved round-robin over the configurations, ``--reps`` times,
so that load from other processes on the machine hits every configuration alike; the table
gives the median over windows of the mean ms per step, and its ratio to AdamW's.

Configurations:

* ``DASH(params, lr=3e-3)``: the library's defaults (block 256, solver "auto", roots every 10 steps);
* the old defaults: ``block_size=1024, solver="ndb", inv_root_freq=1`` (dash_fn 0.1; inverse 4th
  roots, no floor, no look-ahead);
* the paper: ``**dataclasses.asdict(DashConfig.paper())`` (NDB, pim scaling, roots every step, eps 0,
  vectors under one-sided Shampoo);
* the main job: ``block_size=128, inv_root_freq=10`` (solver "auto"), examples/train_lm.py's ``dash``;
* ``DashConfig.tuned()``: the defaults with roots every 3 steps;
* the previous defaults: ``root_order=4, eps_rel=0, nesterov_G=False`` (before the scaling study
  changed them), which the new defaults' cost is held against;
* ``torch.optim.AdamW(foreach=True)``, in every table (the ratios' base).

The tuned preset refreshes every 3 steps, so timing it makes every window 30 steps (the least
common multiple): it and the previous defaults run when ``--only`` names them (the first four
run by default).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import os
import statistics
import time

import torch

import dash_fn
from benchmarks.machine import machine_line
from benchmarks.peers import make_model
from dash_fn.preconditioners import resolve_solver
from dash_fn.strategy import for_device
from examples.llama import Llama, LlamaConfig, next_byte_loss

LR = 3e-3


# the fields whose defaults the scaling study changed (docs/ALGORITHM.md 11), at their values before
# (benchmarks/scaling.py pins the same, as train_lm --dash fields)
PREVIOUS = {"root_order": 4, "eps_rel": 0.0, "nesterov_G": False}


def configurations() -> dict[str, tuple[str, dict | None]]:
    """key: (label, DASH keyword arguments); None is AdamW."""
    return {
        "defaults": ("DASH(params) new defaults", {}),
        "old": (
            'old defaults: solver="ndb", inv_root_freq=1',
            {"block_size": 1024, "solver": "ndb", "inv_root_freq": 1, **PREVIOUS},
        ),
        "paper": ("DashConfig.paper()", dataclasses.asdict(dash_fn.DashConfig.paper())),
        "main": ("main job: block_size=128, inv_root_freq=10", {"block_size": 128, "inv_root_freq": 10}),
        "tuned": ("DashConfig.tuned()", dataclasses.asdict(dash_fn.DashConfig.tuned())),
        "previous": ("previous defaults: root_order=4, eps_rel=0, nesterov_G=False", PREVIOUS),
        "adamw": ("torch AdamW (foreach)", None),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def fixed_gradients(model: Llama, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Gradients of the next-byte loss on one fixed batch of random bytes."""
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab, (batch, model.config.context + 1), generator=gen).to(device)
    params = dict(model.named_parameters())
    loss = next_byte_loss(model, params, tokens)
    grads = torch.autograd.grad(loss, list(params.values()))
    return {k: g.detach().clone() for k, g in zip(params, grads)}


def linear_stack(d: int, device: torch.device) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """benchmarks/peers.py's model and fixed gradients as a module (its parameters by name)."""
    params, grads = make_model(d)
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(3)))
    model.load_state_dict(params)
    return model.to(device), {k: g.to(device) for k, g in grads.items()}


def make_optimizer(model: torch.nn.Module, kwargs: dict | None, grads: dict[str, torch.Tensor]):
    """A copy of the model with the fixed gradients attached, and its optimizer."""
    model = copy.deepcopy(model)
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    if kwargs is None:
        return model, torch.optim.AdamW(model.parameters(), lr=LR, foreach=True)
    return model, dash_fn.DASH(model.parameters(), lr=LR, **kwargs)


def describe(kwargs: dict | None, device: torch.device) -> tuple[str, str, str]:
    """(solver, block, inv_root_freq) cells; the solver as run on ``device``."""
    if kwargs is None:
        return "-", "-", "-"
    config = dash_fn.DashConfig(**kwargs)
    solver = resolve_solver(config, for_device(device))
    return (
        (f"auto ({solver})" if config.solver == "auto" else solver),
        str(config.block_size),
        str(config.inv_root_freq),
    )


def main(argv: list[str] | None = None) -> list[dict]:
    class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Each option's default, and the docstring (the epilog) as written."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter, epilog=__doc__)
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--n-layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--n-heads", type=int, default=4, help="attention heads")
    parser.add_argument("--context", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--batch", type=int, default=16, help="sequences in the fixed batch")
    parser.add_argument("--reps", type=int, default=7, help="timed windows per configuration, interleaved round-robin")
    parser.add_argument("--periods", type=int, default=1, help="refresh periods (of the longest one) per timed window")
    parser.add_argument(
        "--warmup-periods",
        type=int,
        default=1,
        help="whole refresh periods stepped before timing (at least 1: past the first refresh)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads; when not given torch's own")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 windows: a smoke run")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(configurations()),
        default=["defaults", "old", "paper", "main"],
        metavar="KEY",
        help=f"the configurations to time, of {list(configurations())} (AdamW always: the ratios' base)",
    )
    parser.add_argument(
        "--peers-model",
        type=int,
        metavar="D",
        help="time on benchmarks/peers.py's model instead (3 x Linear(D, D) with bias, its fixed gradients)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.n_layers, args.n_heads, args.context, args.batch, args.reps = 32, 1, 2, 16, 4, 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    if args.peers_model is not None and args.peers_model < 1:
        parser.error("--peers-model is a positive width")
    if args.peers_model is not None:
        model, grads = linear_stack(args.peers_model, device)
        described = f"peers.py's 3 x Linear({args.peers_model}, {args.peers_model}) with bias"
    else:
        torch.manual_seed(0)
        model = Llama(
            LlamaConfig(
                d_model=args.d_model,
                n_layers=args.n_layers,
                n_heads=args.n_heads,
                mlp_hidden=(8 * args.d_model) // 3,
                context=args.context,
            )
        ).to(device)
        grads = fixed_gradients(model, args.batch, device)
        described = (
            f"Llama d_model {args.d_model}, {args.n_layers} layers, {args.n_heads} heads, context {args.context}, "
            f"batch {args.batch}"
        )
    n_params = sum(p.numel() for p in model.parameters())

    keys = [k for k in configurations() if k in args.only or k == "adamw"]
    configs = [configurations()[k] for k in keys]
    freqs = [dash_fn.DashConfig(**kw).inv_root_freq for _, kw in configs if kw is not None]
    period = math.lcm(*freqs)  # every configuration refreshes a whole number of times per window
    window = period * max(1, args.periods)
    runs = []
    for label, kwargs in configs:
        model_copy, opt = make_optimizer(model, kwargs, grads)
        for _ in range(period * max(1, args.warmup_periods)):  # past the first refresh; t stays aligned to the period
            opt.step()
        sync(device)
        runs.append({"label": label, "kwargs": kwargs, "opt": opt, "model": model_copy, "ms": []})

    load_before = os.getloadavg()
    for _ in range(args.reps):
        for run in runs:  # round-robin: load from other processes hits all configurations alike
            opt = run["opt"]
            sync(device)
            start = time.perf_counter()
            for _ in range(window):
                opt.step()
            sync(device)
            run["ms"].append(1e3 * (time.perf_counter() - start) / window)
    load_after = os.getloadavg()

    adamw = statistics.median(next(r for r in runs if r["kwargs"] is None)["ms"])
    print(
        f"Machine: {machine_line(device)}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after timing."
    )
    print(
        f"Model: {described}; {n_params:,} parameters. Eager opt.step() with fixed gradients, lr {LR:g}; "
        f"{args.reps} windows of {window} steps "
        "(whole refresh periods) per configuration, interleaved, "
        f"after {period * max(1, args.warmup_periods)} warm-up steps.\n"
    )
    print("| configuration | solver | block | inv_root_freq | ms / step (median) | min - max | x AdamW |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for run in runs:
        solver, block, freq = describe(run["kwargs"], device)
        median = statistics.median(run["ms"])
        row = {
            "label": run["label"],
            "solver": solver,
            "block": block,
            "inv_root_freq": freq,
            "ms": median,
            "min": min(run["ms"]),
            "max": max(run["ms"]),
            "ratio": median / adamw,
        }
        rows.append(row)
        print(
            f"| {row['label']} | {solver} | {block} | {freq} | {median:.2f} | {row['min']:.2f} - {row['max']:.2f} | "
            f"{row['ratio']:.1f} |"
        )
    return rows


if __name__ == "__main__":
    main()
