"""Ops in the traced step at the DASH paper's 953M layer (block 1024), where compile time goes.

    python -m benchmarks.graph_size                  # NDB, staggered and periodic refresh steps
    python -m benchmarks.graph_size --floor-mib 64   # with refresh chunks cut at 64 MiB instead

Each chunk of a refresh (:func:`dash_fn.roots.chunk_blocks`) is one more unrolled copy of the
solver in the graph, and Dynamo, AOT autograd and Inductor take time in proportion to its ops.
Traced with ``make_fx`` on meta tensors: the accelerator strategy, no memory, no arithmetic.
"""

from __future__ import annotations

import argparse

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dash_fn
import dash_fn.roots as roots
from benchmarks.gpu_check import LLAMA_953M_LAYER


def traced_ops(schedule: str, refresh: bool | None, solver: str = "ndb") -> tuple[int, int]:
    """(ops, matrix products) of one step's graph at the 953M layer."""
    params = {k: torch.empty(s, device="meta") for k, s in LLAMA_953M_LAYER.items()}
    grads = {k: torch.empty_like(v) for k, v in params.items()}
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=1024, solver=solver, refresh_schedule=schedule))
    graph = make_fx(lambda p, g, lr: dash_fn.step(p, g, state, lr=lr, refresh=refresh)[0])(
        params, grads, torch.tensor(1e-3, device="meta")
    ).graph
    ops = [node for node in graph.nodes if node.op == "call_function"]
    return len(ops), sum("mm" in str(node.target) for node in ops)


def one_solve_ops(solver: str = "ndb") -> int:
    """Ops of one inverse 4th root of a (K, 1024, 1024) stack, whatever K."""
    config = dash_fn.DashConfig(block_size=1024, solver=solver)
    start = roots.start_vectors(1024, config, device="meta")
    graph = make_fx(lambda X: roots.inverse_root(X, 4, config, start))(torch.empty(4, 1024, 1024, device="meta")).graph
    return sum(node.op == "call_function" for node in graph.nodes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--floor-mib", type=int, help="refresh temporaries never cut below this (default: the package's)"
    )
    args = parser.parse_args(argv)
    saved = roots.SMALL_WORKSPACE
    if args.floor_mib is not None:
        roots.SMALL_WORKSPACE = args.floor_mib * 2**20
    try:
        table()
    finally:
        roots.SMALL_WORKSPACE = saved


def table() -> None:
    print(f"torch {torch.__version__}; chunks cut above {roots.SMALL_WORKSPACE / 2**20:.0f} MiB of temporaries")
    print(f"one NDB solve: {one_solve_ops()} ops\n")
    print("| step | ops | matrix products |\n|---|---|---|")
    for name, schedule, refresh in (("staggered", "staggered", None), ("periodic, refresh", "periodic", True)):
        ops, products = traced_ops(schedule, refresh)
        print(f"| {name} | {ops:,} | {products} |", flush=True)


if __name__ == "__main__":
    main()
