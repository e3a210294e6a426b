"""The plain (non-refresh) DASH step beside its own batched products, and where the rest goes.

    python -m benchmarks.plain_step                   # 3 x Linear(1024, 1024) + bias, block 256
    python -m benchmarks.plain_step --profile         # also the steps' top operators and compiled kernels
    python -m benchmarks.plain_step --quick           # tiny sizes: a smoke run
    python -m benchmarks.plain_step --retain-freed-memory   # glibc keeps freed memory (no page faults)

A plain step's arithmetic is four batched products per block stack (G G^T and G^T G for the
factors, L^{-1/4} G and (.) R^{-1/4} for the direction) plus elementwise passes; this script
times, interleaved in one process (round-robin, so load hits all alike), the four products on
stacks of the step's own shapes (torch.bmm on random blocks), the compiled adapter's plain step
(``DASH(compile=True)``, Inductor) and the eager one, and prints each step's ratio to the
products. Each repetition runs ``--window`` consecutive calls of one kind, as training does
(single calls squeezed between the other kinds measured slower: the compiled step 48 ms
instead of 34, the products 23 instead of 17, at the default sizes; the cause is not known).
The roots are refreshed once (step 1) and never again, so every timed step is plain; the
gradients are fixed and written into ``.grad`` outside the timed region.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import torch

import dash_fn
from benchmarks import machine


def block_shapes(d: int, block: int, layers: int) -> list[tuple[int, int]]:
    """Block shapes of ``layers`` (d, d) weights cut into block x block tiles (edges smaller)."""
    edges = [min(block, d - i) for i in range(0, d, block)]
    return [(r, c) for _ in range(layers) for r in edges for c in edges]


def products(shapes: list[tuple[int, int]]):
    """The four batched products of a plain step, one bmm per distinct block shape."""
    stacks = {}
    for s in shapes:
        stacks[s] = stacks.get(s, 0) + 1
    operands = []
    for (r, c), n in stacks.items():
        operands.append((torch.randn(n, r, c), torch.randn(n, r, r), torch.randn(n, c, c)))

    def run():
        for G, L, R in operands:
            torch.bmm(G, G.mT)
            torch.bmm(G.mT, G)
            torch.bmm(torch.bmm(L, G), R)

    return run


def adapter(d: int, block: int, layers: int, compile: bool | dict, precision: str = "float32"):
    """A DASH step over ``layers`` x Linear(d, d) with fixed gradients; refreshes once, at step 1."""
    torch.manual_seed(0)
    params = [p for _ in range(layers) for p in torch.nn.Linear(d, d).parameters()]
    grads = [torch.randn_like(p) * 1e-2 for p in params]
    opt = dash_fn.DASH(
        params,
        lr=1e-3,
        compile=compile,
        block_size=block,
        solver="eigh",
        start_prec_step=1,
        inv_root_freq=10**9,
        refresh_schedule="periodic",  # roots at step 1 only: every timed step is plain
        precision=precision,
    )

    def run():
        for p, g in zip(params, grads):
            p.grad = g
        start = time.perf_counter()
        opt.step()
        return time.perf_counter() - start

    for _ in range(3):  # the refresh at step 1, compilation, warm caches
        run()
    return run


def timed(fn, window: int) -> float:
    """Median seconds of ``window`` consecutive calls (a step reports its own time)."""
    times = []
    for _ in range(window):
        start = time.perf_counter()
        out = fn()
        times.append(out if isinstance(out, float) else time.perf_counter() - start)
    return statistics.median(times)


def page_faults() -> int:
    """Minor page faults of this process so far: each is a fresh page the allocator had given back."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--d-model", type=int, default=1024, help="the model is LAYERS x Linear(d_model, d_model) with bias"
    )
    parser.add_argument("--layers", type=int, default=3, help="number of Linear layers")
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--reps", type=int, default=7, help="round-robin repetitions (medians reported)")
    parser.add_argument(
        "--window",
        type=int,
        default=10,
        help="consecutive calls per repetition, as in training (their median is the repetition's time)",
    )
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled step")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="print the eager and compiled steps' top operators and Inductor kernels (torch.profiler)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (d_model 64, block 32, 3 reps): a smoke run")
    parser.add_argument(
        "--precision",
        nargs="+",
        default=[],
        choices=["tf32", "bfloat16", "float16", "auto"],
        help="also time the compiled and eager steps with these DashConfig.precision settings, beside float32",
    )
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="call dash_fn.utils.retain_freed_cpu_memory() first (glibc keeps freed memory: no page faults)",
    )
    args = parser.parse_args(argv)
    if args.retain_freed_memory and not dash_fn.utils.retain_freed_cpu_memory():
        raise SystemExit("--retain-freed-memory: the C library is not glibc")
    if args.quick:
        args.d_model, args.block_size, args.reps, args.window = 64, 32, 3, 2

    if args.profile:  # name Inductor's generated kernels in the profile (before compiling)
        from torch._inductor import config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    shapes = block_shapes(args.d_model, args.block_size, args.layers)
    runs = {
        "batched products": products(shapes),
        "compiled step": adapter(args.d_model, args.block_size, args.layers, {"backend": args.backend}),
        "eager step": adapter(args.d_model, args.block_size, args.layers, False),
    }
    for precision in args.precision:
        compiled = adapter(args.d_model, args.block_size, args.layers, {"backend": args.backend}, precision)
        runs[f"compiled step, {precision}"] = compiled
        runs[f"eager step, {precision}"] = adapter(args.d_model, args.block_size, args.layers, False, precision)
    times, faults = {k: [] for k in runs}, {k: [] for k in runs}
    load = os.getloadavg()[0]
    for _ in range(args.reps):
        for name, fn in runs.items():
            before = page_faults()
            times[name].append(timed(fn, args.window))
            faults[name].append((page_faults() - before) / args.window)
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print(
        f"{args.layers} x Linear({args.d_model}, {args.d_model}) + bias, "
        f"block {args.block_size} ({len(shapes)} blocks); "
        f"{machine.machine_line()}, load {load:.2f} at start; "
        f"medians of {args.reps} round-robin "
        f"repetitions of {args.window} consecutive calls; "
        f"{'dash_fn.utils.retain_freed_cpu_memory()' if args.retain_freed_memory else 'default glibc malloc'}\n"
    )
    print("| what | ms | x products | page faults per call |")
    print("|---|---|---|---|")
    for name, value in ms.items():
        print(
            f"| {name} | {value:.2f} | {value / ms['batched products']:.2f} | {statistics.median(faults[name]):.0f} |"
        )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name in ("eager step", "compiled step"):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    runs[name]()
            print(f"\n{name}, 5 steps:\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return ms


if __name__ == "__main__":
    main()
