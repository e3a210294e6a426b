"""The GPU check: the step table on CUDA for the DASH paper's Llama-953M layer at block 1024.

    python benchmarks/gpu_check.py            # on a CUDA machine; finishes within 8 minutes on one H200
    python benchmarks/gpu_check.py --dry-run  # on CPU with tiny shapes and aot_eager: checks the script

Rows: dash_fn compiled with CUDA graphs (mode="reduce-overhead") and without, dash_fn eager,
the sequential per-block baseline and torch.optim.AdamW, for the solvers eigh and ndb, plain
and refresh steps apart (refresh flag from the host, the form CUDA graphs capture). TF32 is
left off (fp32 numerics as in the tests). Prints the markdown table to paste into RESULTS.md.
"""

from __future__ import annotations

import argparse
import time

import torch

from step_bench import bench, markdown, matmul_peak, speedups

# One transformer layer of Llama 953M (docs/ALGORITHM.md 3.2): fused qkv, o, gate, up, down.
LLAMA_953M_LAYER = {"qkv": (6144, 2048), "o": (2048, 2048), "gate": (5632, 2048), "up": (5632, 2048), "down": (2048, 5632)}
TINY_LAYER = {"qkv": (96, 32), "o": (32, 32), "gate": (88, 32), "up": (88, 32), "down": (32, 88)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, aot_eager")
    parser.add_argument("--solver", nargs="+", default=["ndb", "eigh"], help="root solvers to time")
    parser.add_argument("--reps", type=int, default=10, help="timed steps per row (median; 1 with --dry-run)")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, shapes, block, reps = torch.device("cpu"), TINY_LAYER, 16, 1
        compiled = {"dash_fn compiled (aot_eager)": {"backend": "aot_eager"}}
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check.py needs CUDA; use --dry-run to check the script on CPU")
        device, shapes, block, reps = torch.device("cuda"), LLAMA_953M_LAYER, 1024, args.reps
        compiled = {
            "dash_fn compiled + CUDA graphs": {"backend": "inductor", "mode": "reduce-overhead"},
            "dash_fn compiled, no CUDA graphs": {"backend": "inductor"},
        }
        torch.backends.cuda.matmul.allow_tf32 = False
    start = time.perf_counter()
    peak = matmul_peak(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (dry run)"
    print(f"{name}, torch {torch.__version__}, float32 matmul peak measured {peak / 1e12:.2f} TFLOP/s, TF32 off\n")
    rows = []
    for solver in args.solver:
        rows += bench(shapes, "953M layer" if not args.dry_run else "tiny", block, solver, device, reps, peak, compiled)
        torch._dynamo.reset()
    print(markdown(rows))
    print()
    print(speedups(rows))
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
