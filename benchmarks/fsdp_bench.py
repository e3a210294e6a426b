"""FSDP2 row shards: state, step time and bytes moved per rank, exact blocks against local blocks.

    python -m benchmarks.fsdp_bench                    # measured (W = 1, 2) and planner tables
    python -m benchmarks.fsdp_bench --planner-only     # Llama 953M planner table only (no processes)
    python -m benchmarks.fsdp_bench --d-model 1024 --block-size 512 --world-sizes 1 2 4 --threads 1

**Measured.** For each W, W gloo processes on this machine hold every parameter of the
Llama-like layer of step_bench.py (4 x (d, d), (4d, d), (d, 4d)) as a ``Shard(0)`` DTensor, the
split ``fully_shard`` makes (built without communication, as tests/fsdp_worker.py does), and run
the eager ``dash_fn.step`` in both ``fsdp_blocks`` modes (their steps alternate, so that a
change in the machine's load hits both alike). ``exact`` cuts blocks as one process
does: a band (one block-row) that straddles two ranks' shards is owned by one of them, and each
step moves the missing gradient rows to it and its direction rows back (one all-to-all each
way). ``local`` cuts blocks at shard edges and moves nothing. Printed per (d_model, W, mode):
the bands that straddle shards, the median plain and refresh step times (the slowest rank's),
each rank's root cost (sum of b^3 over the factors it refreshes, as a fraction of one
process's), its optimizer state bytes (and per parameter of the whole layer), and the bytes the
two all-to-alls move per step, per rank (sent) and in total. The bytes come from the shards'
rectangles (``sent_elements`` of 4 bytes, gradients in and directions back), and a wrapper
around the all-to-all checks them against what one step really sends.

Default d_model values: 512 (block 256: every band of a 2-way split sits inside one shard, so
exact moves nothing) and 384 (the first 256-row band of each 384-row matrix straddles the
192-row shards, so exact moves rows).

**Planner** (always printed; ``--planner-only`` prints only it): the DASH paper's Llama 953M at
block 1024 over W = 8 and 64 ranks, from ``make_plan``, ``row_rects`` and ``plan_tiles``,
without processes: bytes moved per step by dash_fn exact (``sent_elements`` both ways x 4), by local
(0), and by a lossless owner scheme in which each whole parameter lives on one owner rank (the
least-loaded, by root cost, largest parameters first) and every other rank's shard of its
gradient goes there and its update comes back; and the all-to-all of every gradient, 2 (W-1)/W
x model bytes. A per-block owner that picks the rank holding most of the block's rows moves
exactly what dash_fn exact moves: that is its rule. Beside each: the largest over the mean
root-cost load of the ranks.
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
from dash_fn.distributed.fsdp import band_plan, local_shape, plan_tiles, row_rects, sent_elements
from dash_fn.distributed.ownership import block_cost
from dash_fn.plan import ADAMW, EMPTY, make_plan

MODES = ("exact", "local")
BYTES = 4  # float32 rows (comm_dtype=None)

# The DASH paper's Llama 953M (as tests/test_distributed.py): 16 layers and two embeddings.
LLAMA_953M = [
    (f"l{i}.{name}", shape, torch.float32)
    for i in range(16)
    for name, shape in (
        ("qkv", (6144, 2048)),
        ("o", (2048, 2048)),
        ("gate", (5632, 2048)),
        ("up", (5632, 2048)),
        ("down", (2048, 5632)),
    )
]
LLAMA_953M += [("embed", (32000, 2048), torch.float32), ("head", (32000, 2048), torch.float32)]


# ---------------------------------------------------------------- planning (no processes)


def sent_per_rank(plan, rects, owned) -> list[int]:
    """Elements each rank sends per step: its pieces of blocks others own (gradients in), plus
    its owned pieces that others hold (directions back)."""
    return [a + b for a, b in zip(sent_elements(plan, rects, owned), sent_elements(plan, owned, rects))]


def straddling_bands(plan, rows) -> int:
    """Bands (block-rows of the one-process blocking) whose rows sit on more than one rank."""
    return sum(1 for *_, held, _ in band_plan(plan, rows) if sum(h > 0 for h in held) > 1)


def root_cost(plan) -> int:
    return sum(stack.count * stack.size**3 for stack in plan.factors)


def local_loads(specs, block_size: int, world: int, one_dim: str = "adamw") -> list[int]:
    """Each rank's root cost when its shards are blocked on their own (``fsdp_blocks="local"``)."""
    return [
        root_cost(make_plan([(n, local_shape(s, world, k), d) for n, s, d in specs], block_size, one_dim))
        for k in range(world)
    ]


def param_owner_rows(plan, rows, world: int):
    """Whole-parameter owners: each block parameter, largest root cost first, goes to the
    least-loaded rank (ties: the one holding most of its rows, then the lower rank). Returns
    owned rects in ``plan_tiles``'s form and the ranks' root loads."""
    load = [0] * world
    owned = [[(0, 0, 0, 0)] * world for _ in plan.params]
    costs = [sum(r.n_rows * r.n_cols * block_cost(plan.groups[r.group]) for r in p.regions) for p in plan.params]
    for i in sorted(range(len(plan.params)), key=lambda i: -costs[i]):
        p = plan.params[i]
        if p.kind in (ADAMW, EMPTY):
            continue
        k = min(range(world), key=lambda k: (load[k], -(rows[i][k][1] - rows[i][k][0]), k))
        owned[i][k] = (0, p.view[0], 0, p.view[1])
        load[k] += costs[i]
    return tuple(tuple(r) for r in owned), load


def planner_state_bytes(specs, block_size: int, world: int, mode: str) -> list[int]:
    """Each rank's optimizer state bytes (default config, eigh), from ``init``'s layout on the
    meta device (no memory)."""
    from dash_fn.state import make_state

    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", fsdp_blocks=mode)
    meta = torch.device("meta")
    return [state_bytes(make_state(specs, config, meta, k, world, None, sharding="fsdp")) for k in range(world)]


def planner_table(block_size: int, world_sizes: list[int]) -> None:
    specs = LLAMA_953M
    plan = make_plan(specs, block_size, "adamw")
    numel = sum(p.view[0] * p.view[1] for p in plan.params)
    model_bytes = numel * BYTES
    total_cost = root_cost(plan)
    one = planner_state_bytes(specs, block_size, 1, "exact")[0]
    print(
        f"Planner: the DASH paper's Llama 953M ({len(plan.params)} matrices, {numel:,} parameters, model size "
        f"{model_bytes:,} bytes in float32; optimizer state {one:,} bytes in one process), "
        f"block {block_size}, no processes\n"
    )
    print(
        "| W | scheme | bytes moved per step, total | largest rank sends | / all-to-all of every gradient "
        "| straddling bands "
        "| root-cost load largest / mean | state bytes, largest rank (/ one process's / W) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for world in world_sizes:
        rows = tuple(row_rects(p.shape, world) for p in plan.params)
        every = 2 * (world - 1) / world * model_bytes

        def state(sizes, world=world):
            return f"{max(sizes):,} ({max(sizes) / (one / world):.2f})"

        owned, loads = plan_tiles(plan, rows, world)
        sent = sent_per_rank(plan, rows, owned)
        exact = sum(sent) * BYTES
        bands = f"{straddling_bands(plan, rows)} of {len(band_plan(plan, rows))}"
        print(
            f"| {world} | dash_fn exact | {exact:,} | {max(sent) * BYTES:,} | {exact / every:.3f} | {bands} "
            f"| {max(loads) / (sum(loads) / world):.3f} | "
            f"{state(planner_state_bytes(specs, block_size, world, 'exact'))} |"
        )
        local = local_loads(specs, block_size, world)
        print(
            f"| {world} | dash_fn local | 0 | 0 | 0 | 0 | {max(local) / (sum(local) / world):.3f} "
            f"(total {sum(local) / total_cost:.2f}x one process's) | "
            f"{state(planner_state_bytes(specs, block_size, world, 'local'))} |"
        )
        owned, loads = param_owner_rows(plan, rows, world)
        sent = sent_per_rank(plan, rows, owned)
        whole = sum(sent) * BYTES
        config = dash_fn.DashConfig(block_size=block_size, solver="eigh")
        from dash_fn.state import make_state

        owner_state = [
            state_bytes(make_state([s for s, o in zip(specs, owned) if o[k][1] > 0], config, torch.device("meta")))
            if any(o[k][1] > 0 for o in owned)
            else 0
            for k in range(world)
        ]
        print(
            f"| {world} | whole-parameter owner | {whole:,} | {max(sent) * BYTES:,} | {whole / every:.3f} | - "
            f"| {max(loads) / (sum(loads) / world):.3f} | {state(owner_state)} |"
        )
        print(
            f"| {world} | all-to-all of every gradient: 2 (W-1)/W x model bytes | {every:,.0f} "
            f"| {every / world:,.0f} (mean) | 1.000 | - | - | - |"
        )
    print()


def torchtitan_placements(name: str, dp: int, tp: int) -> tuple:
    """Where torchtitan's Llama puts a parameter on a (dp, tp) mesh: ColwiseParallel (q, k, v,
    w1, w3, the output, and the embedding's RowwiseParallel, which splits its rows) shards dim 0
    over tp, and FSDP2 then records dim 0 over dp as _StridedShard; RowwiseParallel (o, w2)
    shards dim 1 over tp and FSDP2 dim 0 over dp."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    if name.endswith((".o", ".down")):
        return (Shard(0), Shard(1))
    return (Shard(0), Replicate()) if tp == 1 else (_StridedShard(0, split_factor=tp), Shard(0))


def tp_edges(p, tp: int) -> list[int]:
    """The tensor-parallel edges inside a parameter: torch.chunk's, on dim 1 for rowwise
    weights, else on dim 0."""
    n = p.shape[1 if p.name.endswith((".o", ".down")) else 0]
    chunk = -(-n // tp)
    return [k * chunk for k in range(1, tp) if k * chunk < n]


def tp_planner_table(block_sizes: list[int], layouts: list[tuple[int, int]]) -> None:
    """Bytes that exact and aligned blocks move per step on (dp, tp) layouts of Llama 953M,
    without processes."""
    from dash_fn.distributed.layout import piece_rects, tensor_parallel_tiles

    print(
        "Tensor parallel: the DASH paper's Llama 953M laid out as torchtitan lays it out on a (dp, tp) mesh "
        "(ColwiseParallel q/k/v, gate, up, embedding and output; RowwiseParallel o and down; FSDP2 on dp), "
        "no processes. Exact blocks: tensor-parallel edges fall on block edges where the rows (columns) per "
        "tp rank are a multiple of the block size; FSDP2's edges cut inside blocks as in the table above. "
        'Aligned blocks (fsdp_blocks="aligned"): each tensor-parallel piece blocked alone, so only FSDP2\'s '
        "edges cut inside blocks.\n"
    )
    print(
        "| block | dp x tp | tensor-parallel edges inside exact blocks | exact: bytes moved per step, total "
        "| largest rank sends | / all-to-all of every gradient | root-cost load largest / mean "
        "| aligned: bytes moved per step, total |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for block_size in block_sizes:
        plan = make_plan(LLAMA_953M, block_size, "adamw")
        model_bytes = sum(p.view[0] * p.view[1] for p in plan.params) * BYTES
        for dp, tp in layouts:
            world = dp * tp
            placements = [torchtitan_placements(p.name, dp, tp) for p in plan.params]
            rects = tuple(
                piece_rects(p.name, p.shape, 0, (dp, tp), on, [0, 1]) for p, on in zip(plan.params, placements)
            )
            inside = sum(1 for p in plan.params for edge in tp_edges(p, tp) if edge % block_size)
            owned, loads = plan_tiles(plan, rects, world)
            sent = sent_per_rank(plan, rects, owned)
            every = 2 * (world - 1) / world * model_bytes
            tp_dims = [1] if tp > 1 else []  # (the norms, replicated on tp, are not in the list)
            tiles = {
                p.name: tensor_parallel_tiles(p.name, p.shape, 0, (dp, tp), on, tp_dims)
                for p, on in zip(plan.params, placements)
            }
            aligned = make_plan(LLAMA_953M, block_size, "adamw", splits=tiles)
            aligned_sent = sent_per_rank(aligned, rects, plan_tiles(aligned, rects, world)[0])
            print(
                f"| {block_size} | {dp} x {tp} | {inside} | {sum(sent) * BYTES:,} | {max(sent) * BYTES:,} "
                f"| {sum(sent) * BYTES / every:.3f} | {max(loads) / (sum(loads) / world):.3f} "
                f"| {sum(aligned_sent) * BYTES:,} |"
            )
    print()


# ---------------------------------------------------------------- measured (W gloo processes)


def shard_of(full: torch.Tensor, mesh) -> torch.Tensor:
    """This rank's ``Shard(0)`` piece of ``full`` as a DTensor, without communication."""
    from torch.distributed.tensor import DTensor, Shard

    rank, world = mesh.get_local_rank(0), mesh.size(0)
    chunk = -(-full.shape[0] // world)
    lo, hi = min(rank * chunk, full.shape[0]), min((rank + 1) * chunk, full.shape[0])
    return DTensor.from_local(
        full[lo:hi].clone(), mesh, (Shard(0),), run_check=False, shape=full.shape, stride=full.stride()
    )


class CountingAllToAll:
    """Wraps the functional all-to-all that the FSDP step calls, summing the elements sent to
    other ranks (a rank's buffer holds only rows for other ranks)."""

    def __init__(self):
        import torch.distributed._functional_collectives as collectives

        self.module, self.original, self.elements, self.calls = collectives, collectives.all_to_all_single, 0, 0

    def __enter__(self):
        def counted(buffer, *args, **kwargs):
            self.elements += buffer.numel()
            self.calls += 1
            return self.original(buffer, *args, **kwargs)

        self.module.all_to_all_single = counted
        return self

    def __exit__(self, *exc):
        self.module.all_to_all_single = self.original


def worker(rank: int, world_size: int, args, d_model: int, init_file: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    gen = torch.Generator().manual_seed(0)
    full = {name: torch.randn(shape, generator=gen) for name, shape in layer_shapes(d_model).items()}
    grads = {name: shard_of(torch.randn(x.shape, generator=gen), mesh) for name, x in full.items()}
    runs = {}
    for mode in MODES:
        params = {name: shard_of(x, mesh) for name, x in full.items()}
        config = dash_fn.DashConfig(
            block_size=args.block_size, solver=args.solver, fsdp_blocks=mode, refresh_schedule="periodic"
        )  # plain and refresh steps timed apart
        runs[mode] = [params, dash_fn.init(params, config)]
    times = {(mode, kind): [] for mode in MODES for kind in ("plain", "refresh")}
    for rep in range(args.reps + 1):  # the modes alternate, so that a change of load hits both
        for mode in MODES:
            for kind in ("refresh", "plain"):
                params, state = runs[mode]
                dist.barrier()
                start = time.perf_counter()
                runs[mode] = dash_fn.step(params, grads, state, lr=1e-3, refresh=kind == "refresh")
                if rep:  # the first round warms up
                    times[mode, kind].append(time.perf_counter() - start)
    results = {}
    for mode in MODES:
        params, state = runs[mode]
        dist.barrier()
        with CountingAllToAll() as counter:  # one more step, to check the bytes it sends
            params, state = dash_fn.step(params, grads, state, lr=1e-3, refresh=False)
        shard, plan = state["shard"], state["plan"]
        results[mode] = dict(
            plain=statistics.median(times[mode, "plain"]),
            refresh=statistics.median(times[mode, "refresh"]),
            bytes=state_bytes(state),
            params=sum(x.numel() for x in full.values()),
            cost=root_cost(shard.local) / root_cost(plan),
            sent=sent_per_rank(plan, shard.rects, shard.owned_rects),
            counted=counter.elements,
            calls=counter.calls,
            straddling=straddling_bands(plan, shard.rects) if mode == "exact" else 0,
        )
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def measured_table(args) -> None:
    print(
        f"Measured: Llama-like layer (4 x (d, d), (4d, d), (d, 4d)), block {args.block_size}, "
        f"solver {args.solver}, eager step, "
        f"gloo, {args.threads} thread(s) per process, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"medians of {args.reps}\n"
    )
    print(
        "| d_model | W | mode | straddling bands | plain ms | refresh ms | root cost per rank | state bytes per rank "
        "| state B/param per rank | bytes moved per step per rank (sent) | bytes moved per step, total |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d_model in args.d_model:
        for world_size in args.world_sizes:
            with tempfile.TemporaryDirectory() as out:
                mp.spawn(worker, args=(world_size, args, d_model, os.path.join(out, "init"), out), nprocs=world_size)
                ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world_size)]
            for mode in MODES:
                rs = [r[mode] for r in ranks]
                sent = [n * BYTES for n in rs[0]["sent"]]
                total = sum(sent)
                counted = sum(r["counted"] for r in rs) * BYTES
                if counted != total:
                    raise RuntimeError(
                        f"d_model {d_model}, W {world_size}, {mode}: planned {total} bytes per step, "
                        f"the all-to-alls sent {counted}"
                    )
                plain = max(r["plain"] for r in rs) * 1e3
                refresh = max(r["refresh"] for r in rs) * 1e3
                costs = ", ".join(f"{r['cost']:.2f}" for r in rs)
                sizes = ", ".join(f"{r['bytes']:,}" for r in rs)
                per_param = ", ".join(f"{r['bytes'] / r['params']:.2f}" for r in rs)
                print(
                    f"| {d_model} | {world_size} | {mode} | {rs[0]['straddling']} | {plain:.1f} | {refresh:.1f} | "
                    f"{costs} | {sizes} "
                    f"| {per_param} | {', '.join(f'{s:,}' for s in sent)} | {total:,} |",
                    flush=True,
                )
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--world-sizes", type=int, nargs="+", default=[1, 2], help="numbers of processes W, timed one after the other"
    )
    parser.add_argument(
        "--d-model",
        type=int,
        nargs="+",
        default=[512, 384],
        help="widths of the Llama-like layer (step_bench.py's shapes)",
    )
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--solver", default="eigh", help="root solver")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument(
        "--reps", type=int, default=10, help="timed plain and refresh steps (median), after one warm-up round"
    )
    parser.add_argument(
        "--planner-only", action="store_true", help="print only the Llama 953M planner table (no processes)"
    )
    parser.add_argument("--planner-block-size", type=int, default=1024, help="block size of the planner table")
    parser.add_argument(
        "--planner-world-sizes", type=int, nargs="+", default=[8, 64], help="world sizes of the planner table"
    )
    parser.add_argument(
        "--tp-layouts",
        nargs="+",
        default=["8x1", "4x2", "2x4", "1x8"],
        help="(dp x tp) layouts of the tensor-parallel planner table",
    )
    parser.add_argument(
        "--tp-block-sizes", type=int, nargs="+", default=[256, 1024], help="block sizes of the tensor-parallel table"
    )
    args = parser.parse_args(argv)
    if not args.planner_only:
        measured_table(args)
    planner_table(args.planner_block_size, args.planner_world_sizes)
    tp_planner_table(args.tp_block_sizes, [tuple(int(n) for n in x.split("x")) for x in args.tp_layouts])


if __name__ == "__main__":
    main()
