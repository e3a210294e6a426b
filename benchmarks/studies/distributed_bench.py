# A study (benchmarks/studies/README.md): kept as it ran, not maintained, imported by no test.
# Ran at: 16798f0 (2026-11-29; this script as of a2dcae6), on the 2-core development VM:
#   python benchmarks/distributed_bench.py             (today: python -m benchmarks.studies.distributed_bench)
#   python benchmarks/distributed_bench.py --solver ndb
#   python benchmarks/distributed_bench.py --world-sizes 1 --threads 2
# Figures: benchmarks/history/distributed.md, "Blocks split over W CPU processes".
"""Step time and optimizer state per rank with the blocks split over W CPU processes (gloo).

    python -m benchmarks.studies.distributed_bench                     # W = 1 and 2, d_model 512, block 256
    python -m benchmarks.studies.distributed_bench --world-sizes 1 2 4 --d-model 1024 --threads 1

For each W, W processes on this machine run ``dash_fn.step`` (eager) on the Llama-like layer
shapes of step_bench.py with ``process_group=WORLD`` (W = 1: no group, the one-process code);
every rank owns its share of the blocks and the step all-gathers the directions. Printed per W:
the median plain and refresh step times (the slowest rank's, as the step waits for it), the
root cost the ranks own (sum of b^3 over their factors, as a fraction of the whole) and the
state bytes per rank. ``--threads`` is each process's torch thread count: with W processes on a
machine of C cores, W x threads <= C avoids oversubscription.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dash_fn
from benchmarks.state_memory import state_bytes
from benchmarks.step_bench import layer_shapes
from dash_fn.distributed import rank_loads


def worker(rank: int, world_size: int, args, init_file: str, out: str) -> None:
    torch.set_num_threads(args.threads)
    group = None
    if world_size > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        group = dist.group.WORLD
    gen = torch.Generator().manual_seed(0)
    params = {name: torch.randn(shape, generator=gen) for name, shape in layer_shapes(args.d_model).items()}
    grads = {name: torch.randn(x.shape, generator=gen) for name, x in params.items()}
    config = dash_fn.DashConfig(block_size=args.block_size, solver=args.solver, refresh_schedule="periodic")
    state = dash_fn.init(params, config, group)
    times = {"plain": [], "refresh": []}
    for rep in range(args.reps + 1):
        for kind in ("refresh", "plain"):
            if group is not None:
                dist.barrier()
            start = time.perf_counter()
            dash_fn.step(params, grads, state, lr=1e-3, refresh=kind == "refresh")
            if rep:  # the first round warms up
                times[kind].append(time.perf_counter() - start)
    shard = state["shard"]
    loads = rank_loads(state["plan"], shard.counts)
    result = {kind: statistics.median(t) for kind, t in times.items()}
    result.update(
        bytes=state_bytes(state), load=loads[rank] / sum(loads), params=sum(x.numel() for x in params.values())
    )
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    if group is not None:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--world-sizes", type=int, nargs="+", default=[1, 2], help="numbers of processes W, timed one after the other"
    )
    parser.add_argument(
        "--d-model", type=int, default=512, help="width of the Llama-like layer (step_bench.py's shapes)"
    )
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--solver", default="eigh", help="root solver")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--reps", type=int, default=3, help="timed plain and refresh steps per W, after one warm-up round"
    )
    args = parser.parse_args(argv)
    print(
        f"d_model {args.d_model}, block {args.block_size}, solver {args.solver}, {args.threads} thread(s) per process, "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}\n"
    )
    print("| W | plain ms | refresh ms | root cost per rank | state bytes per rank | state B/param per rank |")
    print("|---|---|---|---|---|---|")
    for world_size in args.world_sizes:
        with tempfile.TemporaryDirectory() as out:
            mp.spawn(worker, args=(world_size, args, os.path.join(out, "init"), out), nprocs=world_size)
            ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world_size)]
        plain = max(r["plain"] for r in ranks) * 1e3
        refresh = max(r["refresh"] for r in ranks) * 1e3
        loads = ", ".join(f"{r['load']:.2f}" for r in ranks)
        sizes = ", ".join(f"{r['bytes']}" for r in ranks)
        per_param = ", ".join(f"{r['bytes'] / r['params']:.2f}" for r in ranks)
        print(f"| {world_size} | {plain:.1f} | {refresh:.1f} | {loads} | {sizes} | {per_param} |", flush=True)


if __name__ == "__main__":
    main()
