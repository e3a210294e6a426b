"""A refresh holds at most two factor stacks: the result and one chunk's temporaries."""

from __future__ import annotations

import pytest
import torch

import dash_fn
import dash_fn.roots as roots
from benchmarks.peak_memory import PeakMemory
from conftest import mixed_params, random_grads
from dash_fn.roots import refresh_roots, start_vectors, uses_start_vectors

SOLVERS = ["eigh", "ndb", "cn", "chebyshev"]


def factor_stack(count: int, size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(count * size)
    A = torch.randn(count, size, size, generator=gen, dtype=torch.float64)
    F = (A @ A.mT / size).float()
    F[3, 0, 0] = float("nan")  # one block falls back to its old root
    return F


def operands(F: torch.Tensor, solver: str) -> tuple:
    """(factors, old roots, order, config, start vectors) of a refresh."""
    config = dash_fn.DashConfig(solver=solver)
    start = start_vectors(F.shape[-1], config) if uses_start_vectors(config, solver) else None
    return F, torch.full_like(F, 0.5), 4, config, start


@pytest.fixture
def chunked(monkeypatch):
    """Chunk every stack (the floor that keeps small stacks whole is lifted)."""
    monkeypatch.setattr(roots, "SMALL_WORKSPACE", 0)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("count, size", [(24, 32), (48, 16)])
def test_peak_temporaries_of_a_refresh_are_two_stacks(chunked, solver, count, size):
    F = factor_stack(count, size)
    args = operands(F, solver)
    with PeakMemory() as memory:
        refresh_roots(*args)
    stack = F.numel() * F.element_size()
    identities = 4 * stack // count  # the few b x b identities a solver call makes, whatever the chunk
    assert memory.peak <= 2 * stack + identities, (
        memory.peak / stack,
        roots.chunk_blocks(count, stack // count, solver),
    )


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_workspace_table_bounds_each_solver(solver):
    """Unchunked, a solver holds at most its workspace in blocks per block: the table chunks by it."""
    F = factor_stack(24, 32)
    args = operands(F, solver)
    with PeakMemory() as memory:
        refresh_roots(*args)
    assert memory.peak <= roots.SOLVERS[solver].workspace * F.numel() * F.element_size()


def test_eager_cpu_eigh_with_finite_factors_solves_the_whole_stack(chunked):
    """No substitution stack, and the eigh op's temporaries live in its threads: the refresh
    holds its output alone (no chunks copied into a result), with the solver's bits."""
    F = factor_stack(24, 32)
    F[3, 0, 0] = 1.0  # every block finite
    args = operands(F, "eigh")
    assert roots.chunk_blocks(24, 32 * 32 * 4, "eigh") < 24
    with PeakMemory() as memory:
        new, failed = refresh_roots(*args)
    stack = F.numel() * F.element_size()
    assert memory.peak <= stack + 4096, memory.peak / stack
    assert torch.equal(new, roots.inverse_root(F, 4, args[3])) and not failed.any()


@pytest.mark.parametrize("solver", SOLVERS)
def test_chunks_give_the_whole_stack_result_bitwise(chunked, solver):
    F = factor_stack(24, 32)
    assert roots.chunk_blocks(24, 32 * 32 * 4, solver) < 24
    new, failed = refresh_roots(*operands(F, solver))
    roots.SMALL_WORKSPACE = 2**40
    whole, whole_failed = refresh_roots(*operands(F, solver))
    assert torch.equal(new, whole) and torch.equal(failed, whole_failed)
    assert failed.tolist() == [i == 3 for i in range(24)]


def test_a_chunked_refresh_compiles_inside_the_step(chunked):
    """The chunks' writes into the result trace (fullgraph) and give the eager result. float64
    and eps = 1e-6: eager on the CPU forms aligned factor EMAs inside their products, compiled
    apart, and eps = 1e-10 in float32 turns that rounding difference into 1e-2 differences of
    the parameters (as between eager and Inductor: test_compile_step)."""
    params = mixed_params(torch.float64)
    config = dash_fn.DashConfig(
        block_size=16, solver="eigh", inv_root_freq=2, eps=1e-6, refresh_schedule="periodic"
    )  # eigh: a small graph; periodic: whole stacks, chunked
    runs = []
    for step in (dash_fn.step, torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")):
        p, state = params, dash_fn.init(params, config)
        for t in range(1, 4):
            p, state = step(
                p,
                random_grads(p, t),
                state,
                lr=torch.tensor(1e-2, dtype=torch.float64),
                refresh=dash_fn.is_refresh_step(config, t),
            )
        runs.append(p)
    for name in params:
        torch.testing.assert_close(runs[1][name], runs[0][name], rtol=1e-9, atol=1e-9)
