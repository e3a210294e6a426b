"""Step time, step by step: the periodic refresh schedule (a saw-tooth) beside the staggered one.

    python -m benchmarks.stagger_bench                  # eager and compiled, then DDP at W = 2
    python -m benchmarks.stagger_bench --modes eager --steps 50 --no-ddp
    python -m benchmarks.stagger_bench --quick          # tiny sizes: a smoke run

The model is benchmarks/peers.py's: 3 x Linear(d, d) with bias (d = 1024), block 256, solver
eigh, inv_root_freq 10, preconditioning from step 1, otherwise DashConfig's defaults. Only
``dash_fn.step`` is timed (fixed gradients, no forward or backward), each step on its own.

Per mode (``eager``: ``dash_fn.step``; ``compiled``: ``torch.compile(dash_fn.step,
fullgraph=True)``, Inductor; the periodic schedule passes ``refresh=`` from the host, two
graphs, the staggered one takes none, one graph) both schedules warm up for two periods, then
time ``--steps`` consecutive steps each, taken in turns of one period (10 steps) per schedule
so that machine load falls on both alike, ``--reps`` times. ``--ddp`` repeats the eager runs with W = 2 processes
(gloo, one thread each, ``process_group=WORLD``): every rank times each step after a barrier,
and a step's time is its slowest rank's (the all-gather makes the others wait for it).

Printed: per mode and schedule the mean, median and slowest of the consecutive steps (ms),
slowest / median (each run's too) and the mean over the periodic mean, each the median over
the runs. ``--out`` gets ``stagger_steps.json`` (every
step's time) and ``stagger_steps.png`` (step time against step: saw-tooth against flat).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dash_fn
from benchmarks.machine import machine_line

SCHEDULES = ("periodic", "staggered")


def problem(args) -> tuple[dict, dict]:
    gen = torch.Generator().manual_seed(0)
    shapes = {
        f"{i}.{kind}": shape for i in range(3) for kind, shape in (("weight", (args.d, args.d)), ("bias", (args.d,)))
    }
    params = {k: torch.randn(s, generator=gen) * 0.02 for k, s in shapes.items()}
    grads = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    return params, grads


class Runner:
    """One schedule's optimizer: ``run(n)`` takes n steps, returning each one's seconds."""

    def __init__(self, schedule: str, args, compiled: bool, process_group=None):
        self.params, self.grads = problem(args)
        config = dash_fn.DashConfig(
            block_size=args.block_size, solver="eigh", inv_root_freq=args.freq, refresh_schedule=schedule
        )
        self.state = dash_fn.init(self.params, config, process_group)
        self.step = torch.compile(dash_fn.step, fullgraph=True) if compiled else dash_fn.step
        self.lr = torch.tensor(1e-3) if compiled else 1e-3
        self.t, self.group = 0, process_group

    def run(self, n: int) -> list[float]:
        times = []
        for _ in range(n):
            self.t += 1
            refresh = dash_fn.is_refresh_step(self.state["config"], self.t)
            if self.group is not None:
                dist.barrier(self.group)
            start = time.perf_counter()
            self.params, self.state = self.step(self.params, self.grads, self.state, lr=self.lr, refresh=refresh)
            times.append(time.perf_counter() - start)
        return times


def side_by_side(args, compiled: bool, process_group=None) -> dict[str, list[list[float]]]:
    """Per schedule, ``--reps`` runs of ``--steps`` consecutive step times."""
    runners = {s: Runner(s, args, compiled, process_group) for s in SCHEDULES}
    for runner in runners.values():
        runner.run(2 * args.freq)  # warm-up (and compilation): two periods
    times: dict[str, list[list[float]]] = {s: [] for s in SCHEDULES}
    for _ in range(args.reps):
        for s in SCHEDULES:
            times[s].append([])
        while len(times["staggered"][-1]) < args.steps:
            for s, runner in runners.items():  # in turns of one period, so that load falls on both
                times[s][-1] += runner.run(min(args.freq, args.steps - len(times[s][-1])))
    return times


def ddp_worker(rank: int, args, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    times = side_by_side(args, compiled=False, process_group=dist.group.WORLD)
    torch.save(times, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def ddp_times(args) -> dict[str, list[list[float]]]:
    """Per schedule and run, each step's time on its slowest rank (W = 2)."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(ddp_worker, args=(args, os.path.join(out, "init"), out), nprocs=2)
        ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    return {s: [[max(step) for step in zip(*runs)] for runs in zip(*(r[s] for r in ranks))] for s in SCHEDULES}


def report(label: str, times: dict[str, list[list[float]]]) -> list[str]:
    """One row per schedule: medians over the runs of each run's statistics."""
    rows = []
    periodic_means = [statistics.mean(run) for run in times["periodic"]]
    for s, runs in times.items():
        means = [statistics.mean(run) for run in runs]
        medians = [statistics.median(run) for run in runs]
        slowest = [max(run) for run in runs]
        spikes = [m / x for m, x in zip(slowest, medians)]
        ratio = statistics.median(m / p for m, p in zip(means, periodic_means))
        rows.append(
            f"| {label} | {s} | {statistics.median(means) * 1e3:.1f} | {statistics.median(medians) * 1e3:.1f} | "
            f"{statistics.median(slowest) * 1e3:.1f} | {statistics.median(spikes):.2f} "
            f"({', '.join(f'{x:.2f}' for x in spikes)}) | {ratio:.2f}x |"
        )
    return rows


def plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8), squeeze=False)
    for ax, (label, times) in zip(axes[0], results.items()):
        for s, runs in times.items():  # the first run
            ax.plot(range(1, len(runs[0]) + 1), [x * 1e3 for x in runs[0]], marker=".", label=s)
        ax.set_title(label)
        ax.set_xlabel("consecutive step")
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle("dash_fn step time: periodic refresh (every 10th step) vs staggered (1/10 each step)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--d", type=int, default=1024, help="width of the 3 x Linear(d, d) model")
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--freq", type=int, default=10, help="inv_root_freq")
    parser.add_argument("--steps", type=int, default=50, help="timed consecutive steps per schedule")
    parser.add_argument("--reps", type=int, default=3, help="runs of --steps consecutive steps per schedule")
    parser.add_argument(
        "--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"], help="step kinds to time"
    )
    parser.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True, help="W = 2 eager runs too")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (one process)")
    parser.add_argument("--quick", action="store_true", help="d 64, block 16, 20 steps: a smoke run")
    parser.add_argument("--out", default="benchmarks/results", help="directory for stagger_steps.json and .png")
    args = parser.parse_args(argv)
    if args.quick:
        args.d, args.block_size, args.steps = 64, 16, 20
    torch.set_num_threads(args.threads)
    print(f"3 x Linear({args.d}, {args.d}), block {args.block_size}, eigh, f = {args.freq}; {machine_line()}\n")
    results = {}
    for mode in args.modes:
        results[mode] = side_by_side(args, compiled=mode == "compiled")
    if args.ddp:
        results["DDP W=2 (slowest rank)"] = ddp_times(args)
    print("| run | schedule | mean ms | median ms | slowest ms | slowest / median (each run) | mean vs periodic |")
    print("|---|---|---|---|---|---|---|")
    for label, times in results.items():
        print("\n".join(report(label, times)))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stagger_steps.json").write_text(json.dumps({"args": vars(args), "seconds": results}, indent=1))
    plot(results, out / "stagger_steps.png")
    print(f"\nwrote {out / 'stagger_steps.json'} and {out / 'stagger_steps.png'}")


if __name__ == "__main__":
    main()
