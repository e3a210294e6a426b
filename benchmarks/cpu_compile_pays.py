"""On which models ``DASH(compile=True)`` pays on a CPU, and what ``retain_freed_cpu_memory`` gives.

    python -m benchmarks.cpu_compile_pays                 # every model, 3 rounds of 20 steps
    python -m benchmarks.cpu_compile_pays --models mlp    # one model

For each model the adapter's step (fixed gradients, the defaults, a warm-up of 12 steps that
compiles and passes every root phase) eager and compiled with Inductor, timed in alternating
rounds so that load hits both alike; once in a process as glibc leaves it and once in a
process that called ``dash_fn.utils.retain_freed_cpu_memory()`` first (the setting is
process-wide, so each side gets a process of its own). Prints ms per step, medians of the
rounds, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import dash_fn
from benchmarks.machine import machine_line
from examples.llama import Llama, LlamaConfig

ROOT = Path(__file__).resolve().parents[1]


def _transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)


MODELS = {
    # the README's quick-start MLP: 2.6K parameters
    "mlp": lambda: torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)),
    # a small transformer encoder (width 128, 2 layers): 0.4M parameters
    "transformer": _transformer,
    # the main job's byte-level Llama (examples/train_lm.py's default size): 0.46M parameters
    "llama": lambda: Llama(LlamaConfig(d_model=128, n_layers=2, n_heads=4, mlp_hidden=8 * 128 // 3, context=64)),
    # two wide layers (1024 x 4096 and back): 8.4M parameters, temporaries of several MB a block stack
    "wide": lambda: torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.Linear(4096, 1024)),
}


def optimizer(model: str, compile: bool) -> tuple[dash_fn.DASH, int]:
    """The adapter over ``model`` with fixed gradients, warmed up for 12 steps; and its size."""
    torch.manual_seed(0)
    net = MODELS[model]()
    opt = dash_fn.DASH(net.parameters(), lr=3e-3, compile=compile)
    for p in net.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    for _ in range(12):
        opt.step()
    return opt, sum(p.numel() for p in net.parameters())


def measure(models: list[str], rounds: int, steps: int) -> dict:
    """ms per step (median of rounds) of each model's eager and compiled step, in this process."""
    found = {}
    for model in models:
        (eager, size), (compiled, _) = optimizer(model, False), optimizer(model, True)
        forms = {"eager": eager, "compiled": compiled}
        times: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(rounds):
            for name, opt in forms.items():
                start = time.perf_counter()
                for _ in range(steps):
                    opt.step()
                times[name].append(1e3 * (time.perf_counter() - start) / steps)
        found[model] = {name: statistics.median(values) for name, values in times.items()}
        found[model]["params"] = size
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="models to time")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of timed steps")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (their mean is the round's time)")
    parser.add_argument("--retain", choices=["yes", "no"], help="(internal) measure in this process, as JSON")
    args = parser.parse_args(argv)
    if args.retain is not None:
        if args.retain == "yes":
            assert dash_fn.utils.retain_freed_cpu_memory(), "not glibc: the setting took no effect"
        print(json.dumps(measure(args.models, args.rounds, args.steps)))
        return
    sides = {}
    for retain in ("no", "yes"):
        command = [sys.executable, "-m", "benchmarks.cpu_compile_pays", "--retain", retain]
        command += ["--rounds", str(args.rounds)]
        command += ["--steps", str(args.steps), "--models", *args.models]
        out = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
        sides[retain] = json.loads(out.strip().splitlines()[-1])
    print(f"machine: {machine_line()}; DashConfig() defaults\n")
    print(
        "| model | parameters | eager, ms | compiled, ms | compiled / eager | eager, retained, ms "
        "| compiled, retained, ms | compiled / eager, retained |\n|---|---|---|---|---|---|---|---|"
    )
    for model in args.models:
        plain, kept = sides["no"][model], sides["yes"][model]
        print(
            f"| {model} | {plain['params']:,} | {plain['eager']:.2f} | {plain['compiled']:.2f} "
            f"| {plain['compiled'] / plain['eager']:.2f} | {kept['eager']:.2f} | {kept['compiled']:.2f} "
            f"| {kept['compiled'] / kept['eager']:.2f} |"
        )


if __name__ == "__main__":
    main()
