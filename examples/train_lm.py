"""Train a small byte-level Llama on the Python standard library's source, DASH beside AdamW.

    python examples/train_lm.py                                  # the default comparison
                                                                 # (1.5 min on 2 idle CPU cores, 8 on busy ones)
    python examples/train_lm.py --runs adamw@1e-3 dash-ndb@3e-3 --seeds 0 1 2
    python examples/train_lm.py --data my_corpus.txt --d-model 256 --device cuda

Each run is OPTIMIZER@LR: ``adamw`` (torch.optim.AdamW, foreach), ``muon`` (torch.optim.Muon on
the hidden matrices, AdamW on the rest, one learning rate for both), ``soap`` and ``psgd``
(HeavyBall's SOAP and PSGDKron: ``pip install -e ".[bench]"``), ``dash-SOLVER`` (dash_fn with
that root solver; ``dash`` alone is the default solver for the device; both use --block-size
and --inv-root-freq), ``dash-defaults`` (``DashConfig()``: the library's defaults, block 256
and roots every 10 steps, ignoring --block-size and --inv-root-freq) or ``dash-paper``
(``DashConfig.paper()``: the DASH paper's setting, NDB roots every step); ``--dash-hidden-only``
gives DASH runs the hidden matrices only and AdamW the rest, as muon runs. Every run trains the
same model from the same initialization on the same batches; the loss and gradients come from
one compiled function (torch.func.grad_and_value under torch.compile), and dash_fn's step is
compiled with fullgraph=True. Writes to --out: ``log.json`` (every step's train loss and wall
time, validation losses), ``loss.png`` (train and validation loss against step and against wall
time) and ``summary.md`` (final validation loss per optimizer, mean and spread over seeds, the steps
and seconds each needs to reach the best AdamW run's final validation loss, and its loss at
AdamW's wall time).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

import dash_fn

# `python examples/train_lm.py` (the README's and `make main`'s command) runs this file as a
# script, whose folder Python puts first on the import path: its siblings import by their own
# names. Imported as examples.train_lm (`python -m`, the tests, benchmarks/) it has a package,
# and its siblings come from that package, so that each module is loaded once.
if __package__:
    from examples.compiled_step import deterministic_flag_restored, lr_at  # shared with that example
    from examples.llama import Llama, LlamaConfig, expert_weights, next_byte_loss
else:
    from compiled_step import deterministic_flag_restored, lr_at
    from llama import Llama, LlamaConfig, expert_weights, next_byte_loss

# Model sizes of the scaling study (issue 27; benchmarks/scaling.py): 0.46M, 3.3M and 12.8M
# parameters. Every size sees the same 1,024 tokens per step (16 sequences of 64 bytes); ``s`` is
# the main job. The 2-core CPU affords ``l`` only 600 steps (about 10 minutes a run), so the
# larger models see fewer tokens per parameter: s 0.67, m 0.31, l 0.05.
SIZES = {
    "s": dict(d_model=128, n_layers=2, n_heads=4, steps=300, warmup=20, eval_every=25),
    "m": dict(d_model=256, n_layers=4, n_heads=4, steps=1000, warmup=50, eval_every=50),
    "l": dict(d_model=512, n_layers=4, n_heads=8, steps=600, warmup=40, eval_every=50),
}


def stdlib_corpus(limit_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of the running Python's standard library sources, split by file: every 10th file
    (in sorted path order) is validation. Deterministic for a given Python installation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    train, val, total = [], [], 0
    for i, path in enumerate(files):
        data = path.read_bytes()
        (val if i % 10 == 9 else train).append(data)
        total += len(data)
        if total >= limit_bytes:
            break
    as_tensor = lambda chunks: torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()
    return as_tensor(train), as_tensor(val)


def file_corpus(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A text file's bytes: the first 90% train, the last 10% validation."""
    data = torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:]


def batch_at(data: torch.Tensor, step: int, batch: int, context: int, seed: int) -> torch.Tensor:
    """The same windows for every optimizer at a given (seed, step)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=gen)
    return torch.stack([data[s : s + context + 1] for s in starts.tolist()])


PEERS = ("adamw", "muon", "soap", "psgd")  # torch.optim-style optimizers (soap, psgd: HeavyBall)


def dash_field(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` as (field, value): a number (inf included), None, a bool, or the string."""
    field, sep, raw = text.partition("=")
    if not sep or field not in {f.name for f in dataclasses.fields(dash_fn.DashConfig)}:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with a DashConfig field, got {text!r}")
    words = {"none": None, "true": True, "false": False}
    if raw.lower() in words:
        return field, words[raw.lower()]
    for kind in (int, float):
        try:
            return field, kind(raw)
        except ValueError:
            pass
    return field, raw


def add_dash_fields(parser: argparse.ArgumentParser, scope: str) -> None:
    """The ``--dash FIELD=VALUE ...`` option: DashConfig fields (a list of pairs in ``args.dash``)."""
    parser.add_argument(
        "--dash",
        nargs="+",
        type=dash_field,
        default=[],
        metavar="FIELD=VALUE",
        help=f"DashConfig fields {scope}, e.g. --dash root_dtype=bfloat16 thin_ratio=inf "
        "(VALUE: a number, inf, None, true/false or a string)",
    )


def parse_run(spec: str) -> tuple[str, float]:
    name, _, lr = spec.partition("@")
    if name not in PEERS and not (name == "dash" or name.startswith("dash-")):
        raise SystemExit(
            f"unknown optimizer {name!r}: use {', '.join(PEERS)}, dash, dash-SOLVER, dash-defaults or dash-paper"
        )
    return name, float(lr)


def newton_schulz_float32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz orthogonalization (the same quintic iteration, the same
    normalization) in float32 instead of bfloat16: the same math at higher precision, for CPUs
    whose bfloat16 products are many times slower (``benchmarks/studies/muon_precision.py``)."""
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    X = grad.float().T if tall else grad.float()
    X = X / X.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = X @ X.T
        X = torch.addmm(X, torch.addmm(gram, gram, gram, beta=b, alpha=c), X, beta=a)
    return X.T if tall else X


def is_hidden(name: str, value: torch.Tensor) -> bool:
    """A hidden matrix: a 2-D weight inside a transformer block (not the embedding or the head)."""
    return value.ndim == 2 and name.startswith("blocks.")


def peer_optimizers(name: str, leaves: dict, args) -> list:
    """The torch.optim optimizers of a peer run (lr set every step). Muon takes the hidden
    matrices with ``adjust_lr_fn="match_rms_adamw"`` (its update's RMS matched to AdamW's, so
    one learning rate serves both), AdamW the embedding, the head, vectors and expert stacks.
    SOAP and PSGDKron are HeavyBall's (``pip install -e ".[bench]"``) with their defaults,
    betas (0.9, 0.95) where they take them, and the run's weight decay."""
    if name == "adamw":
        return [
            torch.optim.AdamW(
                list(leaves.values()), lr=0.0, betas=(0.9, 0.95), weight_decay=args.weight_decay, foreach=True
            )
        ]
    if name == "muon":
        if args.muon_float32:  # Muon calls this module-level function for each matrix
            importlib.import_module("torch.optim._muon")._zeropower_via_newtonschulz = newton_schulz_float32
        hidden = [v for k, v in leaves.items() if is_hidden(k, v)]
        rest = [v for k, v in leaves.items() if not is_hidden(k, v)]
        return [
            torch.optim.Muon(hidden, lr=0.0, weight_decay=args.weight_decay, adjust_lr_fn="match_rms_adamw"),
            torch.optim.AdamW(rest, lr=0.0, betas=(0.9, 0.95), weight_decay=args.weight_decay, foreach=True),
        ]
    try:
        import heavyball
    except ImportError as e:
        raise SystemExit(f"{name} runs HeavyBall's optimizer: pip install -e '.[bench]' ({e})") from e
    if name == "soap":
        return [heavyball.SOAP(list(leaves.values()), lr=0.0, betas=(0.9, 0.95), weight_decay=args.weight_decay)]
    return [heavyball.PSGDKron(list(leaves.values()), lr=0.0, betas=(0.9, 0.95), weight_decay=args.weight_decay)]


class Optimizer:
    """One interface for all: ``update(params, grads, lr_tensor) -> params``."""

    def __init__(self, name: str, params: dict, args):
        self.name, self.names = name, list(params)  # the caller's order, kept
        self.rest: dict = {}  # what AdamW takes beside DASH under --dash-hidden-only
        self.torch_opts: list = []
        if name not in PEERS and args.dash_hidden_only:
            self.rest = {k: v.clone() for k, v in params.items() if not is_hidden(k, v)}
            self.torch_opts = peer_optimizers("adamw", self.rest, args)
            params = {k: v for k, v in params.items() if k not in self.rest}
        if name in PEERS:
            self.leaves = {k: v.clone() for k, v in params.items()}
            self.torch_opts = peer_optimizers(name, self.leaves, args)
        else:
            if name == "dash-defaults":  # the library's defaults: --block-size, --inv-root-freq do not apply
                config = dash_fn.DashConfig(weight_decay=args.weight_decay)
            elif name == "dash-paper":  # the DASH paper's recommended setting
                config = dash_fn.DashConfig.paper(weight_decay=args.weight_decay)
            else:
                solver = name.partition("-")[2] or "auto"
                config = dash_fn.DashConfig(
                    block_size=args.block_size,
                    solver=solver,
                    inv_root_freq=args.inv_root_freq,
                    weight_decay=args.weight_decay,
                )
            if args.eps is not None:
                config = config.replace(eps=args.eps)
            if args.refresh_schedule is not None:
                config = config.replace(refresh_schedule=args.refresh_schedule)
            config = config.replace(**args.dash)
            self.state = dash_fn.init(params, config, batch_dims=expert_weights(params))
            # dynamic=False: a second config's plan (another block size) would otherwise turn its ints symbolic
            self.step = (
                torch.compile(dash_fn.step, fullgraph=True, backend=args.backend, dynamic=False)
                if args.backend != "none"
                else dash_fn.step
            )

    def update(self, params: dict, grads: dict, lr: torch.Tensor, refresh: bool | None) -> dict:
        if self.name in PEERS:
            self._torch_step(self.leaves, grads, lr)
            return self.leaves
        self._torch_step(self.rest, {k: grads[k] for k in self.rest}, lr)
        params = {k: v for k, v in params.items() if k not in self.rest}
        grads = {k: v for k, v in grads.items() if k not in self.rest}
        new, self.state = self.step(params, grads, self.state, lr=lr, refresh=refresh)
        return {k: self.rest[k] if k in self.rest else new[k] for k in self.names}

    def _torch_step(self, leaves: dict, grads: dict, lr: torch.Tensor) -> None:
        for k, g in grads.items():
            leaves[k].grad = g
        for opt in self.torch_opts:
            for group in opt.param_groups:
                group["lr"] = float(lr)
            opt.step()

    def refresh_at(self, t: int) -> bool | None:
        """Whether DASH's step ``t`` refreshes its roots, passed to the step as a static flag
        (two graphs, a plain step and a refresh step). None for the peers."""
        return None if self.name in PEERS else dash_fn.is_refresh_step(self.state["config"], t)


@torch.no_grad()
def evaluate(loss_fn, params, data, args, seed) -> float:
    losses = [
        float(loss_fn(params, batch_at(data, -1 - i, args.batch, args.context, seed).to(args.device)))
        for i in range(args.eval_batches)
    ]
    return sum(losses) / len(losses)


def train(
    name: str,
    peak_lr: float,
    seed: int,
    loss_fn,
    grad_fn,
    init_params: dict,
    corpus,
    args,
    progress,
    final: dict | None = None,
) -> dict:
    """One run. Wall time counts the train steps, not the evaluations, and not the steps that
    compile: the first two (HeavyBall's optimizers compile on their second call) and DASH's
    first plain and first refresh step; their time is logged apart as compile_s. optimizer_s is
    the part of the timed wall from the gradients' end to the update's. update_rms is, at each
    evaluated step, the RMS of that step's change of each hidden matrix, averaged over them. ``final``, if given,
    receives the final parameters under the run's key ``OPTIMIZER@LR seed S``."""
    train_data, val_data = corpus
    params = {k: v.clone() for k, v in init_params.items()}
    opt = Optimizer(name, params, args)
    lr = torch.tensor(0.0, device=args.device)
    log = {
        "optimizer": name,
        "lr": peak_lr,
        "seed": seed,
        "compile_s": 0.0,
        "optimizer_s": 0.0,
        "timed_steps": 0,
        "step": [],
        "train_loss": [],
        "wall": [],
        "val_step": [],
        "val_loss": [],
        "val_wall": [],
        "update_rms": [],
    }
    wall, kinds = 0.0, set()
    sync = torch.cuda.synchronize if str(args.device).startswith("cuda") else lambda: None
    bar = progress(range(1, args.steps + 1), desc=f"{name}@{peak_lr:g} seed {seed}", leave=True)
    for t in bar:
        tokens = batch_at(train_data, t, args.batch, args.context, seed).to(args.device)
        lr.fill_(lr_at(t, args.steps, peak_lr, args.warmup, args.final_lr))
        kind = opt.refresh_at(t)
        compiles = t <= 2 or kind not in kinds
        evaluates = t % args.eval_every == 0 or t == args.steps
        # the hidden matrices before an evaluated step, for its update's size (peers update in place)
        before = {k: v.detach().clone() for k, v in params.items() if is_hidden(k, v)} if evaluates else {}
        if compiles and args.backend != "none":  # the bar's first rates then count compile time: say so
            bar.set_postfix_str(f"compiling step {t}'s graphs (once per run; later steps are far faster)")
        start = time.perf_counter()
        grads, loss = grad_fn(params, tokens)
        sync()  # the optimizer's share is timed apart (one more sync a step on a GPU)
        gradients_done = time.perf_counter()
        params = opt.update(params, grads, lr, kind)
        loss = float(loss)  # syncs: the wall time below covers the whole step
        end = time.perf_counter()
        if compiles:
            log["compile_s"] += end - start
            kinds.add(kind)
        else:
            wall += end - start
            log["optimizer_s"] += end - gradients_done
            log["timed_steps"] += 1
        log["step"].append(t)
        log["train_loss"].append(loss)
        log["wall"].append(wall)
        if evaluates:
            # the step's per-entry update size, lr x RMS of the direction, averaged over the hidden matrices
            sizes = [float((params[k] - W).square().mean().sqrt()) for k, W in before.items()]
            log["update_rms"].append(sum(sizes) / len(sizes) if sizes else math.nan)
            log["val_step"].append(t)
            log["val_loss"].append(evaluate(loss_fn, params, val_data, args, seed))
            log["val_wall"].append(wall)
        ms = f"{1e3 * wall / log['timed_steps']:.0f}" if log["timed_steps"] else "-"  # steps after the compiling ones
        val = f"{log['val_loss'][-1]:.3f}" if log["val_loss"] else "-"
        bar.set_postfix(loss=f"{loss:.3f}", val=val, ms=ms, compile_s=f"{log['compile_s']:.0f}")
    if final is not None:
        final[f"{name}@{peak_lr:g} seed {seed}"] = {k: v.detach().cpu().clone() for k, v in params.items()}
    return log


def steps_to_reach(log: dict, target: float) -> tuple[int, float] | None:
    """(step, wall seconds) of the first evaluation at or below ``target``."""
    for step, wall, loss in zip(log["val_step"], log["val_wall"], log["val_loss"]):
        if loss <= target:
            return step, wall
    return None


def loss_at_wall(log: dict, seconds: float) -> float:
    """The last validation loss evaluated within ``seconds`` of train-step wall time."""
    within = [loss for wall, loss in zip(log["val_wall"], log["val_loss"]) if wall <= seconds]
    return within[-1] if within else math.nan


def summarize(logs: list[dict], args) -> str:
    by_run: dict[str, list[dict]] = {}
    for log in logs:
        by_run.setdefault(f"{log['optimizer']}@{log['lr']:g}", []).append(log)
    adamw: dict[int, dict] = {}  # per seed, the best AdamW run (lowest final validation loss)
    for log in logs:
        if (
            log["optimizer"] == "adamw"
            and log["val_loss"][-1] < adamw.get(log["seed"], {"val_loss": [math.inf]})["val_loss"][-1]
        ):
            adamw[log["seed"]] = log
    lines = [
        f"Model: d_model {args.d_model}, {args.n_layers} layers, context {args.context}, batch {args.batch}; "
        f"{args.steps} steps; block size {args.block_size}; device {args.device}.",
        "",
        "| run | seeds | final val loss (mean ± std) | steps to AdamW's final val loss (per seed) | fraction of "
        "AdamW's steps | seconds to it (mean) | fraction of AdamW's seconds | val loss at AdamW's seconds | ms / step "
        "| optimizer ms / step (share) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run, group in by_run.items():
        finals = [g["val_loss"][-1] for g in group]
        spread = statistics.stdev(finals) if len(finals) > 1 else 0.0
        best = [adamw.get(g["seed"]) for g in group]
        reach = [steps_to_reach(g, b["val_loss"][-1]) if b else None for g, b in zip(group, best)]
        all_reached = bool(adamw) and all(r is not None for r in reach)
        steps_frac = (
            f"{statistics.mean(r[0] / args.steps for r in reach):.2f}"
            if all_reached
            else ("-" if not adamw else "not reached")
        )
        seconds = f"{statistics.mean(r[1] for r in reach):.1f}" if all_reached else "-"
        timed = all_reached and all(
            b["wall"][-1] > 0 for b in best
        )  # a 2-step run times nothing (steps 1 and 2 compile)
        wall_frac = f"{statistics.mean(r[1] / b['wall'][-1] for r, b in zip(reach, best)):.2f}" if timed else "-"
        at_adamw_wall = (
            f"{statistics.mean(loss_at_wall(g, b['wall'][-1]) for g, b in zip(group, best)):.4f}" if all(best) else "-"
        )
        ms = statistics.mean(1e3 * g["wall"][-1] / max(1, g["timed_steps"]) for g in group)
        optimizer_ms = statistics.mean(1e3 * g.get("optimizer_s", math.nan) / max(1, g["timed_steps"]) for g in group)
        share = f"{optimizer_ms / ms:.0%}" if ms else "-"
        per_seed = ", ".join("-" if r is None else str(r[0]) for r in reach)
        lines.append(
            f"| {run} | {len(group)} | {statistics.mean(finals):.4f} ± {spread:.4f} | {per_seed} | {steps_frac} | "
            f"{seconds} | {wall_frac} | {at_adamw_wall} | {ms:.0f} | {optimizer_ms:.1f} ({share}) | "
            f"{statistics.mean(g['compile_s'] for g in group):.0f} |"
        )
    lines += [
        "",
        f"Validation every {args.eval_every} steps on {args.eval_batches} fixed batches. 'Steps (seconds) to AdamW's "
        "final val loss': the first "
        "evaluation at or below the final validation loss of the best AdamW run (over its learning rates) with the "
        "same seed, and the wall time "
        "of the train steps until then; 'val loss at AdamW's seconds': "
        "the last evaluation within that AdamW run's total train-step time.",
    ]
    return "\n".join(lines)


def plot(logs: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:  # a bare machine (the GPU check's): the log and the summary are written
        print("matplotlib is not installed: no loss plot")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_wall) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {}
    for log in logs:
        run = f"{log['optimizer']}@{log['lr']:g}"
        color = colors.setdefault(run, f"C{len(colors)}")
        label = run if log["seed"] == min(l["seed"] for l in logs if f"{l['optimizer']}@{l['lr']:g}" == run) else None
        smooth = torch.tensor(log["train_loss"]).unfold(0, min(10, len(log["train_loss"])), 1).mean(1)
        by_step.plot(log["step"][len(log["step"]) - len(smooth) :], smooth, color=color, alpha=0.35, lw=1)
        by_step.plot(log["val_step"], log["val_loss"], color=color, marker="o", ms=3, label=label)
        by_wall.plot(log["val_wall"], log["val_loss"], color=color, marker="o", ms=3, label=label)
    by_step.set(xlabel="step", ylabel="loss (nats per byte)", title="train (faint, 10-step mean) and validation loss")
    by_wall.set(
        xlabel="wall time of the train steps (s)", ylabel="validation loss", title="validation loss against wall time"
    )
    for ax in (by_step, by_wall):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    with deterministic_flag_restored():
        _main(argv)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Each option's default, and the docstring (the epilog) as written."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter, epilog=__doc__)
    parser.add_argument(
        "--size",
        choices=list(SIZES),
        help="a model size of the scaling study, with its steps, warm-up and evaluation interval "
        + "; ".join(f"{k}: {v}" for k, v in SIZES.items())
        + " (1,024 tokens a step); options given beside it win",
    )
    # learning rates tuned on a grid of factors of ~3 at the default size (benchmarks/RESULTS.md)
    parser.add_argument(
        "--runs",
        nargs="+",
        default=["adamw@1e-3", "dash@6e-3"],
        help="OPTIMIZER@LR, e.g. adamw@1e-3 dash-ndb@3e-3; OPTIMIZER is adamw, muon, soap, psgd, dash, "
        "dash-SOLVER (eigh, ndb, cn, chebyshev), dash-defaults (DashConfig() as is) or dash-paper "
        "(DashConfig.paper())",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[0],
        help="seeds of the initialization and the batches; every run trains once per seed",
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--context", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--n-layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--n-heads", type=int, default=4, help="attention heads")
    parser.add_argument(
        "--experts",
        type=int,
        default=0,
        help="> 0: a mixture-of-experts feed-forward of this many experts, each preconditioned on its own (batch_dims)",
    )
    parser.add_argument("--block-size", type=int, default=128, help="DASH block size")
    parser.add_argument("--inv-root-freq", type=int, default=10, help="steps between DASH's inverse-root refreshes")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="decoupled weight decay of every optimizer")
    parser.add_argument("--warmup", type=int, default=20, help="linear warm-up steps, then cosine decay to --final-lr")
    parser.add_argument(
        "--final-lr", type=float, default=0.1, help="the rate at the last step, as a fraction of the peak lr"
    )
    parser.add_argument(
        "--dash-hidden-only",
        action="store_true",
        help="DASH runs take the hidden matrices only, AdamW (betas 0.9, 0.95, the same rate) the embedding, "
        "the head and the vectors, as muon runs split them",
    )
    parser.add_argument(
        "--muon-float32",
        action="store_true",
        help="muon runs take their Newton-Schulz iterations in float32 (torch.optim.Muon runs them in bfloat16, "
        "many times slower on CPUs without AVX-512 BF16)",
    )
    parser.add_argument("--eval-every", type=int, default=25, help="steps between validation losses")
    parser.add_argument("--eval-batches", type=int, default=8, help="fixed validation batches per evaluation")
    parser.add_argument("--corpus-bytes", type=int, default=4_000_000, help="bytes of standard-library source to read")
    parser.add_argument("--data", help="train on this text file instead of the standard library")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend, or none")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--out", default="runs/train_lm", help="directory for log.json, loss.png and summary.md")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch.use_deterministic_algorithms: without it Inductor's CPU code sums the embedding gradient with "
        "atomic adds from several OpenMP threads, in an order that changes from run to run (no measurable cost "
        "on CPU: benchmarks/RESULTS.md, section Reproducibility)",
    )
    parser.add_argument(
        "--eps",
        type=float,
        default=None,
        help="DASH's eps (X + eps I is inverted) for every dash run; "
        "None keeps each run's config value (DashConfig's 1e-10)",
    )
    parser.add_argument(
        "--refresh-schedule",
        choices=["periodic", "staggered"],
        default=None,
        help="DASH's refresh_schedule for every dash run; None keeps each run's config value",
    )
    add_dash_fields(parser, "for every dash run")
    parser.add_argument(
        "--save-params",
        metavar="PATH",
        help="torch.save the final parameters of every run, {'OPTIMIZER@LR seed S': {name: tensor}}",
    )
    size = parser.parse_known_args(argv)[0].size
    if size:  # the preset replaces the defaults, so an option given beside it still wins
        parser.set_defaults(**SIZES[size])
    args = parser.parse_args(argv)
    if not 0.0 <= args.final_lr <= 1.0:
        parser.error(f"--final-lr is a fraction of the peak lr in [0, 1], got {args.final_lr}")
    args.dash = dict(args.dash)
    return args


def _main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = [parse_run(spec) for spec in args.runs]
    if args.deterministic:  # warn_only off the CPU: there it is untested (no GPU was available)
        if args.device.startswith("cuda"):
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=args.device != "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = file_corpus(args.data) if args.data else stdlib_corpus(args.corpus_bytes)
    print(
        f"corpus: {len(corpus[0]):,} train bytes, {len(corpus[1]):,} validation bytes; torch {torch.__version__}, "
        f"{args.device}, {torch.get_num_threads()} threads"
    )
    progress = functools.partial(progress_bar, enabled=not args.no_progress)
    torch._dynamo.config.cache_size_limit = 64  # one graph per (optimizer config, seed's model) is expected
    model = Llama(
        LlamaConfig(
            d_model=args.d_model,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            mlp_hidden=(8 * args.d_model) // 3,
            context=args.context,
            experts=args.experts,
        )
    ).to(args.device)
    loss_fn = lambda p, tokens: next_byte_loss(model, p, tokens)
    grad_fn = torch.func.grad_and_value(loss_fn)
    if args.backend != "none":  # compiled once, shared by every run
        grad_fn = torch.compile(grad_fn, fullgraph=True, backend=args.backend)
    logs, final = [], {}
    for seed in args.seeds:
        torch.manual_seed(seed)
        for module in model.modules():  # a fresh initialization per seed, shared by every optimizer
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(module.weight, std=0.02)
        init_params = {k: v.detach().clone() for k, v in model.named_parameters()}
        print(f"seed {seed}: {sum(v.numel() for v in init_params.values()):,} parameters")
        for name, lr in runs:
            logs.append(
                train(
                    name,
                    lr,
                    seed,
                    loss_fn,
                    grad_fn,
                    init_params,
                    corpus,
                    args,
                    progress,
                    final if args.save_params else None,
                )
            )
            (out / "log.json").write_text(json.dumps({"args": vars(args), "runs": logs}))
    if args.save_params:
        torch.save(final, args.save_params)
    summary = summarize(logs, args)
    (out / "summary.md").write_text(summary + "\n")
    plot(logs, out / "loss.png")
    print("\n" + summary)
    print(f"\nwrote {out / 'log.json'}, {out / 'loss.png'}, {out / 'summary.md'}")


def progress_bar(iterable, desc: str, enabled: bool = True, **tqdm_options):
    """A tqdm bar over ``iterable`` on a terminal; where the output is not one (a log file, CI)
    a plain line at each tenth of the run instead of hundreds of carriage-return redraws; with
    ``enabled`` False, nothing."""
    if enabled and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(iterable, desc=desc, **tqdm_options)
    return _PlainProgress(iterable, desc if enabled else None, tqdm_options.get("initial", 0))


class _PlainProgress:
    """A stand-in for a tqdm bar: with a ``desc``, a line on stderr at each tenth of the run
    (its step and the last postfix; ``initial`` steps were done before, as tqdm's); with None,
    nothing."""

    def __init__(self, iterable, desc: str | None, initial: int = 0):
        self.iterable, self.desc, self.initial, self.postfix = iterable, desc, initial, ""

    def __iter__(self):
        total = self.initial + len(self.iterable)
        tenths = {max(1, total * k // 10) for k in range(1, 11)} if self.desc is not None else set()
        for done, item in enumerate(self.iterable, self.initial + 1):
            yield item
            if done in tenths:
                print(f"{self.desc}: {done}/{total} {self.postfix}".rstrip(), file=sys.stderr, flush=True)

    def set_postfix(self, **kwargs):
        self.postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def set_postfix_str(self, text: str):
        self.postfix = text


if __name__ == "__main__":
    main()
