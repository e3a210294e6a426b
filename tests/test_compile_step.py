"""dash_fn.step under torch.compile(fullgraph=True): traces whole, few graphs, equals eager."""

import pytest
import torch
from torch._dynamo.utils import counters

import dash_fn
from conftest import mixed_params, random_grads

# also run under the simulated accelerator strategy; those marked compat on the oldest and newest
# supported torch too (docs/CONTRIBUTING.md)
pytestmark = pytest.mark.accelerator


def run(step_fn, config, dtype, steps, shapes=None):
    params = mixed_params(dtype) if shapes is None else mixed_params(dtype, shapes=shapes)
    state = dash_fn.init(params, config)
    for t in range(1, steps + 1):
        params, state = step_fn(
            params,
            random_grads(params, t),
            state,
            lr=torch.tensor(0.01 * t, dtype=dtype),
            refresh=dash_fn.is_refresh_step(config, t),
        )
    return params, state


@pytest.mark.parametrize(
    "one_dim, schedule, graphs",
    [
        pytest.param("adamw", "staggered", 1, marks=pytest.mark.compat),  # the default config
        ("adamw", "periodic", 2),
        ("shampoo", "staggered", 1),
        pytest.param("shampoo", "periodic", 2, marks=pytest.mark.compat),
    ],
)
def test_fullgraph_aot_eager_matches_eager(one_dim, schedule, graphs):
    """A new lr every step: periodic, the refresh flag from the host, two graphs (plain,
    refresh); staggered, one; no break.

    eps = 1e-6: eager on the CPU the factor EMA of aligned blocks runs inside its product
    (baddbmm), compiled as a product and an update, so the factors differ by rounding (1e-14
    here), which eps = 1e-10 amplifies in rank-deficient factors' roots to 1e-5 (eps^{-1/4});
    at 1e-6 the parameters (of size 1-4) agree to 2e-10, hence atol 1e-9."""
    config = dash_fn.DashConfig(
        block_size=24,
        solver="eigh",
        inv_root_freq=3,
        start_prec_step=2,
        mu=0.5,
        one_dim=one_dim,
        eps=1e-6,
        refresh_schedule=schedule,
    )
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    counters.clear()
    got, got_state = run(compiled, config, torch.float64, 8)
    assert counters["stats"]["unique_graphs"] == graphs
    assert sum(counters["graph_break"].values()) == 0
    want, want_state = run(dash_fn.step, config, torch.float64, 8)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-9, atol=1e-9, msg=k)
    assert torch.equal(got_state["step"], want_state["step"])


@pytest.mark.compat
@pytest.mark.inductor
def test_inductor_matches_eager():
    """float64 and eps = 1e-6 so that the comparison measures the compiler: with stale roots,
    eigenvalues at eps = 1e-10 in rank-deficient factors turn rounding noise into 1e-3
    differences of their roots (eps^{-1/4} amplification), in any two implementations.
    A small model keeps Inductor's compile time (gcc, 2 cores) near half a minute. The
    staggered schedule: one graph over three periods, no recompile."""
    shapes = {"matrix": (48, 40), "bias": (40,)}
    config = dash_fn.DashConfig(block_size=24, solver="eigh", inv_root_freq=2, eps=1e-6, refresh_schedule="staggered")
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend="inductor")
    counters.clear()
    got, _ = run(compiled, config, torch.float64, 6, shapes)
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["graph_break"].values()) == 0
    want, _ = run(dash_fn.step, config, torch.float64, 6, shapes)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-8, msg=k)


@pytest.mark.compat
def test_states_of_different_eps_share_the_compiled_step():
    """After a recompile for a new eps Dynamo passes eps as a symbolic float, which reached the
    CPU eigh refresh op (a float argument there cannot be specialized: it raised); the op now
    takes it as a tensor. Each state's result is eager's."""
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(32, 32, generator=gen, dtype=torch.float64)}
    grads = {"w": torch.randn(32, 32, generator=gen, dtype=torch.float64)}
    lr = torch.tensor(0.1, dtype=torch.float64)
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    for eps in (1e-10, 1e-6, 1e-8):
        config = dash_fn.DashConfig(block_size=16, solver="eigh", eps=eps, refresh_schedule="periodic")
        got, _ = compiled(params, grads, dash_fn.init(params, config), lr=lr, refresh=True)
        want, _ = dash_fn.step(params, grads, dash_fn.init(params, config), lr=lr, refresh=True)
        torch.testing.assert_close(got["w"], want["w"], rtol=1e-9, atol=1e-9, msg=f"eps {eps}")


@pytest.mark.compat
def test_a_state_without_blocks_compiles():
    """Only vectors and scalars (no block stack): the eager-only fused factor update must not be
    chosen under compile, where its host read of the bound cannot be traced."""
    params = {"s": torch.tensor(1.5, dtype=torch.float64), "v": torch.ones(3, dtype=torch.float64)}
    grads = {"s": torch.tensor(0.5, dtype=torch.float64), "v": torch.full((3,), 0.25, dtype=torch.float64)}
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    state = dash_fn.init(params, dash_fn.DashConfig())
    got, _ = compiled(params, grads, state, lr=torch.tensor(0.01, dtype=torch.float64))
    want, _ = dash_fn.step(
        params,
        grads,
        dash_fn.init(params, dash_fn.DashConfig(refresh_schedule="staggered")),
        lr=torch.tensor(0.01, dtype=torch.float64),
    )
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-12, atol=0)
