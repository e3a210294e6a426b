"""Quick start: train a small MLP on generated data with dash_fn, beside torch.optim.AdamW.

    python examples/quickstart.py [--steps 200]

The model is written with torch.func.functional_call, so parameters are a plain dict that
dash_fn.init / dash_fn.step take and return. Prints both optimizers' batch loss every tenth of
the run, side by side, then each one's loss on the whole data set before and after training.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.func import functional_call, grad_and_value

import dash_fn


def make_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A smooth nonlinear regression target from a fixed random teacher network."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=gen)
    teacher = torch.randn(32, 8, generator=gen) / 32**0.5
    return x, torch.tanh(x @ teacher) + 0.1 * torch.sin(3 * x[:, :8])


def model_and_params(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 8))
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps of each optimizer")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the initialization")
    args = parser.parse_args()
    x, y = make_data(2048, args.seed)
    model, params = model_and_params(args.seed)

    def loss_fn(p, xb, yb):
        return nn.functional.mse_loss(functional_call(model, p, (xb,)), yb)

    start_loss = float(loss_fn(params, x, y))  # both optimizers start from these parameters

    # DASH: the state is a TensorDict of stacked blocks; step is pure (state buffers are donated).
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=64, solver="eigh"))
    grad_fn = grad_and_value(loss_fn)
    dash_curve = []
    for t in range(args.steps):
        idx = torch.arange(t * 128, (t + 1) * 128) % x.shape[0]
        grads, loss = grad_fn(params, x[idx], y[idx])
        params, state = dash_fn.step(params, grads, state, lr=3e-3)
        dash_curve.append(loss.item())
    dash_loss = float(loss_fn(params, x, y))

    model, params = model_and_params(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    adamw_curve = []
    for t in range(args.steps):
        idx = torch.arange(t * 128, (t + 1) * 128) % x.shape[0]
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        adamw_curve.append(loss.item())
    with torch.no_grad():
        adamw_loss = float(nn.functional.mse_loss(model(x), y))

    every = max(1, args.steps // 10)
    print(" step  DASH (eigh)    AdamW   (loss on the step's batch of 128)")
    for t in sorted({*range(0, args.steps, every), args.steps - 1}):
        print(f"{t:5d}  {dash_curve[t]:11.5f}  {adamw_curve[t]:7.5f}")
    print(f"loss on all {x.shape[0]} samples: {start_loss:.5f} at the start")
    print(f"after {args.steps} steps: DASH (eigh) loss {dash_loss:.5f}, AdamW loss {adamw_loss:.5f}")


if __name__ == "__main__":
    main()
