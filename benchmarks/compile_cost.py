"""What the first compiled step costs: ``DASH(model.parameters(), compile=True)`` on the main job's model.

    python -m benchmarks.compile_cost [--steps 10]

Each row is a fresh Python process (as a user's training run is) stepping the main job's
Llama (examples/train_lm.py's default size) with the compiled adapter: the first step's wall
time (Dynamo traces, Inductor generates and builds C++ kernels) against the median of the next
``--steps`` plain steps. "cold" starts from an empty Inductor/Triton cache directory (a first
run on a machine), "warm" reuses the cache the cold run filled (every later run: the kernels
load from disk, Dynamo still traces). Eager steps of the same model are timed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.machine import machine_line

ROOT = Path(__file__).resolve().parents[1]

# one process: the model, its gradients from one batch, and the timed steps (printed as JSON)
RUN = """
import json, statistics, sys, time
import torch
import dash_fn
from examples.llama import Llama, LlamaConfig, next_byte_loss

compile_, steps = sys.argv[1] == "compiled", int(sys.argv[2])
torch.manual_seed(0)
model = Llama(LlamaConfig())
tokens = torch.randint(0, 256, (8, 129), generator=torch.Generator().manual_seed(0))
next_byte_loss(model, dict(model.named_parameters()), tokens).backward()  # fixed gradients: only steps timed
opt = dash_fn.DASH(model.parameters(), lr=1e-3, compile=compile_)
times = []
for _ in range(steps + 1):
    start = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"first": times[0], "median": statistics.median(times[1:])}))
"""


def run(kind: str, steps: int, cache: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}  # where the examples package is
    env.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
    out = subprocess.run(
        [sys.executable, "-c", RUN, kind, str(steps)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="plain steps timed after the first")
    args = parser.parse_args()
    print(machine_line())
    print("\n| run | first step (s) | later steps, median (ms) |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        for label, kind in (
            ("eager", "eager"),
            ("compiled, cold cache", "compiled"),
            ("compiled, warm cache", "compiled"),
        ):
            row = run(kind, args.steps, cache)
            print(f"| {label} | {row['first']:.2f} | {1000 * row['median']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
