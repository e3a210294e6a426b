"""The compiled train step: traces whole, compiles at most two graphs, and equals eager."""

import pytest
import torch
from torch._dynamo.utils import counters

import dash_fn
from conftest import mixed_params, random_grads
from dash_fn.roots import SOLVERS
from examples import compiled_step
from examples.llama import Llama, LlamaConfig

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

SOLVER_NAMES = sorted(SOLVERS)


def graphs():
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
def test_bare_step_32_steps_at_most_two_graphs(lr_kind):
    config = dash_fn.DashConfig(block_size=24, solver="eigh", inv_root_freq=5, refresh_schedule="periodic")
    params = mixed_params()
    state = dash_fn.init(params, config)
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    counters.clear()
    for t in range(1, 33):
        lr = 1e-3 * (1 + 0.1 * t)  # a new lr every step
        params, state = compiled(
            params,
            random_grads(params, t),
            state,
            lr=lr if lr_kind == "float" else torch.tensor(lr),
            refresh=dash_fn.is_refresh_step(config, t),
        )
    n_graphs, n_breaks = graphs()
    assert n_breaks == 0
    assert n_graphs <= (4 if lr_kind == "float" else 2)  # plain and refresh steps
    assert int(state["step"]) == 32


def test_train_step_32_steps_at_most_two_graphs():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(d_model=32, n_layers=1, n_heads=2, mlp_hidden=48, context=16))
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    config = dash_fn.DashConfig(block_size=32, solver="eigh", inv_root_freq=5, refresh_schedule="periodic")
    state = dash_fn.init(params, config)
    step = compiled_step.make_train_step(model, config, backend="aot_eager")
    counters.clear()
    tokens = torch.randint(0, 256, (4, 17), generator=torch.Generator().manual_seed(0))
    lr = torch.tensor(0.0)
    losses = []
    for t in range(1, 33):
        lr.fill_(compiled_step.lr_at(t, 32, 3e-3, warmup=4))
        params, state, loss = step(params, state, tokens, lr, t)
        losses.append(float(loss))
    n_graphs, n_breaks = graphs()
    assert n_breaks == 0
    assert n_graphs == 2  # a plain step and a refresh step
    assert losses[-1] < losses[0] - 0.5  # it trains: one fixed batch is memorized


def run_steps(step_fn, config, steps, shapes=None):
    params = mixed_params() if shapes is None else mixed_params(shapes=shapes)
    state = dash_fn.init(params, config)
    for t in range(1, steps + 1):
        params, state = step_fn(
            params, random_grads(params, t), state, lr=torch.tensor(0.01), refresh=dash_fn.is_refresh_step(config, t)
        )
    return params


def assert_relative_close(got, want, rtol):
    for k in want:
        assert (got[k] - want[k]).norm() <= rtol * want[k].norm(), k


@pytest.mark.parametrize("solver", SOLVER_NAMES)
def test_compiled_equals_eager_each_solver(solver):
    # one factor stack (compiling each solver's unrolled refresh is this test's cost; ragged
    # blocks compiled are in test_properties)
    shapes = {"matrix": (48, 48), "bias": (48,)}
    config = dash_fn.DashConfig(
        block_size=24, solver=solver, eps=1e-4, inv_root_freq=2, cheb_degree=12, refresh_schedule="staggered"
    )  # d = 60 unrolls for minutes
    want = run_steps(dash_fn.step, config, 10, shapes)
    got = run_steps(torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager"), config, 10, shapes)
    assert_relative_close(got, want, 1e-5)


def test_example_script_runs():
    compiled_step.main(["--steps", "3", "--backend", "aot_eager", "--d-model", "32", "--block-size", "32"])
