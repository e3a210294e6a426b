"""The refresh warm-up (``inv_root_warmup``, docs/ALGORITHM.md 4 d): the first W steps from
start_prec_step refresh every root under either schedule, then the schedule takes over. Against
the float64 per-block reference, root by root, eager against compiled and on the accelerator
strategy, through the torch.optim adapter and a checkpoint written before the field."""

from __future__ import annotations

import pytest
import torch

import dash_fn
from benchmarks.syncs import SyncCounter, inspecting_backend
from conftest import mixed_params, random_grads
from dash_fn.checkpoint import read_config
from dash_fn.strategy import simulated_accelerator
from reference import ReferenceDash
from test_staggered import relative_update_error, roots, run

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

# eps bounds the factors' condition number so that two float64 eighs agree to ~1e-13
ORACLE_CONFIGS = {
    "staggered-f4-w3": dict(inv_root_freq=4, inv_root_warmup=3),
    "staggered-f3-s3-w2-momentum-order3": dict(
        inv_root_freq=3, start_prec_step=3, inv_root_warmup=2, mu=0.5, root_order=3, eps_rel=1e-3
    ),
    "periodic-f5-w3-vectors": dict(inv_root_freq=5, inv_root_warmup=3, refresh_schedule="periodic", one_dim="shampoo"),
}


def warmup(**changes) -> dash_fn.DashConfig:
    return dash_fn.DashConfig(**{"block_size": 8, "solver": "eigh", "eps": 1e-3, **changes})


def reference_params(config, steps: int) -> dict:
    ref, ref_params = ReferenceDash(mixed_params(torch.float64), config), mixed_params(torch.float64)
    for t in range(1, steps + 1):
        ref_params = ref.step(ref_params, random_grads(ref_params, t), 1e-2)
    return ref_params


@pytest.mark.parametrize("name", list(ORACLE_CONFIGS))
def test_float64_matches_the_reference_refreshing_every_root_in_the_warmup(name):
    config = warmup(**ORACLE_CONFIGS[name])
    params, _ = run(mixed_params(torch.float64), config, 12)
    assert relative_update_error(params, reference_params(config, 12)) < 1e-10


@pytest.mark.parametrize("schedule", ["staggered", "periodic"])
def test_the_reference_check_sees_a_missing_warmup(schedule):
    """The oracle is sharp: the same schedule without its warm-up disagrees by far more."""
    config = warmup(inv_root_freq=4, inv_root_warmup=3, refresh_schedule=schedule)
    params, _ = run(mixed_params(torch.float64), config.replace(inv_root_warmup=0), 12)
    assert relative_update_error(params, reference_params(config, 12)) > 1e-4


def test_warmup_steps_change_every_root_then_each_phase_in_turn():
    """s = 2, W = 3, f = 3: steps 2-4 change every root; from step 5 on, the blocks of phase
    (t - 2) mod 3 alone; the flag is True on the warm-up steps only, under either schedule."""
    config = warmup(inv_root_freq=3, start_prec_step=2, inv_root_warmup=3)
    assert [dash_fn.is_refresh_step(config, t) for t in range(1, 8)] == [False, True, True, True, False, False, False]
    periodic = config.replace(refresh_schedule="periodic")
    assert {t for t in range(1, 13) if dash_fn.is_refresh_step(periodic, t)} == {2, 3, 4, 6, 9, 12}
    params = mixed_params()
    state = dash_fn.init(params, config)
    phase = {k: state["schedule", k, "phase"] for k in state["factors"].keys()}
    before = roots(state)
    for t in range(1, 11):
        refresh = dash_fn.is_refresh_step(config, t)
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=1e-2, refresh=refresh)
        after = roots(state)
        for k in before:
            changed = (before[k] != after[k]).flatten(1).any(1)
            due = torch.full_like(changed, 2 <= t <= 4) if t <= 4 else phase[k] == (t - 2) % 3
            assert torch.equal(changed, due), (t, k)
        before = after


@pytest.mark.sets_accelerator
def test_on_the_cpu_the_counter_picks_the_warmup_steps():
    """refresh=None reads the step counter on the host, where that is free: the same bits as
    the host's flags."""
    config = warmup(inv_root_freq=3, inv_root_warmup=4)
    with simulated_accelerator(False):
        flagged, _ = run(mixed_params(), config, 8)
        params, state = mixed_params(), dash_fn.init(mixed_params(), config)
        for t in range(1, 9):
            params, state = dash_fn.step(params, random_grads(params, t), state, lr=1e-2)
    for k in params:
        assert torch.equal(params[k], flagged[k]), k


@pytest.mark.sets_accelerator
def test_off_the_cpu_a_warmup_needs_the_flag():
    config = warmup(inv_root_freq=3, inv_root_warmup=4)
    params = mixed_params()
    with simulated_accelerator():
        state = dash_fn.init(params, config)
        with pytest.raises(ValueError, match="is_refresh_step"):
            dash_fn.step(params, random_grads(params, 1), state, lr=1e-2)
    with pytest.raises(ValueError, match="staggered schedule.*refresh=None"):  # no warm-up: no flag
        dash_fn.step(
            params,
            random_grads(params, 1),
            dash_fn.init(params, config.replace(inv_root_warmup=0)),
            lr=1e-2,
            refresh=False,
        )


@pytest.mark.sets_accelerator
def test_compiled_makes_two_graphs_without_syncs_and_equals_eager():
    """Compiled on the accelerator strategy: a warm-up graph and a slice graph, no node that
    reads the device on the host, nothing CUDA graphs would skip; eager steps make no sync after
    the first; compiled and eager agree bit for bit."""
    config = warmup(solver="ndb", inv_root_freq=3, inv_root_warmup=2, mu=0.5, newton_steps=4)
    params, graphs = mixed_params(shapes={"w": (24, 20), "b": (20,)}), []
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    with simulated_accelerator():
        got, _ = run(params, config, 8, step=compiled)
        state, eager, counter = dash_fn.init(params, config), params, SyncCounter()
        for t in range(1, 9):
            with counter if t > 1 else SyncCounter():
                refresh = dash_fn.is_refresh_step(config, t)
                eager, state = dash_fn.step(eager, random_grads(eager, t), state, lr=1e-2, refresh=refresh)
    assert len(graphs) == 2
    assert [reasons for _, reasons in graphs] == [[], []]
    assert counter.syncs == []
    for k in eager:
        assert torch.equal(eager[k], got[k]), k


def test_the_adapter_passes_the_warmup_flag():
    """DASH(inv_root_warmup=2), compiled: the functional steps with the warm-up to rounding (the
    compiled program's), far from those without it."""
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    fields = dict(block_size=8, solver="eigh", inv_root_freq=3, inv_root_warmup=2)
    opt = dash_fn.DASH(model.parameters(), lr=1e-2, compile={"backend": "aot_eager"}, **fields)
    x = torch.randn(16, 20, generator=torch.Generator().manual_seed(0))
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = []
    for _ in range(6):
        model.zero_grad()
        model(x).square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    got = {n: p.detach() for n, p in model.named_parameters()}

    def functional(config):  # the adapter's gradients, replayed
        params, state = dict(start), dash_fn.init(start, config)
        for t, g in enumerate(grads, 1):
            params, state = dash_fn.step(params, g, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
        return max(float((got[n] - params[n]).norm() / (params[n] - start[n]).norm()) for n in params)

    assert functional(dash_fn.DashConfig(**fields)) < 1e-5
    assert functional(dash_fn.DashConfig(**{**fields, "inv_root_warmup": 0})) > 1e-3


def test_a_checkpoint_written_before_the_field_loads_without_a_warmup():
    fields = {k: v for k, v in dash_fn.DashConfig().__dict__.items() if k != "inv_root_warmup"}
    assert read_config(fields, "old.pt") == dash_fn.DashConfig()
    with pytest.raises(ValueError, match="inv_root_warmup must be an integer >= 0"):
        dash_fn.DashConfig(inv_root_warmup=-1)
