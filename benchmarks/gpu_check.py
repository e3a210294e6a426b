"""The GPU check: no host syncs, no CUDA-graph skips, results against float64, and step times.

    python benchmarks/gpu_check.py                        # on a CUDA machine; within 8 minutes on one H200
    python benchmarks/gpu_check.py --dry-run              # on CPU: tiny shapes, aot_eager, the accelerator
                                                          # strategy simulated (checks the script, in CI)
    python benchmarks/gpu_check.py --out gpu_check.md     # also write the report for benchmarks/RESULTS.md

1. Syncs: steady-state steps (after a plain and a refresh step have run once) of the eager
   adapter, the compiled adapter and the functional step compiled with
   ``mode="reduce-overhead"`` (CUDA graphs), NDB with momentum and the non-finite guard, under
   ``torch.cuda.set_sync_debug_mode("error")``: any op that waits on the GPU raises. The dry
   run counts the same ops with a dispatch mode (tests/syncs.py) under the simulated strategy.
2. CUDA graphs: ``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`` after the
   reduce-overhead runs (must be 0).
3. Accuracy: 12 steps of the functional step on the GPU (float32, NDB, and eigh) against the
   same steps on the CPU in float64: the largest difference relative to each parameter's norm.
4. Step times of the DASH paper's Llama-953M layer at block 1024 (benchmarks/step_bench.py):
   dash_fn with CUDA graphs, compiled, eager, the sequential per-block baseline and AdamW, for
   NDB and eigh, plain and refresh steps apart. TF32 off (float32 numerics as in the tests).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import dash_fn  # noqa: E402
from dash_fn.strategy import simulated_accelerator  # noqa: E402
from step_bench import bench, markdown, matmul_peak, speedups  # noqa: E402
from syncs import SyncCounter  # noqa: E402

# One transformer layer of Llama 953M (docs/ALGORITHM.md 3.2): fused qkv, o, gate, up, down.
LLAMA_953M_LAYER = {
    "qkv": (6144, 2048),
    "o": (2048, 2048),
    "gate": (5632, 2048),
    "up": (5632, 2048),
    "down": (2048, 5632),
}
TINY_LAYER = {"qkv": (96, 32), "o": (32, 32), "gate": (88, 32), "up": (88, 32), "down": (32, 88)}
CHECK_CONFIG = dict(solver="ndb", inv_root_freq=2, mu=0.5)  # the guard (skip_nonfinite) is on by default


@contextlib.contextmanager
def no_syncs_allowed(device: torch.device):
    """Raise on any op that waits on the device (CUDA); on the dry run, count those ops."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return
    with SyncCounter() as counter:
        yield
    if counter.syncs:
        raise RuntimeError(f"host syncs: {sorted(set(counter.syncs))}")


def model_and_data(device: torch.device, width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width), torch.nn.Tanh(), torch.nn.Linear(2 * width, width)
    ).to(device)
    data = [torch.randn(32, width, generator=torch.Generator().manual_seed(t)).to(device) for t in range(8)]
    return model, data


def sync_checks(device: torch.device, width: int, block: int, cuda_graphs: dict) -> list[tuple[str, str]]:
    """(check, result) of steady-state steps that must not sync."""
    rows = []
    for name, compile in (
        ("adapter, eager", False),
        ("adapter, compiled" + (" + CUDA graphs" if device.type == "cuda" else ""), cuda_graphs),
    ):
        model, data = model_and_data(device, width)
        opt = dash_fn.DASH(model.parameters(), lr=1e-2, block_size=block, compile=compile, **CHECK_CONFIG)
        steps = [lambda x=x, model=model, opt=opt: adapter_step(model, opt, x) for x in data]
        rows.append((name, run_checked(device, steps, compiled=bool(compile))))
    model, data = model_and_data(device, width)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    config = dash_fn.DashConfig(block_size=block, **CHECK_CONFIG)
    state = dash_fn.init(params, config)
    compiled = torch.compile(dash_fn.step, fullgraph=True, **cuda_graphs)
    lr = torch.tensor(1e-2, device=device)

    def functional(t: int) -> None:
        nonlocal params, state
        grads = {k: torch.randn_like(v) for k, v in params.items()}
        params, state = compiled(params, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))

    rows.append(
        (
            "functional step, compiled" + (" + CUDA graphs" if device.type == "cuda" else ""),
            run_checked(device, [lambda t=t: functional(t) for t in range(1, 9)], compiled=True),
        )
    )
    return rows


def adapter_step(model, opt, x) -> None:
    model.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def run_checked(device: torch.device, steps, compiled: bool) -> str:
    """Three warm-up steps (a refresh step and a plain step compile and record), then the rest
    under :func:`no_syncs_allowed` (a compiled step on the CPU only runs: a dispatch mode cannot
    watch compiled code, whose graphs tests/test_accelerator_path.py inspects instead)."""
    for step in steps[:3]:
        step()
    if compiled and device.type != "cuda":
        for step in steps[3:]:
            step()
        return f"ran {len(steps) - 3} steps (graphs: tests/test_accelerator_path.py)"
    try:
        with no_syncs_allowed(device):
            for step in steps[3:]:
                step()
    except RuntimeError as error:
        return f"FAILED: {str(error).splitlines()[0][:200]}"
    return f"no sync in {len(steps) - 3} steps"


def accuracy(device: torch.device, shapes: dict, block: int, solver: str, steps: int = 12) -> float:
    """Largest ``||W_device - W_cpu64|| / ||W_cpu64||`` over the parameters after ``steps`` steps."""
    config = dash_fn.DashConfig(block_size=block, solver=solver, inv_root_freq=3, refresh_schedule="periodic")
    gen = torch.Generator().manual_seed(0)
    start = {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}
    grads = [{k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()} for _ in range(steps)]
    results = []
    for where, dtype in ((device, torch.float32), (torch.device("cpu"), torch.float64)):
        with simulated_accelerator(False) if where.type == "cpu" else contextlib.nullcontext():
            params = {k: v.to(where, dtype) for k, v in start.items()}
            state = dash_fn.init(params, config)
            for t, g in enumerate(grads, 1):
                params, state = dash_fn.step(
                    params,
                    {k: v.to(where, dtype) for k, v in g.items()},
                    state,
                    lr=1e-2,
                    refresh=dash_fn.is_refresh_step(config, t),
                )
        results.append({k: v.cpu().double() for k, v in params.items()})
    got, want = results
    return max(float((got[k] - want[k]).norm() / want[k].norm()) for k in want)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes, aot_eager, the accelerator strategy simulated"
    )
    parser.add_argument("--solver", nargs="+", default=["ndb", "eigh"], help="root solvers to time")
    parser.add_argument("--reps", type=int, default=10, help="timed steps per row (median; 1 with --dry-run)")
    parser.add_argument("--out", help="also write the report (markdown) to this file")
    args = parser.parse_args(argv)
    with simulated_accelerator() if args.dry_run else contextlib.nullcontext():
        report = run(args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")


def run(args) -> str:
    if args.dry_run:
        device, shapes, block, reps, width = torch.device("cpu"), TINY_LAYER, 16, 1, 16
        compiled = {"dash_fn compiled (aot_eager)": {"backend": "aot_eager"}}
        cuda_graphs = {"backend": "aot_eager"}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check.py needs CUDA; use --dry-run to check the script on CPU")
        device, shapes, block, reps, width = torch.device("cuda"), LLAMA_953M_LAYER, 1024, args.reps, 512
        compiled = {
            "dash_fn compiled + CUDA graphs": {"backend": "inductor", "mode": "reduce-overhead"},
            "dash_fn compiled, no CUDA graphs": {"backend": "inductor"},
        }
        cuda_graphs = {"backend": "inductor", "mode": "reduce-overhead"}
        torch.backends.cuda.matmul.allow_tf32 = False
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (dry run, accelerator strategy simulated)"
    lines = [f"{name}, torch {torch.__version__}, TF32 off", ""]
    torch._dynamo.utils.counters.clear()
    checks = sync_checks(device, width, min(block, 256), cuda_graphs)
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    checks.append(
        (
            "CUDA-graph skips (Inductor's counter)",
            str(skips) if device.type == "cuda" else "n/a (no CUDA graphs on CPU)",
        )
    )
    small = {k: (r // 4, c // 4) for k, (r, c) in shapes.items()} if device.type == "cuda" else shapes
    for solver in ("ndb", "eigh"):
        checks.append(
            (
                f"{solver}: float32 on {device.type} vs float64 on CPU, 12 steps, max relative difference",
                f"{accuracy(device, small, min(block, 256), solver):.1e}",
            )
        )
    lines += ["| check | result |", "|---|---|", *[f"| {check} | {result} |" for check, result in checks], ""]
    torch._dynamo.reset()
    peak = matmul_peak(device)
    lines.append(f"float32 matmul peak measured {peak / 1e12:.2f} TFLOP/s\n")
    rows = []
    for solver in args.solver:
        rows += bench(shapes, "953M layer" if not args.dry_run else "tiny", block, solver, device, reps, peak, compiled)
        torch._dynamo.reset()
    lines += [markdown(rows), "", speedups(rows), "", f"total wall time {time.perf_counter() - start:.0f} s"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
