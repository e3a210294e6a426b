"""The size of the compiled step at the DASH paper's 953M layer (block 1024), where compile time is spent.

Each chunk of a refresh (:func:`dash_fn.roots.chunk_blocks`) is one more unrolled copy of the
solver in the traced graph, and Dynamo, AOT autograd and Inductor take time in proportion to
the graph's ops: a GPU run that has minutes cannot afford a refresh cut into blocks of one.
Traced with ``make_fx`` on meta tensors (the accelerator strategy, no memory, no arithmetic).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import dash_fn
import dash_fn.roots as roots

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from gpu_check import LLAMA_953M_LAYER  # noqa: E402  (the layer the GPU check compiles)


def traced_ops(schedule: str, refresh: bool | None) -> tuple[int, int]:
    """(ops, matrix products) of one NDB step's graph at the 953M layer."""
    params = {k: torch.empty(s, device="meta") for k, s in LLAMA_953M_LAYER.items()}
    grads = {k: torch.empty_like(v) for k, v in params.items()}
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=1024, solver="ndb", refresh_schedule=schedule))
    graph = make_fx(lambda p, g, lr: dash_fn.step(p, g, state, lr=lr, refresh=refresh)[0])(
        params, grads, torch.tensor(1e-3, device="meta")
    ).graph
    ops = [node for node in graph.nodes if node.op == "call_function"]
    return len(ops), sum("mm" in str(node.target) for node in ops)


def one_solve_ops() -> int:
    """Ops of one NDB inverse 4th root of a (K, 1024, 1024) stack, whatever K."""
    config = dash_fn.DashConfig(block_size=1024, solver="ndb")
    start = roots.start_vectors(1024, config, device="meta")
    graph = make_fx(lambda X: roots.inverse_root(X, 4, config, start))(torch.empty(4, 1024, 1024, device="meta")).graph
    return sum(node.op == "call_function" for node in graph.nodes)


@pytest.mark.parametrize(
    "schedule, refresh, solves",
    [
        ("staggered", None, 2),  # each of the two factor stacks (98 blocks of 1024, 6 of 512) its slice in one chunk
        ("periodic", True, 7),  # 98 blocks of 4 MiB in 1 GiB of NDB temporaries: 5 chunks, and the 512 stack
    ],
)
def test_the_953m_layer_refresh_holds_few_solver_copies(schedule, refresh, solves):
    """The graph holds about ``solves`` copies of the solver (a chunk is a copy), not one per
    block (a staggered slice of 10 blocks cut into chunks of one was 10 copies a stack)."""
    ops, products = traced_ops(schedule, refresh)
    per_solve = one_solve_ops()
    assert (solves - 1) * per_solve < ops < (solves + 1) * per_solve, (ops, per_solve)
    assert products < 80 * solves, products


def test_chunks_follow_memory_beyond_the_floor():
    """The floor lifts only small stacks: 1568 blocks of 4 MiB (the whole 953M model's refresh)
    are still cut so that NDB's temporaries stay within one stack."""
    block = 1024 * 1024 * 4
    assert roots.chunk_blocks(10, block, "ndb") == 10  # a staggered slice: whole
    assert roots.chunk_blocks(98, block, "ndb") == roots.SMALL_WORKSPACE // (roots.WORKSPACE["ndb"] * block)
    chunk = roots.chunk_blocks(1568, block, "ndb")
    assert chunk * roots.WORKSPACE["ndb"] <= 1568 and 1568 // chunk <= 13
