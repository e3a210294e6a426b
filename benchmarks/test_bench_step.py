"""pytest-benchmark suite for the optimizer step (the table with FLOPs and memory: step_bench.py).

    pytest benchmarks/test_bench_step.py --benchmark-enable

One Llama-like layer (d_model 512, MLP 4x) at block 128 on the CPU: dash_fn eager and
compiled (Inductor), the sequential per-block baseline and torch AdamW; plain and refresh steps.
"""

import pytest
import torch

import dash_fn
from benchmarks.step_bench import layer_shapes, make_impls

D_MODEL, BLOCK = 512, 128


@pytest.fixture(scope="module", params=["eigh", "ndb"])
def impls(request):
    config = dash_fn.DashConfig(block_size=BLOCK, solver=request.param)
    _, impls = make_impls(
        layer_shapes(D_MODEL), config, torch.device("cpu"), {"dash_fn compiled": {"backend": "inductor"}}
    )
    return impls


CASES = [
    (impl, kind)
    for impl in ("dash_fn compiled", "dash_fn eager", "sequential per-block")
    for kind in ("plain", "refresh")
]
CASES.append(("torch AdamW (foreach)", "plain"))  # AdamW has no refresh step


@pytest.mark.parametrize("impl, kind", CASES)
def test_step(benchmark, impls, impl, kind):
    plain, refresh, _ = impls[impl]
    fn = plain if kind == "plain" else refresh
    fn()  # compile / warm up outside the timing
    benchmark.pedantic(fn, rounds=3, iterations=1)
