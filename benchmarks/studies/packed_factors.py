# A study (benchmarks/studies/README.md): kept as it ran, not maintained, imported by no test.
# Ran at: 92188fa (2026-12-03; this script as of afe6890), on the 2-core development VM:
#   python benchmarks/packed_factors.py                (today: python -m benchmarks.studies.packed_factors)
# Figures: benchmarks/history/memory.md, "Packed factors".
"""Would packed factors pay? The factor EMA with factors kept whole (dash_fn) against two packed forms.

    python -m benchmarks.studies.packed_factors [--d 1024] [--block-size 256] [--reps 15]

Symmetric factors need only a triangle: b(b + 1)/2 of b² entries. On peers.py's model (3 x
Linear(d, d) with bias, block b) this script times, side by side in one process (medians of
``--reps`` alternating repetitions, each of a few calls):

- "plain step": ``dash_fn.step`` eagerly on a step that refreshes nothing (periodic schedule), the
  step a packed form would slow down;
- "whole (dash_fn)": the factor EMA as dash_fn runs it on the CPU, ``F <- beta F + (1 - beta) G G^T``
  inside the product (``baddbmm_``), for the left and the right factors of every block;
- "packed triangle": the product formed whole, then its upper triangle gathered into a packed
  (K, b(b + 1)/2) factor by ``F.mul_(beta).add_(P[:, i, j], alpha=1 - beta)``;
- "paired triangles": a block's L in the upper triangle and its R in the strict lower triangle of
  one b x b tensor (R's diagonal apart, (K, b)): both products formed whole, merged with one
  ``where`` and one EMA, half the factor memory with contiguous, elementwise work.

It prints each form's EMA time, its extra time over dash_fn's as a fraction of the plain step,
and the bytes of factor state per parameter. A prototype of the EMA only: the roots still need
whole factors at a refresh (unpacking, amortized over inv_root_freq steps, is not timed).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import dash_fn
from benchmarks.machine import machine_line

BETA = 0.95


def seconds(fn, calls: int = 3) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--d", type=int, default=1024, help="width of the 3 x Linear(d, d) model")
    parser.add_argument("--block-size", type=int, default=256, help="DASH block size")
    parser.add_argument("--reps", type=int, default=15, help="alternating repetitions (medians reported)")
    args = parser.parse_args(argv)
    d, b = args.d, args.block_size
    gen = torch.Generator().manual_seed(0)
    params = {
        f"{i}.{k}": torch.randn(s, generator=gen) * 0.02 for i in range(3) for k, s in (("w", (d, d)), ("b", (d,)))
    }
    grads = {k: torch.randn(v.shape, generator=gen) for k, v in params.items()}
    config = dash_fn.DashConfig(block_size=b, solver="eigh", refresh_schedule="periodic", inv_root_freq=10**6)
    state = dash_fn.init(params, config)
    _, state = dash_fn.step(params, grads, state, lr=1e-3, refresh=True)  # roots once; then plain steps

    def plain_step():
        dash_fn.step(params, grads, state, lr=1e-3, refresh=False)

    K = 3 * (d // b) ** 2  # blocks; each has a left and a right factor of size b
    G = torch.randn(K, b, b, generator=gen)
    whole = torch.zeros(2 * K, b, b)
    rows, cols = torch.triu_indices(b, b)
    packed = torch.zeros(2 * K, rows.numel())
    upper = torch.ones(b, b, dtype=torch.bool).triu()
    paired, diagonal = torch.zeros(K, b, b), torch.zeros(K, b)

    def ema_whole():
        whole[:K].baddbmm_(G, G.mT, beta=BETA, alpha=1 - BETA)
        whole[K:].baddbmm_(G.mT, G, beta=BETA, alpha=1 - BETA)

    def ema_packed():
        for part, P in ((packed[:K], G @ G.mT), (packed[K:], G.mT @ G)):
            part.mul_(BETA).add_(P[:, rows, cols], alpha=1 - BETA)

    def ema_paired():
        left, right = G @ G.mT, G.mT @ G
        paired.mul_(BETA).add_(torch.where(upper, left, right), alpha=1 - BETA)
        diagonal.mul_(BETA).add_(right.diagonal(dim1=-2, dim2=-1), alpha=1 - BETA)

    forms = {"plain step": plain_step, "whole (dash_fn)": ema_whole, "packed triangle": ema_packed}
    forms["paired triangles"] = ema_paired
    for fn in forms.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.reps):
        for name, fn in forms.items():
            times[name].append(seconds(fn))
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    n = sum(p.numel() for p in params.values())
    factor_bytes = {
        "whole (dash_fn)": whole.nbytes,
        "packed triangle": packed.nbytes,
        "paired triangles": paired.nbytes + diagonal.nbytes,
    }
    print(machine_line(), "\n")
    print(
        f"3 x Linear({d}, {d}) with bias, block {b}: {K} blocks, {2 * K} factors of {b} x {b}; plain step "
        f"{ms['plain step']:.1f} ms (median of {args.reps})\n"
    )
    print("| factor EMA | ms | extra over dash_fn's, in plain steps | factor bytes / parameter |")
    print("|---|---|---|---|")
    for name, nbytes in factor_bytes.items():
        extra = (ms[name] - ms["whole (dash_fn)"]) / ms["plain step"]
        print(f"| {name} | {ms[name]:.1f} | {extra:+.1%} | {nbytes / n:.2f} |")


if __name__ == "__main__":
    main()
