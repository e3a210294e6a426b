"""The eigh refresh against its floor: the same eighs as independent single-threaded LAPACK calls on every core.

    python -m benchmarks.eigh_floor                         # peers.py's model: 3 x (1024, 1024), block 256
    python -m benchmarks.eigh_floor --d-model 2048 --reps 5
    python -m benchmarks.eigh_floor --quick                 # tiny sizes: a smoke run

dash_fn's state for peers.py's model (3 x Linear(d, d), block 256, eigh) takes one step on
random gradients, so that its factor stacks hold G G^T; the stacks
are then refreshed, timed three ways in turn per repetition (round-robin, median of ``--reps``):

- **floor**: ``torch.get_num_threads()`` worker processes, each single-threaded (torch and
  MKL), each holding its share of the blocks (consecutive, as even as the counts allow), each
  timing a loop of ``torch.linalg.eigh`` over its blocks one at a time: the slowest worker's
  time. Separate processes share nothing but the memory bus, so this is what the hardware
  gives for these LAPACK calls; it excludes the roots' reconstruction ``Q diag Q^T``.
- **solver**: ``dash_fn.roots.eigh_cpu.eigh_root`` on each stack (eigh and the root's
  reconstruction, the stack split over threads).
- **refresh**: ``dash_fn.roots.refresh_roots`` on each stack, as a step runs it (padding
  check, eigh, the root's reconstruction, the fallback mask).

The ratio refresh / floor is what issue 12 asks to bring to 1.2.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

import dash_fn
from benchmarks.machine import machine_line
from benchmarks.plain_step import timed
from dash_fn.roots import refresh_roots
from dash_fn.roots.eigh_cpu import eigh_root


def factor_stacks(d: int, block: int) -> tuple[list[torch.Tensor], dash_fn.DashConfig, list[int]]:
    """The factor stacks (and their root orders) of 3 x Linear(d, d) after one step."""
    config = dash_fn.DashConfig(block_size=block, solver="eigh", refresh_schedule="periodic")
    gen = torch.Generator().manual_seed(0)
    params = {f"{i}.weight": torch.randn(d, d, generator=gen) / d**0.5 for i in range(3)}
    state = dash_fn.init(params, config)
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
    dash_fn.step(params, grads, state, lr=0.0, refresh=False)
    plan = state["plan"]
    stacks = [state["factors", str(k), "F"] for k in range(len(plan.factors))]
    return stacks, config, [s.order for s in plan.factors]


def _worker(blocks: torch.Tensor, reps: int, start, done, out) -> None:
    """One single-threaded process: eigh of each block, one call each, timed ``reps`` times."""
    torch.set_num_threads(1)
    os.environ["MKL_NUM_THREADS"] = "1"
    for block in blocks[:1]:  # warm LAPACK's workspace
        torch.linalg.eigh(block)
    times = []
    for _ in range(reps):
        start.wait()
        t0 = time.perf_counter()
        for block in blocks:
            torch.linalg.eigh(block)
        times.append(time.perf_counter() - t0)
        done.wait()
    out.put(times)


class Floor:
    """The worker processes of the floor, started once; :meth:`run` times one repetition."""

    def __init__(self, blocks: torch.Tensor, workers: int, reps: int):
        ctx = multiprocessing.get_context("spawn")
        self.start, self.done, self.out = ctx.Barrier(workers + 1), ctx.Barrier(workers + 1), ctx.Queue()
        self.procs = [
            ctx.Process(target=_worker, args=(share.clone(), reps, self.start, self.done, self.out))
            for share in blocks.chunk(workers)
        ]
        for p in self.procs:
            p.start()

    def run(self) -> None:
        self.start.wait()
        self.done.wait()

    def seconds(self) -> list[float]:
        """Per repetition, the slowest worker's seconds (the workers start together)."""
        per_worker = [self.out.get() for _ in self.procs]
        for p in self.procs:
            p.join()
        return [max(times) for times in zip(*per_worker)]


def main(argv=None) -> dict:
    class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Each option's default, and the docstring (the epilog) as written."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter, epilog=__doc__)
    parser.add_argument("--d-model", type=int, default=1024, help="the model is 3 x Linear(d_model, d_model)")
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--reps", type=int, default=7, help="round-robin repetitions (medians reported)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (d_model 64, block 16, 2 reps): a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.block_size, args.reps = 64, 16, 2
    stacks, config, orders = factor_stacks(args.d_model, args.block_size)
    workers = torch.get_num_threads()
    blocks = torch.cat(stacks)
    floor = Floor(blocks, workers, args.reps)
    roots = [torch.eye(s.shape[-1]).repeat(s.shape[0], 1, 1) for s in stacks]
    kinds = {
        "solver": lambda: [
            eigh_root(s, p, config.eps, config.eigh_heuristic, config.eps_rel) for s, p in zip(stacks, orders)
        ],
        "refresh": lambda: [refresh_roots(s, r, p, config, None) for s, r, p in zip(stacks, roots, orders)],
    }
    times = {name: [] for name in kinds}
    for fn in kinds.values():
        fn()  # warm-up
    for _ in range(args.reps):  # round-robin: machine load falls on every kind alike
        floor.run()
        for name, fn in kinds.items():
            times[name].append(timed(fn, 1))
    result = {"floor": statistics.median(floor.seconds()), **{name: statistics.median(t) for name, t in times.items()}}
    print(machine_line())
    print(
        f"3 x Linear({args.d_model}, {args.d_model}), block {args.block_size}: {len(blocks)} eighs of "
        f"{', '.join(f'{s.shape[0]} x {s.shape[-1]}' for s in stacks)}; {workers} workers for the floor; "
        f"median of {args.reps}"
    )
    print("| what | ms | / floor |")
    print("|---|---|---|")
    for name, seconds in result.items():
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds / result['floor']:.2f} |")
    return result


if __name__ == "__main__":
    main()
