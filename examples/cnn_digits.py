"""A small CNN on scikit-learn's bundled 8x8 digits (no download), DASH beside AdamW.

    python examples/cnn_digits.py [--steps 300]

Conv kernels (out, in, 3, 3) are preconditioned as (out, in*9) matrices: the printout lists
how dash_fn cut each parameter into blocks. Needs the optional dependency scikit-learn
(``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

import dash_fn


def load_digits_tensors(seed: int):
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:  # an optional dependency: say how to get it
        raise SystemExit("cnn_digits.py needs scikit-learn: pip install scikit-learn") from error
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.GELU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.GELU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(32 * 16, 10),
    )


def run(optimizer: str, lr: float, steps: int, seed: int, data) -> tuple[float, float]:
    (x, y), (x_test, y_test) = data
    model = make_model(seed)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    loss_fn = lambda p, xb, yb: nn.functional.cross_entropy(functional_call(model, p, (xb,)), yb)
    grad_fn = grad_and_value(loss_fn)
    if optimizer == "dash":
        state = dash_fn.init(params, dash_fn.DashConfig(block_size=128, solver="eigh", inv_root_freq=5))
    else:
        leaves = {k: v.clone() for k, v in params.items()}
        opt = torch.optim.AdamW(list(leaves.values()), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (64,), generator=gen)
        grads, _ = grad_fn(params, x[idx], y[idx])
        if optimizer == "dash":
            params, state = dash_fn.step(params, grads, state, lr=lr)
        else:
            for k, g in grads.items():
                leaves[k].grad = g
            opt.step()
            params = leaves
    with torch.no_grad():
        logits = functional_call(model, params, (x_test,))
        return float(nn.functional.cross_entropy(logits, y_test)), float((logits.argmax(1) == y_test).float().mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps of each optimizer")
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate of both optimizers")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the train/test split, the initialization and the batches"
    )
    args = parser.parse_args(argv)
    data = load_digits_tensors(args.seed)
    params = dict(make_model(args.seed).named_parameters())
    plan = dash_fn.init({k: v.detach() for k, v in params.items()}, dash_fn.DashConfig(block_size=128, solver="eigh"))[
        "plan"
    ]
    for p in plan.params:
        blocks = ", ".join(f"{r.count} x ({r.block_rows}, {r.block_cols})" for r in p.regions) or "AdamW"
        print(f"{p.name:12s} {str(p.shape):18s} viewed as {str(p.view):12s} -> {blocks}")
    for optimizer in ("adamw", "dash"):
        loss, accuracy = run(optimizer, args.lr, args.steps, args.seed, data)
        print(
            f"{optimizer:6s} lr {args.lr:g}: test loss {loss:.4f}, "
            f"test accuracy {100 * accuracy:.1f}% after {args.steps} steps"
        )


if __name__ == "__main__":
    main()
