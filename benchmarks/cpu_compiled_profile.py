"""Where a CPU step of ``DASH(compile=True)`` goes, beside the eager step, on the main job's model.

    python -m benchmarks.cpu_compiled_profile            # 3 rounds of 20 steps each, then profiles
    python -m benchmarks.cpu_compiled_profile --quick    # 1 round of 3 steps, short profiles

The main job's byte-level Llama (``examples/train_lm.py``'s default size and block size, 128)
with fixed gradients and the defaults otherwise (staggered eigh refresh every 10 steps): the eager and the
compiled (Inductor) adapter steps after a warm-up of 12 steps (compilation, every root phase),
timed in alternating rounds so that load hits both alike, then each step's top operators under
``torch.profiler`` (self CPU time over ``--profile-steps`` steps).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dash_fn
from benchmarks.machine import machine_line
from examples.llama import Llama, LlamaConfig


def optimizer(compile: bool, block_size: int) -> dash_fn.DASH:
    """The adapter over the main job's model, its gradients fixed, warmed up for 12 steps."""
    torch.manual_seed(0)
    model = Llama(LlamaConfig(d_model=128, n_layers=2, n_heads=4, mlp_hidden=8 * 128 // 3, context=64))
    opt = dash_fn.DASH(model.parameters(), lr=3e-3, block_size=block_size, compile=compile)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    for _ in range(12):
        opt.step()
    return opt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--block-size", type=int, default=128, help="blocks (the main job's 128; DashConfig's 256)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of timed steps")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (their mean is the round's time)")
    parser.add_argument("--profile-steps", type=int, default=10, help="steps under torch.profiler per form")
    parser.add_argument("--top", type=int, default=12, help="operators listed per profile")
    parser.add_argument("--quick", action="store_true", help="1 round of 3 steps, 2 profiled steps: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.profile_steps = 1, 3, 2
    forms = {"eager": optimizer(False, args.block_size), "compiled": optimizer(True, args.block_size)}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):
        for name, opt in forms.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                opt.step()
            times[name].append(1e3 * (time.perf_counter() - start) / args.steps)
    print(f"machine: {machine_line()}; blocks of {args.block_size}\n")
    print("| step | ms (median of rounds) | rounds |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    from torch.profiler import ProfilerActivity, profile

    for name, opt in forms.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                opt.step()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=40)
        print(f"\n{name}, {args.profile_steps} steps:\n{table}")


if __name__ == "__main__":
    main()
