"""The main job's final validation loss under each storage option (or thin blocks), beside the default's, seed by seed.

    python -m benchmarks.storage_loss [--seeds 0 1 2] [--steps 300] [--out runs/storage_loss]
        [--plot benchmarks/results/storage_loss.png] [--options OPTION ...] [--baseline defaults]
        [--model-args="--d-model 64 --block-size 256"]

Runs ``examples/train_lm.py --runs dash@3e-3`` once per option (``--dash FIELD=VALUE ...``), every
seed in that process, and prints a markdown table: the final validation loss per seed, mean ±
standard deviation, the mean's distance from the default's in units of the default's standard
deviation (issue 26's test: within one), and the paired difference from the default (a seed
fixes the data order and the initial weights for every option, so the per-seed difference
isolates the option): its mean ± standard error. ``--plot`` draws those per-seed differences.
Each run's log stays under ``--out``, where a later call with more seeds finds the ones already
trained. Thin blocks are compared the same way, on a model whose embedding and head are thin at
its block size: ``--options thin_ratio=inf thin_ratio=4 --baseline thin_ratio=inf
--model-args="--d-model 64 --block-size 256" --out runs/thin_loss``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BF16 = "bfloat16"
OPTIONS = {
    "defaults": [],
    "root_dtype=bf16": [f"root_dtype={BF16}"],
    "grad_ema_dtype=bf16": [f"grad_ema_dtype={BF16}"],
    "graft_dtype=bf16": [f"graft_dtype={BF16}"],
    "factor_dtype=bf16": [f"factor_dtype={BF16}"],
    "grad_ema + graft bf16": [f"grad_ema_dtype={BF16}", f"graft_dtype={BF16}"],
    "root + grad_ema bf16": [f"root_dtype={BF16}", f"grad_ema_dtype={BF16}"],
    "root + grad_ema + graft bf16": [f"root_dtype={BF16}", f"grad_ema_dtype={BF16}", f"graft_dtype={BF16}"],
    "all four bf16": [f"root_dtype={BF16}", f"grad_ema_dtype={BF16}", f"graft_dtype={BF16}", f"factor_dtype={BF16}"],
    "thin_ratio=inf": ["thin_ratio=inf"],
    "thin_ratio=4": ["thin_ratio=4"],
}
STORAGE = [label for label in OPTIONS if not label.startswith("thin")]


def run(label: str, fields: list[str], args) -> list[float]:
    """Final validation losses of one option, by seed: read from the logs under --out, the
    seeds no log holds yet trained first (in one process, their log in a folder of their own)."""
    out = Path(args.out) / label.replace(" ", "_").replace("+", "and")
    if args.rerun and out.exists():
        shutil.rmtree(out)
    missing = [s for s in args.seeds if s not in logged(out)]
    if missing:
        folder = out / ("seeds_" + "_".join(map(str, missing)))
        command = [sys.executable, str(ROOT / "examples" / "train_lm.py"), "--runs", args.run, "--no-progress"]
        command += ["--steps", str(args.steps), "--out", str(folder), "--seeds", *map(str, missing)]
        command += args.model_args.split()
        command += ["--dash", *fields] if fields else []
        print("$", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    found = logged(out)
    return [found[s] for s in args.seeds]


def logged(out: Path) -> dict[int, float]:
    """Final validation loss by seed, from every train_lm log under ``out``."""
    found = {}
    for log in sorted(out.rglob("log.json")):
        for r in json.loads(log.read_text())["runs"]:
            found[r["seed"]] = r["val_loss"][-1]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of every option's runs")
    parser.add_argument("--steps", type=int, default=300, help="training steps per run")
    parser.add_argument("--run", default="dash@3e-3", help="train_lm.py's OPTIMIZER@LR")
    parser.add_argument(
        "--options", nargs="+", choices=list(OPTIONS), default=STORAGE, metavar="OPTION", help="options to train"
    )
    parser.add_argument("--baseline", choices=list(OPTIONS), default="defaults", help="the option compared against")
    parser.add_argument("--model-args", default="", help="train_lm.py arguments of the model, e.g. '--d-model 64'")
    parser.add_argument("--out", default="runs/storage_loss", help="directory of the runs' logs (one per option)")
    parser.add_argument("--plot", help="write the per-seed differences from the baseline to this PNG")
    parser.add_argument("--rerun", action="store_true", help="train again where a log exists")
    args = parser.parse_args(argv)
    finals = {label: run(label, OPTIONS[label], args) for label in args.options}
    base = finals.get(args.baseline)
    std = statistics.stdev(base) if base and len(base) > 1 else None
    seeds = " | ".join(f"seed {s}" for s in args.seeds)
    print(
        f"\n| option | {seeds} | mean ± std | mean minus {args.baseline}, in its std | paired difference, mean ± s.e. |"
    )
    print("|---|" + "---|" * len(args.seeds) + "---|---|---|")
    for label, losses in finals.items():
        spread = statistics.stdev(losses) if len(losses) > 1 else 0.0
        mean = statistics.mean(losses)
        distance = f"{(mean - statistics.mean(base)) / std:+.2f}" if base and std else "-"
        paired = "-"
        if base and label != args.baseline and len(losses) > 1:
            diffs = [x - b for x, b in zip(losses, base)]
            paired = f"{statistics.mean(diffs):+.4f} ± {statistics.stdev(diffs) / len(diffs) ** 0.5:.4f}"
        cells = " | ".join(f"{x:.4f}" for x in losses)
        print(f"| {label} | {cells} | {mean:.4f} ± {spread:.4f} | {distance} | {paired} |")
    if args.plot and base:
        plot({k: [x - b for x, b in zip(v, base)] for k, v in finals.items() if k != args.baseline}, std, args)


def plot(differences: dict[str, list[float]], std: float | None, args) -> None:
    """Per-seed final-loss differences from the default, one row per option, with the band of
    one default standard deviation (the issue's tolerance) shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(differences) + 1.8))
    if std:
        ax.axvspan(-std, std, color="0.9")
    ax.axvline(0.0, color="0.4", lw=0.8)
    for row, diffs in enumerate(differences.values()):
        ax.plot(diffs, [row] * len(diffs), "o", ms=4, alpha=0.6, color="C0")
        ax.plot([statistics.mean(diffs)], [row], "|", ms=14, mew=2.5, color="C3")
    ax.set_yticks(range(len(differences)), list(differences))
    ax.invert_yaxis()
    ax.set_xlabel(
        f"final validation loss minus that of {args.baseline}, same seed (dots: seeds; bar: their mean)\n"
        f"grey: ± one standard deviation of {args.baseline}'s final losses over the seeds"
    )
    seeds = f"seeds {args.seeds[0]}-{args.seeds[-1]}" if len(args.seeds) > 1 else f"seed {args.seeds[0]}"
    ax.set_title(" ".join(f"main job {args.model_args}, {args.steps} steps, {seeds}".split()), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
