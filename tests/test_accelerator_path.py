"""The accelerator strategy, simulated on the CPU: no host syncs, graphs CUDA graphs can capture.

Each test enters :func:`dash_fn.strategy.simulated_accelerator`, so CPU tensors take the code
path a GPU takes. Eager steps are watched by a dispatch mode that records every op reading a
device value on the host (benchmarks/syncs.py); compiled steps' graphs are inspected for such
nodes and run through Inductor's own pre-capture checks for CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

import dash_fn
from benchmarks.syncs import SyncCounter, inspecting_backend
from conftest import mixed_params, random_grads
from dash_fn.strategy import simulated_accelerator

# tests marked compat run on the oldest and newest supported torch too (docs/CONTRIBUTING.md)
MATMUL_SOLVERS = ["ndb", "cn", "chebyshev"]
PARAMS = {"blocks": None, "vectors-only": {"b": (10,), "c": (3,), "s": ()}}
SMALL = {"w": (48, 30), "b": (30,)}  # two block sizes: keeps the compile time of each solver's unrolled refresh short


def config_for(solver: str, schedule: str = "periodic") -> dash_fn.DashConfig:
    # momentum and the non-finite guard (on by default) on; Chebyshev at a low degree (compile
    # time); the periodic schedule unless asked
    return dash_fn.DashConfig(
        block_size=24, solver=solver, inv_root_freq=2, mu=0.5, cheb_degree=8, refresh_schedule=schedule
    )


def params_of(kind: str) -> dict:
    return mixed_params() if PARAMS[kind] is None else mixed_params(shapes=PARAMS[kind])


@pytest.fixture(autouse=True)
def _accelerator():
    with simulated_accelerator():
        yield


@pytest.mark.compat
@pytest.mark.parametrize("schedule", ["periodic", "staggered"])
@pytest.mark.parametrize("kind", PARAMS)
@pytest.mark.parametrize("solver", MATMUL_SOLVERS)
def test_functional_eager_steps_do_not_sync(solver, kind, schedule):
    """Plain and refresh steps (or staggered ones), after a first step of each: not one op
    reads the device."""
    config, params = config_for(solver, schedule), params_of(kind)
    state, counter = dash_fn.init(params, config), SyncCounter()
    for t in range(1, 7):
        with counter if t > 2 else SyncCounter():
            params, state = dash_fn.step(
                params,
                random_grads(params, t),
                state,
                lr=torch.tensor(1e-2),
                refresh=dash_fn.is_refresh_step(config, t),
            )
    assert counter.syncs == []
    assert int(state["step"]) == 6


@pytest.mark.compat
@pytest.mark.parametrize("solver", MATMUL_SOLVERS)
def test_adapter_eager_steps_do_not_sync(solver):
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
    opt = dash_fn.DASH(
        model.parameters(),
        lr=1e-2,
        **{k: v for k, v in vars(config_for(solver)).items() if k != "block_size"},
        block_size=8,
    )
    counter = SyncCounter()
    for t in range(6):
        model.zero_grad()
        model(torch.randn(16, 20, generator=torch.Generator().manual_seed(t))).square().mean().backward()
        with counter if t > 1 else SyncCounter():
            opt.step()
    assert counter.syncs == []


@pytest.mark.compat
def test_the_counter_sees_the_cpu_strategy_read():
    """The same step under the CPU strategy reads its flags on the host: the counter sees it."""
    config, params = config_for("ndb"), mixed_params()
    with simulated_accelerator(False), SyncCounter() as counter:
        dash_fn.step(params, random_grads(params, 1), dash_fn.init(params, config), lr=1e-2, refresh=True)
    assert counter.syncs


@pytest.mark.compat
def test_eigh_syncs_once_per_solver_call_only_in_its_error_check():
    """eigh's one sync is ``torch.linalg.eigh``'s error check (inside ``_linalg_eigh``), one per
    call (here one per factor stack); its refresh steps are not sync-free, its plain steps are."""
    config, params = config_for("eigh"), mixed_params()
    state = dash_fn.init(params, config)
    with SyncCounter() as counter:
        dash_fn.step(params, random_grads(params, 1), state, lr=1e-2, refresh=True)
    assert set(counter.syncs) == {"aten._linalg_eigh.default"}
    assert len(counter.syncs) == len(state["plan"].factors)
    with SyncCounter() as counter:
        dash_fn.step(params, random_grads(params, 2), state, lr=1e-2, refresh=False)
    assert counter.syncs == []


@pytest.mark.compat
def test_auto_picks_a_matmul_solver_and_eigh_is_refused_under_cuda_graphs():
    # auto: coupled Newton for the default cube roots, scaled by power iteration from stored vectors
    assert "start_vectors" in dash_fn.init(mixed_params(), dash_fn.DashConfig()).keys()
    model = torch.nn.Linear(8, 4)
    model(torch.randn(2, 8)).sum().backward()
    opt = dash_fn.DASH(model.parameters(), solver="eigh", compile={"mode": "reduce-overhead"})
    with pytest.raises(ValueError, match="solver='eigh' cannot run under CUDA graphs.*'ndb'"):
        opt.step()


@pytest.mark.compat
def test_refresh_none_says_what_to_pass():
    params = mixed_params()
    with pytest.raises(ValueError, match=r"refresh=dash_fn.is_refresh_step\(config, t\)"):
        dash_fn.step(params, random_grads(params, 1), dash_fn.init(params, config_for("ndb")), lr=1e-2)


def check_graphs(graphs: list, expected: int) -> None:
    assert len(graphs) == expected  # a plain step and a refresh step, or one staggered step
    for gm, reasons in graphs:
        assert reasons == [], reasons[0][:2000]
        assert any(node.op == "placeholder" for node in gm.graph.nodes)


@pytest.mark.parametrize("schedule, expected", [("periodic", 2), ("staggered", 1)])
@pytest.mark.parametrize("solver", [pytest.param("ndb", marks=pytest.mark.compat), "cn", "chebyshev"])
def test_compiled_step_graphs_hold_no_sync_and_pass_the_cuda_graph_checks(solver, schedule, expected):
    """Every graph of the compiled functional step (periodic: two; staggered: one):
    no cond, item or nonzero node, and none of Inductor's reasons to skip CUDA graphs (the
    state's tensors it mutates are static)."""
    config, params, graphs = config_for(solver, schedule), mixed_params(shapes=SMALL), []
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    state = dash_fn.init(params, config)
    for t in range(1, 5):
        params, state = compiled(
            params, random_grads(params, t), state, lr=torch.tensor(1e-2), refresh=dash_fn.is_refresh_step(config, t)
        )
    check_graphs(graphs, expected)


@pytest.mark.compat
def test_a_loaded_state_is_static_too(tmp_path):
    """States from load_state (and load_state_dict, which builds them alike) come marked."""
    config, params, graphs = config_for("ndb"), mixed_params(shapes=SMALL), []
    state = dash_fn.init(params, config)
    dash_fn.save_state(tmp_path / "state.pt", state)
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    compiled(
        params, random_grads(params, 1), dash_fn.load_state(tmp_path / "state.pt"), lr=torch.tensor(1e-2), refresh=False
    )
    check_graphs(graphs, 1)


@pytest.mark.compat
def test_compiled_adapter_graphs_pass_the_cuda_graph_checks():
    """DASH(compile=...): parameters and state mutated in place are static addresses."""
    graphs = []
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))  # blocks of one size
    opt = dash_fn.DASH(
        model.parameters(),
        lr=1e-2,
        block_size=8,
        solver="ndb",
        inv_root_freq=2,
        mu=0.5,
        refresh_schedule="periodic",
        compile={"backend": inspecting_backend(graphs)},
    )
    for t in range(4):
        model.zero_grad()
        model(torch.randn(16, 20, generator=torch.Generator().manual_seed(t))).square().mean().backward()
        opt.step()
    check_graphs(graphs, 2)
