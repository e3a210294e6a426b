"""Optimizer-step time of dash_fn beside a per-block baseline and AdamW, as a markdown table.

    python -m benchmarks.step_bench                      # CPU default grid
    python -m benchmarks.step_bench --d-model 1024 --block-size 256 --solver eigh ndb
    python -m benchmarks.step_bench --quick              # tiny sizes: a smoke run

For Llama-like layer shapes (attention 4 x (d, d), MLP (4d, d) and (d, 4d)) it times, side by
side in one process: dash_fn compiled (Inductor, static refresh flag), dash_fn eager, the
sequential per-block baseline (benchmarks/sequential_shampoo.py, one block at a time as
Distributed Shampoo does) and torch.optim.AdamW (foreach). Plain (non-refresh) and refresh
steps are timed apart. Each row gives matmul FLOPs (factor updates and preconditioning; the
refresh adds the solver's matmuls, none counted for eigh), the fraction of the matmul peak
measured in the same run, the peak memory during the refresh step (CPU: resident-set
high-water mark above the level before the step; CUDA: max_memory_allocated above the level
before) and the optimizer state bytes per parameter.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

import dash_fn
from benchmarks.sequential_shampoo import SequentialShampoo
from benchmarks.state_memory import state_bytes


def layer_shapes(d: int) -> dict[str, tuple[int, int]]:
    return {"wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "up": (4 * d, d), "down": (d, 4 * d)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(device: torch.device) -> float:
    """FLOP/s of a large float32 batched matmul on this device, measured now."""
    n, k = (4096, 8) if device.type == "cuda" else (512, 8)
    a = torch.randn(k, n, n, device=device)
    b = torch.randn(k, n, n, device=device)
    torch.bmm(a, b)
    seconds = median_seconds(lambda: torch.bmm(a, b), 5, device)
    return 2 * k * n**3 / seconds


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


def peak_step_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Bytes the step needs above what was resident before it (its temporaries)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with open("/proc/self/clear_refs", "w") as f:  # resets the VmHWM high-water mark
        f.write("5")
    before = _rss_bytes("VmRSS")
    fn()
    return max(0, _rss_bytes("VmHWM") - before)


def plain_flops(plan) -> int:
    """G G^T, G^T G, Lbar G and (Lbar G) Rbar per block: 4 (r^2 c + r c^2)."""
    return sum(g.count * 4 * (g.rows**2 * g.cols + g.rows * g.cols**2) for g in plan.groups)


def products_per_root(solver: str, p: int, config) -> int | None:
    """b x b products of one inverse p-th root: NDB (p a power of two) runs log2(p) square-root
    chains of 3 (T - 1) products (its last half-iterate skipped), coupled Newton
    (floor(log2 p) + popcount(p) + 1)(T - 1) (``C^p M`` by repeated squaring, and ``Y C``),
    Chebyshev degree - 1 (Clenshaw); None for eigh."""
    T = config.newton_steps
    counts = {
        "ndb": (p.bit_length() - 1) * 3 * (T - 1),
        "cn": (p.bit_length() - 1 + bin(p).count("1") + 1) * (T - 1),
        "chebyshev": config.cheb_degree - 1,
    }
    return counts.get(solver)


def solver_flops(plan, config) -> int | None:
    """Matmul FLOPs of one refresh of every root (None for eigh, which is no matmul chain):
    matrix blocks' roots of the config's order, one-sided segments' square roots."""
    if products_per_root(config.solver, 2, config) is None:
        return None
    order = {4: config.resolved_root_order, 2: 2}
    return sum(2 * products_per_root(config.solver, order[f.order], config) * f.count * f.size**3 for f in plan.factors)


def make_impls(shapes, config, device, compiled_variants: dict[str, dict], baselines: bool = True):
    """name -> (plain_fn, refresh_fn, state bytes or None); compiled_variants maps a row name
    to torch.compile keyword arguments; ``baselines`` adds the sequential loop and AdamW."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = {k: torch.randn(s, generator=gen).to(device) for k, s in shapes.items()}
    grads = {k: torch.randn(s, generator=gen).to(device) for k, s in shapes.items()}
    lr = torch.tensor(1e-3, device=device)
    for x in (*params.values(), *grads.values()):  # fixed buffers, as a training loop's: CUDA graphs copy nothing in
        torch._dynamo.mark_static_address(x, guard=False)
    impls = {}
    variants = [(name, torch.compile(dash_fn.step, fullgraph=True, **kw)) for name, kw in compiled_variants.items()]
    variants.append(("dash_fn eager", dash_fn.step))
    graphed = {name for name, kw in compiled_variants.items() if kw.get("mode") == "reduce-overhead"}

    def call(step_fn, state, refresh: bool, cuda_graphs: bool):
        if cuda_graphs:  # each call a new step: the previous replay's outputs (unread) may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        return step_fn(params, grads, state, lr=lr, refresh=refresh)

    for name, step_fn in variants:
        state = dash_fn.init(params, config)
        impls[name] = (
            lambda f=step_fn, s=state, g=name in graphed: call(f, s, False, g),
            lambda f=step_fn, s=state, g=name in graphed: call(f, s, True, g),
            state_bytes(state),
        )
    if not baselines:
        return params, impls
    seq = SequentialShampoo(params, config)
    impls["sequential per-block"] = (
        lambda: seq.step(params, grads, 1e-3, refresh=False),
        lambda: seq.step(params, grads, 1e-3, refresh=True),
        None,
    )
    torch_params = [p.clone().requires_grad_(True) for p in params.values()]
    for p, g in zip(torch_params, grads.values()):
        p.grad = g
    adamw = torch.optim.AdamW(torch_params, lr=1e-3, foreach=True)
    adamw.step()
    impls["torch AdamW (foreach)"] = (
        adamw.step,
        None,
        sum(t.numel() * t.element_size() for s in adamw.state.values() for t in s.values()),
    )
    return params, impls


def bench(
    shapes: dict,
    label,
    block_size: int,
    solver: str,
    device: torch.device,
    reps: int,
    peak: float,
    compiled_variants: dict[str, dict],
    warmup: int = 1,
    on_row: Callable[[dict], object] | None = None,
    options: dict | None = None,
    baselines: bool = True,
):
    """Rows of the table for one layer (``label`` names it in the d_model column), each also
    passed to ``on_row`` as soon as it is measured. Each implementation first runs ``warmup``
    plain and refresh steps (compiles; under CUDA graphs 3, so that the recording call is not
    timed). On CUDA the peak memory is read over the warm-up after its first call (the
    compiler's own memory), so it sees CUDA graphs allocate their pool while recording; on the
    CPU over one step after the warm-up (the resident-set high-water mark would count the
    compiler's memory). ``options``: further DashConfig fields (a precision, a root order);
    ``baselines``: also the sequential per-block loop and AdamW."""
    # plain and refresh steps apart
    config = dash_fn.DashConfig(block_size=block_size, solver=solver, refresh_schedule="periodic", **(options or {}))
    plan = dash_fn.init({k: torch.empty(s, device="meta") for k, s in shapes.items()}, config)["plan"]
    n_params = sum(a * b for a, b in shapes.values())
    flops_plain, flops_solver = plain_flops(plan), solver_flops(plan, config)
    params, impls = make_impls(shapes, config, device, compiled_variants, baselines)
    rows = []
    for name, (plain, refresh, nbytes) in impls.items():

        def warm(calls: int, plain=plain, refresh=refresh):
            for _ in range(calls):
                plain()
                if refresh is not None:
                    refresh()

        warm(1)
        if device.type == "cuda" and warmup > 1:
            mem = peak_step_memory(lambda: warm(warmup - 1), device)
        else:
            warm(warmup - 1)
            mem = None
        t_plain = median_seconds(plain, reps, device)
        t_refresh = median_seconds(refresh, max(1, reps // 2), device) if refresh is not None else None
        mem = mem if mem is not None else peak_step_memory(refresh or plain, device)
        is_adamw = refresh is None
        row = {
            "impl": name,
            "d_model": label,
            "block": "-" if is_adamw else block_size,
            "solver": "-" if is_adamw else solver,
            "plain_ms": 1e3 * t_plain,
            "refresh_ms": None if t_refresh is None else 1e3 * t_refresh,
            "plain_gflop": None if is_adamw else flops_plain / 1e9,
            "plain_peak": None if is_adamw else flops_plain / t_plain / peak,
            "refresh_gflop": None if is_adamw or flops_solver is None else (flops_plain + flops_solver) / 1e9,
            "refresh_peak": None
            if is_adamw or flops_solver is None
            else (flops_plain + flops_solver) / t_refresh / peak,
            "peak_mem_mib": mem / 2**20,
            "state_b_per_param": None if nbytes is None else nbytes / n_params,
        }
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows) -> str:
    head = (
        "| impl | d_model | block | solver | plain ms | refresh ms | plain GFLOP | plain % peak | refresh GFLOP "
        "| refresh % peak | step peak mem MiB | state B/param |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['d_model']} | {r['block']} | {r['solver']} | {fmt(r['plain_ms'], '.1f')} | "
            f"{fmt(r['refresh_ms'], '.1f')} | "
            f"{fmt(r['plain_gflop'], '.2f')} | "
            f"{fmt(None if r['plain_peak'] is None else 100 * r['plain_peak'], '.0f')} | "
            f"{fmt(r['refresh_gflop'], '.1f')} | "
            f"{fmt(None if r['refresh_peak'] is None else 100 * r['refresh_peak'], '.0f')} | "
            f"{fmt(r['peak_mem_mib'], '.0f')} | {fmt(r['state_b_per_param'], '.1f')} |"
        )
    return "\n".join(lines)


def speedups(rows) -> str:
    """Refresh-step ratios sequential / dash_fn, per configuration, from the same run."""
    out = []
    keys = {(r["d_model"], r["block"], r["solver"]) for r in rows if r["refresh_ms"] is not None}
    for key in sorted(keys, key=str):
        by_impl = {r["impl"]: r for r in rows if (r["d_model"], r["block"], r["solver"]) == key}
        seq = by_impl.get("sequential per-block")
        for name in by_impl:
            if seq and name.startswith("dash_fn"):
                out.append(
                    f"- d_model {key[0]}, block {key[1]}, {key[2]}: refresh step "
                    f"{seq['refresh_ms'] / by_impl[name]['refresh_ms']:.2f}x faster with {name} than sequential; "
                    f"plain step {seq['plain_ms'] / by_impl[name]['plain_ms']:.2f}x"
                )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--d-model", type=int, nargs="+", default=[512, 1024], help="layer widths d")
    parser.add_argument("--block-size", type=int, nargs="+", default=[128, 256], help="DASH block sizes")
    parser.add_argument("--solver", nargs="+", default=["eigh", "ndb"], help="root solvers")
    parser.add_argument(
        "--reps", type=int, default=5, help="timed plain steps per row (median; refresh steps: half as many)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--no-compile", action="store_true", help="skip the Inductor-compiled variant")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one rep: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.d_model, args.block_size, args.reps = [32], [16], 1
    device = torch.device(args.device)
    torch.manual_seed(0)
    peak = matmul_peak(device)
    print(
        f"device {device} "
        f"({torch.cuda.get_device_name() if device.type == 'cuda' else f'{torch.get_num_threads()} CPU threads'}), "
        f"torch {torch.__version__}, float32 matmul peak measured {peak / 1e9:.1f} GFLOP/s\n"
    )
    compiled = {} if args.no_compile else {"dash_fn compiled": {"backend": "aot_eager" if args.quick else "inductor"}}
    rows = []
    for d in args.d_model:
        for b in args.block_size:
            for solver in args.solver:
                new = bench(layer_shapes(d), d, b, solver, device, args.reps, peak, compiled)
                print(markdown(new).split("\n", 2)[2], file=sys.stderr, flush=True)  # rows so far, for long runs
                rows += new
                torch._dynamo.reset()
    print(markdown(rows))
    print()
    print(speedups(rows))


if __name__ == "__main__":
    main()
