"""Peak temporary memory of a root refresh, chunked (as dash_fn runs it) and whole, per solver.

    python -m benchmarks.refresh_memory                                  # d_model 2048, block 1024
    python -m benchmarks.refresh_memory --d-model 512 --block-size 256 --solver eigh ndb
    python -m benchmarks.refresh_memory --quick                          # tiny sizes: a smoke run

For step_bench.py's Llama-like layer (4 x (d, d), (4d, d), (d, 4d)) it builds dash_fn's state,
takes one step with random gradients (so the factors hold G G^T), and for each solver refreshes
the largest factor stack twice: as dash_fn does (solved in chunks written into the result,
``dash_fn.roots.chunk_blocks``) and as one whole-stack call. The peak is counted op by op over
the tensors the refresh allocates (benchmarks/peak_memory.py: exact, not an allocator's
high-water mark), and given in bytes and in stacks of the refreshed size.
"""

from __future__ import annotations

import argparse
import time

import torch

import dash_fn
import dash_fn.roots as roots
from benchmarks.peak_memory import PeakMemory
from benchmarks.step_bench import layer_shapes


def largest_stack(d: int, block: int, solver: str):
    """(factors, roots, order, config, start vectors) of the layer's largest factor stack."""
    config = dash_fn.DashConfig(block_size=block, solver=solver, refresh_schedule="periodic")
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.randn(s, generator=gen) for k, s in layer_shapes(d).items()}
    state = dash_fn.init(params, config)
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
    dash_fn.step(params, grads, state, lr=0.0, refresh=False)
    plan = state["plan"]
    k = max(range(len(plan.factors)), key=lambda i: state["factors", str(i), "F"].numel())
    F, Fbar = state["factors", str(k), "F"], state["factors", str(k), "Fbar"]
    size = plan.factors[k].size
    start = roots.start_vectors(size, config) if roots.uses_start_vectors(config, solver) else None
    return F, Fbar, plan.factors[k].order, config, start


def measure(operands, whole: bool) -> tuple[int, float]:
    """(peak bytes, seconds) of one refresh_roots call, chunked or as one whole-stack call."""
    saved = roots.SMALL_WORKSPACE
    roots.SMALL_WORKSPACE = 2**62 if whole else saved
    try:
        start = time.perf_counter()
        with PeakMemory() as memory:
            roots.refresh_roots(*operands)
        return memory.peak, time.perf_counter() - start
    finally:
        roots.SMALL_WORKSPACE = saved


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--d-model", type=int, default=2048, help="width of the Llama-like layer")
    parser.add_argument("--block-size", type=int, default=1024, help="DASH block size")
    parser.add_argument(
        "--solver", nargs="+", default=["eigh", "ndb", "cn", "chebyshev"], help="root solvers to measure"
    )
    parser.add_argument(
        "--floor-mib",
        type=float,
        default=roots.SMALL_WORKSPACE / 2**20,
        help="temporaries below this are never chunked (dash_fn.roots.SMALL_WORKSPACE)",
    )
    parser.add_argument("--quick", action="store_true", help="d_model 64, block 32, no floor: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.block_size, args.floor_mib = 64, 32, 0.0
    saved, roots.SMALL_WORKSPACE = roots.SMALL_WORKSPACE, int(args.floor_mib * 2**20)
    try:  # the package's floor comes back after: a caller in the same process (a test) keeps it
        return table(args)
    finally:
        roots.SMALL_WORKSPACE = saved


def table(args) -> list[dict]:
    print(
        f"Llama-like layer, d_model {args.d_model}, block {args.block_size}, chunking floor {args.floor_mib:g} MiB; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    print(
        "| solver | stack (K x b x b) | stack MiB | chunk (blocks) | chunked peak MiB | stacks | whole-stack peak MiB "
        "| stacks | chunked s | whole s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for solver in args.solver:
        operands = largest_stack(args.d_model, args.block_size, solver)
        F = operands[0]
        stack = F.numel() * F.element_size()
        chunk = roots.chunk_blocks(F.shape[0], stack // F.shape[0], solver)
        chunked, chunked_s = measure(operands, whole=False)
        whole, whole_s = measure(operands, whole=True)
        row = {"solver": solver, "stack": stack, "chunk": chunk, "chunked": chunked, "whole": whole}
        rows.append(row)
        mib = 2**20
        print(
            f"| {solver} | {F.shape[0]} x {F.shape[1]} x {F.shape[2]} | {stack / mib:.1f} | {chunk} | "
            f"{chunked / mib:.1f} | {chunked / stack:.2f} "
            f"| {whole / mib:.1f} | {whole / stack:.2f} | {chunked_s:.1f} | {whole_s:.1f} |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
