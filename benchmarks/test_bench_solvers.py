"""pytest-benchmark suite: one batched inverse-root call per (solver, block size).

    pytest benchmarks/test_bench_solvers.py --benchmark-enable                 # short default run
    DASH_BENCH_FULL=1 pytest benchmarks/test_bench_solvers.py --benchmark-enable   # real stack counts
    DASH_BENCH_MODEL=gpt2-small DASH_BENCH_WORLD=1 ...                            # another model / ranks

Stack counts come from the blocking plan of a real model (docs/ALGORITHM.md 3): the number of
(b, b) factors with p = 4 that one of ``DASH_BENCH_WORLD`` ranks owns (default: Llama 953M on 8
ranks, the paper's setting: 228 factors of 1024 per rank at B = 1024). On CUDA, or with
``DASH_BENCH_FULL=1``, the benchmark solves that many blocks. Otherwise (the default on CPU)
it solves a slice of at most ``2 * 256^3 / b^3`` blocks (16 at b = 128, 1 from b = 512), so the
whole suite takes about a minute on 2 cores; the solvers are batched per block, so time scales
linearly with the count, and ``extra_info`` reports the per-block time and the extrapolated
refresh time of the model's whole stack (``model_stack_s``).

Inputs are Wishart factors ``G G^T / n`` (n = 2b), the spectra gradients give; float32.
16-bit matmul_dtype is benchmarked only on CUDA: elsewhere it is emulated in float32 (see
dash_fn.roots.matmul), so its time says nothing about 16-bit speed.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import dash_fn
from dash_fn.plan import make_plan

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FULL = DEVICE.type == "cuda" or os.environ.get("DASH_BENCH_FULL") == "1"
MODEL = os.environ.get("DASH_BENCH_MODEL", "llama-953m")
WORLD = int(os.environ.get("DASH_BENCH_WORLD", "8"))
BLOCK_SIZES = (128, 256, 512, 1024)


def model_shapes(name: str) -> list[tuple[int, int]]:
    """Matrix parameter shapes of a model (vectors do not make factors under one_dim=adamw)."""
    if name == "llama-953m":  # docs/ALGORITHM.md 3.2
        layer = [(6144, 2048), (2048, 2048), (5632, 2048), (5632, 2048), (2048, 5632)]
        return 16 * layer + 2 * [(32000, 2048)]
    if name == "gpt2-small":
        layer = [(2304, 768), (768, 768), (3072, 768), (768, 3072)]
        return 12 * layer + [(50257, 768)]
    raise ValueError(f"DASH_BENCH_MODEL must be llama-953m or gpt2-small, got {name!r}")


def model_stack_count(b: int) -> int:
    """Factors of size b (p = 4) one rank owns when the model is blocked with block_size b."""
    plan = make_plan([(str(i), s, torch.float32) for i, s in enumerate(model_shapes(MODEL))], b, "adamw")
    count = sum(f.count for f in plan.factors if f.size == b and f.order == 4)
    return math.ceil(count / WORLD)


def benchmark_count(b: int) -> int:
    model = model_stack_count(b)
    return model if FULL else max(1, min(model, 2 * 256**3 // b**3))


def wishart_stack(K: int, b: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(b)
    G = torch.randn(K, b, 2 * b, generator=gen)
    return (G @ G.mT / (2 * b)).to(DEVICE)


SOLVERS = {
    "eigh": dict(solver="eigh"),
    "cn": dict(solver="cn", scaling="fro"),
    "ndb": dict(solver="ndb"),
    "chebyshev": dict(solver="chebyshev", scaling="fro"),
}
if DEVICE.type == "cuda":
    SOLVERS |= {
        "cn-fp16": dict(solver="cn", scaling="fro", matmul_dtype="float16"),
        "ndb-bf16": dict(solver="ndb", matmul_dtype="bfloat16"),
    }


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("b", BLOCK_SIZES)
@pytest.mark.parametrize("name", list(SOLVERS))
def test_inverse_root(benchmark, name, b):
    config = dash_fn.DashConfig(**SOLVERS[name])
    K = benchmark_count(b)
    X = wishart_stack(K, b)
    start = dash_fn.utils.start_vectors(b, config, device=DEVICE)

    def solve():
        out = dash_fn.inverse_root(X, 4, config, start)
        sync()
        return out

    out = benchmark.pedantic(solve, rounds=3, warmup_rounds=1)
    assert torch.isfinite(out).all()
    stats = benchmark.stats.stats if benchmark.stats is not None else None  # None under --benchmark-disable
    benchmark.extra_info.update(device=str(DEVICE), model=MODEL, world=WORLD, model_stack=model_stack_count(b), stack=K)
    if stats is not None:
        benchmark.extra_info.update(
            per_block_ms=1e3 * stats.median / K, model_stack_s=stats.median / K * model_stack_count(b)
        )
