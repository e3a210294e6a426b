"""Optimizer-state bytes per parameter entry, per parameter shape (the reference keeps ~8 floats).

    python -m benchmarks.state_memory [--block-size 1024]

Prints a markdown table: for each shape, the bytes of state dash_fn.init allocates (float32
parameters, default config: mu = 0, beta_G > 0) divided by the parameter count, and that ratio
in float32 words. Shapes are Llama-953M layers plus ragged and thin ones where strips cost more.
"""

from __future__ import annotations

import argparse

import torch

import dash_fn

SHAPES = [(2048, 2048), (6144, 2048), (5632, 2048), (2048, 5632), (32000, 2048), (768, 768), (1025, 1025), (4096,)]


def state_bytes(state) -> int:
    return sum(
        v.numel() * v.element_size()
        for v in state.values(include_nested=True, leaves_only=True)
        if isinstance(v, torch.Tensor)
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--block-size", type=int, default=1024, help="DASH block size")
    args = parser.parse_args()
    config = dash_fn.DashConfig(block_size=args.block_size, solver="eigh")
    print(f"block_size = {args.block_size}, float32 parameters, mu = 0\n")
    print("| shape | parameters | state bytes | bytes / parameter | float32 words / parameter |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        param = torch.empty(shape, device="meta")  # meta: sizes only, no memory
        state = dash_fn.init({"w": param}, config)
        n = param.numel()
        b = state_bytes(state)
        print(f"| {shape} | {n:,} | {b:,} | {b / n:.2f} | {b / n / 4:.2f} |")


if __name__ == "__main__":
    main()
