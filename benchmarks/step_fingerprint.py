"""Did a refactor change any bit? Train a fixed set of configs and compare two commits' results.

    python -m benchmarks.step_fingerprint save OUT.pt      # at each commit (or worktree)
    python -m benchmarks.step_fingerprint compare A.pt B.pt

An older commit runs from a worktree put first on the path, from outside this checkout (``cd
/tmp && PYTHONPATH=WORKTREE:THIS_CHECKOUT python -m benchmarks.step_fingerprint save OLD.pt``):
the same configs, its code.

``save`` trains fifteen configs (the default; periodic eigh with refresh read on the host; NDB;
coupled Newton with AdaGrad grafting and Nesterov momentum; Chebyshev unguarded without a
gradient EMA; bfloat16 factors and roots; a late start of preconditioning; factor sums; the
eigenvalue-corrected preconditioner staggered, periodic with qr bases, and with AdaGrad's
moment and no gradient EMA; the fixed norms, with heavy-ball momentum and with a late periodic
start; never preconditioning; a warm-up) for 7 steps on a small model with a matrix, a thin
block, a ragged matrix, an embedding-like matrix and a vector, with a NaN gradient at step 4
and gradients scaled by 1e3 at step 5; each eagerly, compiled (``aot_eager``) and under the
simulated accelerator strategy. It saves every parameter and state tensor. ``compare`` reports
the entries whose bits differ (exit 1 if any).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import dash_fn
from dash_fn.strategy import simulated_accelerator

CONFIGS = {
    "default": {},
    "periodic": dict(refresh_schedule="periodic", inv_root_freq=3),
    "ndb": dict(solver="ndb", inv_root_freq=2),
    "cn-adagrad-nesterov": dict(
        solver="cn", grafting="adagrad", mu=0.9, nesterov=True, refresh_schedule="periodic", inv_root_freq=2
    ),
    "chebyshev-unguarded": dict(solver="chebyshev", skip_nonfinite=False, beta_G=0.0),
    "bf16-storage": dict(factor_dtype="bfloat16", root_dtype="bfloat16", solver="ndb"),
    "start3": dict(start_prec_step=3, inv_root_freq=2),
    "sums": dict(beta_LR=1.0, refresh_schedule="periodic", inv_root_freq=2),
    "corrected": dict(preconditioner="eigenvalue_corrected", inv_root_freq=2),
    "corrected-periodic-qr": dict(
        preconditioner="eigenvalue_corrected", solver="qr", refresh_schedule="periodic", inv_root_freq=2
    ),
    "corrected-adagrad-no-ema": dict(preconditioner="eigenvalue_corrected", grafting="adagrad", beta_G=0.0),
    "rms-heavy-ball": dict(grafting="rms", mu=0.9, nesterov=False, inv_root_freq=3),
    "spectral-start3-periodic": dict(
        grafting="spectral", start_prec_step=3, refresh_schedule="periodic", inv_root_freq=2
    ),
    "never": dict(start_prec_step=math.inf, grafting="rms"),
    "warmup": dict(inv_root_warmup=3, inv_root_freq=3),
}
MODES = ("eager", "compiled", "accelerator")


def _params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    shapes = {"w": (96, 64), "ragged": (64, 17), "thin": (256, 8), "bias": (64,), "embedding": (300, 32)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def _train(options: dict, mode: str) -> dict[str, torch.Tensor]:
    params = _params()
    config = dash_fn.DashConfig(block_size=32, **options)
    state = dash_fn.init(params, config)
    step = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager") if mode == "compiled" else dash_fn.step
    g = torch.Generator().manual_seed(2)
    for t in range(1, 8):
        grads = {k: torch.randn(v.shape, generator=g) * (1e3 if t == 5 else 1.0) for k, v in params.items()}
        if t == 4:
            grads["w"][3, 3] = float("nan")
        refresh = dash_fn.is_refresh_step(config, t)
        if mode == "eager" and config.refresh_schedule == "periodic" and t % 2:
            refresh = None  # read on the host
        lr = 0.01 if mode == "eager" else torch.tensor(0.01)
        params, state = step(params, grads, state, lr=lr, refresh=refresh)
    out = {f"param.{k}": v for k, v in params.items()}
    for key, value in state.items(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor):
            out["state." + (".".join(key) if isinstance(key, tuple) else key)] = value.clone()
    return out


def save(path: str) -> None:
    results = {}
    for mode in MODES:
        for name, options in CONFIGS.items():
            torch._dynamo.reset()
            with simulated_accelerator(mode == "accelerator"):
                results[f"{mode}/{name}"] = _train(options, mode)
    torch.save(results, path)
    print(f"saved {sum(len(r) for r in results.values())} tensors of {len(results)} runs to {path}")


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(-1).view(torch.uint8) if x.dtype.is_floating_point else x


def compare(a_path: str, b_path: str) -> int:
    a, b = torch.load(a_path), torch.load(b_path)
    differing = []
    for run in sorted(set(a) | set(b)):
        for key in sorted(set(a.get(run, {})) | set(b.get(run, {}))):
            x, y = a.get(run, {}).get(key), b.get(run, {}).get(key)
            same = x is not None and y is not None and x.shape == y.shape and x.dtype == y.dtype
            if not (same and torch.equal(_bits(x), _bits(y))):
                differing.append(f"{run}: {key}")
    total = sum(len(r) for r in a.values())
    print(f"{total} tensors of {len(a)} runs compared; {len(differing)} differ")
    for line in differing:
        print("  " + line)
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("save").add_argument("out")
    cmp = sub.add_parser("compare")
    cmp.add_argument("a")
    cmp.add_argument("b")
    args = parser.parse_args()
    if args.command == "save":
        save(args.out)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
