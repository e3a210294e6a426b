"""Does DASH keep its lead as the model grows? Learning-rate sweeps and seeds at three sizes (issue 27).

    python -m benchmarks.scaling sweep --size s            # seed 0 over a grid of learning rates
    python -m benchmarks.scaling seeds --size s --seeds 1 2  # more seeds at each optimizer's best rate
    python -m benchmarks.scaling seeds --size l --seeds 0 --steps 1200  # the same rates, trained longer
    python -m benchmarks.scaling report [--plots benchmarks/results]  # tables for RESULTS, plots

Every run is one ``examples/train_lm.py --size SIZE`` run (the sizes, their steps and batch are
its ``SIZES``). ``sweep`` trains each optimizer at learning rates a factor of about 3 apart
(1, 3, 10, 30, ... x 1e-4), starting from three around its best rate at the next smaller size,
and widens the grid while the best final validation loss sits at its edge, so that the best rate
ends inside. ``seeds`` trains more seeds at the best rate of seed 0's sweep. Runs already
recorded are not trained again: every finished run is added to
``benchmarks/results/scaling/SIZE.json`` (its validation curve, wall time and the optimizer's
share of it), which ``report`` reads; an interrupted call loses only its unfinished run.
``seeds --lrs A B ...`` trains at those rates instead (the factor-2 grids of issue 39);
``seeds --again`` retrains runs already recorded, replacing them (another machine's runs, or
runs from before the update size was logged).
``seeds --steps N`` trains at the same best rates for N steps instead of the size's preset (the
warm-up unchanged, the cosine decay stretched to N) and records in ``SIZE-N.json``: whether a
result at one size is a matter of training length.

The data axis (issue 54): ``sweep`` and ``seeds`` with ``--tokens-per-param T`` train on a budget
of T tokens per parameter at a batch of ``--batch`` sequences (128 by default, 8x the presets'
1,024 tokens a step), on the whole standard-library corpus (12.2M training bytes with Python
3.11: size s reads 9.2M of them at T = 20), with the warm-up the same share of the steps as in
the size's preset; each budget is a study of its own, ``SIZE-tppT-bB.json``, swept on a factor-2
grid of rates from the size's best rate:

    python -m benchmarks.scaling sweep --size s --tokens-per-param 20 --optimizers adamw muon dash-defaults
    python -m benchmarks.scaling seeds --size s --tokens-per-param 20 --seeds 1

The optimizers (``--optimizers``): AdamW, torch.optim.Muon (AdamW on the embedding, head and
vectors), DASH at its defaults (``DashConfig()``: blocks of 256, eigh roots on the CPU refreshed
in a staggered tenth every step under torch.compile, inverse cube roots, a relative floor and
Nesterov's look-ahead), and the main job's best DASH before the defaults changed (NDB roots,
blocks of 128, eps 1e-6). ``dash-previous`` is the defaults before the scaling study changed
them (inverse 4th roots, no floor, the gradient EMA itself): the labels measured then
(``dash-periodic``, ``dash-bf16``, ``dash-block512``, ``dash-previous-ndb`` and one option each
of issue 39) are variations of it, at its best rate (``seeds --optimizers dash-periodic
dash-bf16 --rate-of dash-previous``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import machine_line
from benchmarks.scaling_records import SIZES, best_rate, load, params_of, record
from benchmarks.scaling_report import report
from examples.train_lm import SIZES as PRESETS  # each size's model, steps and warm-up

ROOT = Path(__file__).resolve().parent.parent

BF16 = "bfloat16"
PRECISIONS = ["float32", "tf32", BF16, "float16"]
# the fields whose defaults the study changed, at their values before (benchmarks/RESULTS.md,
# "Update rules"): the labels recorded before the change pin them, so that their records keep
# their meaning; "dash-defaults" is the library's defaults now (the "dash-combo10" of the runs
# that chose them), "dash-previous" the defaults before
PREVIOUS = ["root_order=4", "eps_rel=0", "nesterov_G=false"]


def _previous(*fields: str) -> list[str]:
    """``--dash`` with the previous defaults, then ``fields`` (later fields win)."""
    return ["--dash", *PREVIOUS, *fields]


# label: (train_lm's OPTIMIZER, its extra arguments)
OPTIMIZERS = {
    "adamw": ("adamw", []),
    "muon": ("muon", []),
    "dash-defaults": ("dash-defaults", []),
    # the defaults as they resolve off the CPU (solver="auto" is coupled Newton for root_order 3)
    "dash-defaults-cn": ("dash-defaults", ["--dash", "solver=cn"]),
    "dash-previous": ("dash-defaults", _previous()),
    "dash-ndb": ("dash-ndb", ["--block-size", "128", "--eps", "1e-6", *_previous()]),
    "dash-periodic": ("dash-defaults", ["--refresh-schedule", "periodic", *_previous()]),
    "dash-bf16": ("dash-defaults", _previous(f"root_dtype={BF16}", f"grad_ema_dtype={BF16}", f"graft_dtype={BF16}")),
    # blocks as wide as the model at size l (the defaults' 256 is d_model at size m)
    "dash-block512": ("dash-defaults", _previous("block_size=512")),
    # the previous defaults as they resolved off the CPU (solver="auto" was NDB there): the
    # solver apart from dash-ndb's blocks of 128 and eps 1e-6
    "dash-previous-ndb": ("dash-defaults", _previous("solver=ndb")),
    # the previous defaults with one option or lever changed (docs/ALGORITHM.md 4 e, 4 f, 5.6)
    "dash-rms": ("dash-defaults", _previous("grafting=rms")),
    "dash-floor": ("dash-defaults", _previous("eps_rel=1e-5")),
    "dash-nesterov": ("dash-defaults", _previous("nesterov_G=true")),
    "dash-order3": ("dash-defaults", _previous("root_order=3")),
    "dash-betaG95": ("dash-defaults", _previous("beta_G=0.95")),
    "dash-freq3": ("dash-defaults", _previous("inv_root_freq=3")),
    "dash-betaLR9": ("dash-defaults", _previous("beta_LR=0.9")),
    "dash-spectral": ("dash-defaults", _previous("grafting=spectral")),
    # the options that helped alone at size s, together: DashConfig.tuned(), the defaults with
    # roots every 3 steps
    "dash-combo": ("dash-defaults", ["--dash", "inv_root_freq=3"]),
    # issue 54's candidates for a lead lost at short budgets, each one change to today's defaults:
    # roots refreshed every step, a factor EMA of a shorter horizon, no relative floor, smaller blocks
    "dash-defaults-freq1": ("dash-defaults", ["--dash", "inv_root_freq=1"]),
    "dash-defaults-betaLR8": ("dash-defaults", ["--dash", "beta_LR=0.8"]),
    # and for the lead that shrinks with data: a factor EMA of a longer horizon (100 steps, not 20)
    "dash-defaults-betaLR99": ("dash-defaults", ["--dash", "beta_LR=0.99"]),
    "dash-defaults-nofloor": ("dash-defaults", ["--dash", "eps_rel=0"]),
    "dash-defaults-block128": ("dash-defaults", ["--dash", "block_size=128"]),
    # the defaults under the periodic schedule: every root at the first step and every 10th, so
    # no block waits up to 9 steps for its first root (the staggered schedule's phases)
    "dash-defaults-periodic": ("dash-defaults", ["--refresh-schedule", "periodic"]),
    # every root refreshed on each of the first 100 steps (inv_root_warmup), then the defaults'
    # staggered slices: how much of roots-every-step's gain is early?
    "dash-defaults-warmup100": ("dash-defaults", ["--dash", "inv_root_warmup=100"]),
    # the learning-rate schedule's end: cosine decay to 0 instead of train_lm's 10% of the peak,
    # for DASH and for Muon alike (the gap between them is what a schedule could change)
    "dash-defaults-lrend0": ("dash-defaults", ["--final-lr", "0"]),
    "muon-lrend0": ("muon", ["--final-lr", "0"]),
    # Muon with its Newton-Schulz iterations in float32, on CPUs whose bfloat16 products are slow
    # (benchmarks/studies/muon_precision.py): the same math at higher precision
    "muon-fp32": ("muon", ["--muon-float32"]),
    # the fairness row: DASH on the hidden matrices only, AdamW on the rest, as the Muon runs
    "dash-hidden": ("dash-defaults", ["--dash-hidden-only", *_previous()]),
    # issue 40: Adam in the factors' eigenbases (docs/ALGORITHM.md 4 k), otherwise the previous
    # defaults (eigh bases on the CPU, refreshed in a staggered tenth every step; the exponent and
    # the floor do not apply)
    "dash-ec": ("dash-defaults", ["--dash", "preconditioner=eigenvalue_corrected", "nesterov_G=false"]),
    # the mode on top of today's defaults: Nesterov's look-ahead of the gradient EMA rotated
    "dash-ec-nesterov": ("dash-defaults", ["--dash", "preconditioner=eigenvalue_corrected"]),
    # the same with orthogonal-iteration bases (one step per refresh from the previous basis, as
    # off the CPU; qr2: two steps): how much of eigh's loss do they keep?
    "dash-ec-qr": ("dash-defaults", ["--dash", "preconditioner=eigenvalue_corrected", "solver=qr"]),
    "dash-ec-qr2": ("dash-defaults", ["--dash", "preconditioner=eigenvalue_corrected", "solver=qr", "qr_steps=2"]),
    "dash-ec-freq3": (
        "dash-defaults",
        ["--dash", "preconditioner=eigenvalue_corrected", "nesterov_G=false", "inv_root_freq=3"],
    ),
    # issue 53: the defaults with each DashConfig.precision, paired by seed with the same defaults
    # in float32 on the same machine ("precision-P"); with coupled Newton, the GPU's solver for the
    # default cube roots ("precision-cn-P"); and the eigenvalue-corrected mode with orthogonal-
    # iteration bases, its solver off the CPU, whose X Q products the precision also rounds
    # ("precision-ec-P").
    # A CPU without a precision's matrix unit emulates it: the numerics of the GPU's products.
    **{f"precision-{p}": ("dash-defaults", ["--dash", f"precision={p}"]) for p in PRECISIONS},
    **{f"precision-cn-{p}": ("dash-defaults", ["--dash", "solver=cn", f"precision={p}"]) for p in PRECISIONS},
    **{
        f"precision-ec-{p}": (
            "dash-defaults",
            ["--dash", "preconditioner=eigenvalue_corrected", "solver=qr", f"precision={p}"],
        )
        for p in PRECISIONS
    },
}
SWEPT = ["adamw", "muon", "dash-defaults", "dash-ndb"]
# the best rates of the main job (size s; docs/guide/configuration.md), where the first sweep starts
START = {"adamw": 1e-3, "muon": 1e-2, "dash-defaults": 3e-3, "dash-ndb": 3e-3}
MAX_GRID = 7  # rates one optimizer may try at one size before the sweep gives up widening


def grid_rate(index: int, factor: int = 3) -> float:
    """The index-th rate of a grid: factor 3, 1e-4, 3e-4, 1e-3, 3e-3, ... (index 0 is 1e-4);
    factor 2, 1e-3 x 2^index to three digits (index 0 is 1e-3)."""
    if factor == 2:
        return float(f"{1e-3 * 2.0**index:.3g}")
    return float(f"{(1, 3)[index % 2]}e{index // 2 - 4}")


def grid_index(rate: float, factor: int = 3) -> int:
    return min(range(-16, 24), key=lambda i: abs(math.log(grid_rate(i, factor) / rate)))


CONTEXT = 64  # bytes per sequence (train_lm's --context)
DATA_BATCH = 128  # sequences a step on the data axis: 8x the presets' 16
WHOLE_CORPUS = 1 << 40  # train_lm's --corpus-bytes that reads every file of the standard library


@dataclass(frozen=True)
class Study:
    """A results file and what its runs train beside ``train_lm --size``: the size's preset;
    ``steps`` instead of the preset's (``SIZE-N``); or a budget of ``tokens_per_param`` at
    ``batch`` sequences a step (``SIZE-tppT-bB``, the data axis)."""

    size: str
    steps: int | None = None
    tokens_per_param: float | None = None
    batch: int = DATA_BATCH

    @property
    def name(self) -> str:
        if self.tokens_per_param is not None:
            return f"{self.size}-tpp{self.tokens_per_param:g}-b{self.batch}"
        return self.size if self.steps is None else f"{self.size}-{self.steps}"

    @property
    def factor(self) -> int:
        """The rate grid's factor: 2 on the data axis, else the study's original 3."""
        return 2 if self.tokens_per_param is not None else 3

    def arguments(self) -> list[str]:
        """train_lm's options beside ``--size``."""
        if self.tokens_per_param is None:
            return [] if self.steps is None else ["--steps", str(self.steps)]
        preset = PRESETS[self.size]
        steps = max(1, round(self.tokens_per_param * params_of(preset) / (self.batch * CONTEXT)))
        warmup = max(1, round(steps * preset["warmup"] / preset["steps"]))
        options = {"steps": steps, "batch": self.batch, "warmup": warmup, "eval-every": max(1, steps // 20)}
        return [*(x for k, v in options.items() for x in (f"--{k}", str(v))), "--corpus-bytes", str(WHOLE_CORPUS)]


def train(study: Study, label: str, rates: list[float], seeds: list[int], progress: bool, again: bool = False) -> None:
    """Train ``study``'s runs not yet recorded (``again``: every run, each replacing its record),
    in one train_lm process per set of rates (its compiled gradient shared by the rates and
    seeds), and record each as soon as its process has logged it."""
    name, extra = OPTIMIZERS[label]
    results = study.name
    done = set() if again else {(r["lr"], r["seed"]) for r in load(results) if r["optimizer"] == label}
    by_rates: dict[tuple, list[int]] = {}
    for seed in seeds:
        todo = tuple(lr for lr in rates if (lr, seed) not in done)
        if todo:
            by_rates.setdefault(todo, []).append(seed)
    for todo, todo_seeds in by_rates.items():
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, str(ROOT / "examples" / "train_lm.py"), "--size", study.size]
            command += ["--seeds", *map(str, todo_seeds), "--runs", *(f"{name}@{lr:g}" for lr in todo), *extra]
            command += study.arguments()
            command += ["--out", out] + ([] if progress else ["--no-progress"])
            print(f"$ {label}:", " ".join(command[1:]), flush=True)
            finished = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            log = Path(out) / "log.json"
            if log.exists():
                logged = json.loads(log.read_text())
                record(results, [summary(label, r, logged["args"]) for r in logged["runs"]])
            if finished.returncode:
                raise SystemExit(f"train_lm failed ({finished.returncode}); finished runs are recorded")


def summary(label: str, run: dict, args: dict) -> dict:
    """What the report needs of one train_lm run: its validation curve and timings."""
    keep = ["lr", "seed", "val_step", "val_loss", "val_wall", "timed_steps", "optimizer_s", "compile_s"]
    model = {k: args[k] for k in ["d_model", "n_layers", "n_heads", "steps", "batch", "context", "warmup"]}
    return {
        "optimizer": label,
        **{k: run[k] for k in keep},
        **({"update_rms": run["update_rms"]} if "update_rms" in run else {}),  # runs since issue 39
        "wall": run["wall"][-1],
        "model": model,
        "machine": machine_line(),
    }


def sweep(study: Study, label: str, progress: bool) -> float:
    """Seed 0 over a grid widened until its best rate is inside; returns that rate. A size's
    preset starts from the best rate at the next smaller size, a data-axis budget from the
    best rate of its size's preset."""
    size, factor = study.size, study.factor
    if study.tokens_per_param is None:
        smaller = SIZES[: SIZES.index(size)]
        center = next((best_rate(s, label) for s in reversed(smaller) if best_rate(s, label)), START[label])
    else:
        center = best_rate(size, label) or START[label]
    tried = {grid_index(r["lr"], factor) for r in load(study.name) if r["optimizer"] == label and r["seed"] == 0}
    tried |= {grid_index(center, factor) + d for d in (-1, 0, 1)}
    while True:
        train(study, label, sorted(grid_rate(i, factor) for i in tried), [0], progress)
        best = grid_index(best_rate(study.name, label), factor)
        edge = {min(tried): best - 1, max(tried): best + 1}.get(best)
        if edge is None or len(tried) >= MAX_GRID:
            return grid_rate(best, factor)
        tried.add(edge)


def main(argv: list[str] | None = None) -> None:
    class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Each option's default, and the docstring (the epilog) as written."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter, epilog=__doc__)
    parser.add_argument("command", choices=["sweep", "seeds", "report"], help="what to do (see below)")
    parser.add_argument("--size", choices=SIZES, default="s", help="train_lm's --size of the runs")
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=SWEPT, help="what to train")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="the seeds the seeds command trains")
    parser.add_argument(
        "--rate-of",
        choices=[*SWEPT, "dash-previous"],
        help="seeds: train at this optimizer's best rate instead of each one's own",
    )
    parser.add_argument("--steps", type=int, help="seeds: train this many steps instead of the size's preset")
    parser.add_argument(
        "--tokens-per-param", type=float, help="sweep, seeds: the data axis's budget of tokens per parameter"
    )
    parser.add_argument(
        "--batch", type=int, default=DATA_BATCH, help="with --tokens-per-param: sequences of 64 bytes a step"
    )
    parser.add_argument(
        "--lrs", nargs="+", type=float, help="seeds: train at these rates instead of the best (a finer grid)"
    )
    parser.add_argument(
        "--again", action="store_true", help="seeds: retrain runs already recorded (on this machine), replacing them"
    )
    parser.add_argument("--plots", default=str(ROOT / "benchmarks" / "results"), help="report: folder of the plots")
    parser.add_argument("--progress", action="store_true", help="train_lm's progress bars")
    args = parser.parse_args(argv)
    if args.steps is not None and (args.command != "seeds" or args.steps < 1):
        parser.error("--steps is a positive step count for the seeds command (a sweep tunes at the preset's steps)")
    if args.tokens_per_param is not None and (args.tokens_per_param <= 0 or args.batch < 1 or args.steps is not None):
        parser.error("--tokens-per-param is a positive budget and --batch a positive count, without --steps")
    study = Study(args.size, args.steps, args.tokens_per_param, args.batch)
    if args.command == "sweep":
        for label in args.optimizers:
            print(f"{label} in {study.name}: best rate {sweep(study, label, args.progress):g}", flush=True)
    elif args.command == "seeds":
        # the rate of the sweep at this budget; runs trained longer take their size's
        tuned_at = study.name if study.tokens_per_param is not None else args.size
        for label in args.optimizers:
            rate = best_rate(tuned_at, args.rate_of or label)
            if rate is None and not args.lrs:
                raise SystemExit(f"no sweep of {args.rate_of or label} in {tuned_at}: run sweep first")
            train(study, label, args.lrs or [rate], args.seeds, args.progress, args.again)
    else:
        report(args.plots)


if __name__ == "__main__":
    main()
