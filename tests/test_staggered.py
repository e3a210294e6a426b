"""The staggered refresh schedule (dash_fn.schedule, docs/ALGORITHM.md 4 d): every step
refreshes a fixed slice of every factor stack, one graph, no flag, no sync."""

from __future__ import annotations

import pytest
import torch

import dash_fn
from benchmarks.syncs import SyncCounter, inspecting_backend
from conftest import mixed_params, random_grads
from dash_fn.strategy import simulated_accelerator
from reference import ReferenceDash

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)


def staggered(**changes) -> dash_fn.DashConfig:
    return dash_fn.DashConfig(refresh_schedule="staggered", **{"block_size": 24, "solver": "eigh", **changes})


def roots(state) -> dict:
    return {k: state["factors", k, "Fbar"].clone() for k in state["factors"].keys()}


def run(params, config, steps, state=None, start=1, step=dash_fn.step):
    state = dash_fn.init(params, config) if state is None else state
    for t in range(start, start + steps):
        refresh = dash_fn.is_refresh_step(state["config"], t)  # None when staggered
        params, state = step(params, random_grads(params, t), state, lr=1e-2, refresh=refresh)
    return params, state


def relative_update_error(params, ref_params) -> float:
    start = mixed_params(torch.float64)
    return max(
        float((params[k].double() - start[k] - (ref_params[k] - start[k])).norm() / (ref_params[k] - start[k]).norm())
        for k in start
    )


# eps bounds the factors' condition number so that two float64 eighs agree to ~1e-13
ORACLE_CONFIGS = {
    "f3": dict(inv_root_freq=3, eps=1e-3),
    "f4-s3-momentum-decay": dict(inv_root_freq=4, start_prec_step=3, eps=1e-3, mu=0.5, weight_decay=0.1),
    "f5-shampoo-vectors-adagrad": dict(inv_root_freq=5, eps=1e-3, one_dim="shampoo", grafting="adagrad", beta_G=0.0),
    "f1-every-root-every-step": dict(inv_root_freq=1, eps=1e-3),
    "f3-rms-nesterov-G-floor-order3": dict(
        inv_root_freq=3, eps=1e-3, grafting="rms", nesterov_G=True, eps_rel=1e-3, root_order=3
    ),
    "f3-spectral": dict(inv_root_freq=3, eps=1e-3, grafting="spectral"),
}


@pytest.mark.parametrize("block_size", [8, 24])
@pytest.mark.parametrize("name", list(ORACLE_CONFIGS))
def test_float64_matches_the_reference_with_each_block_on_its_phase(name, block_size):
    """The float64 per-block reference refreshing each block on its own phase (and using the
    Adam direction until its first refresh) agrees to 1e-10 of the update over 14 steps."""
    config = staggered(block_size=block_size, **ORACLE_CONFIGS[name])
    params, _ = run(mixed_params(torch.float64), config, 14)
    ref, ref_params = ReferenceDash(mixed_params(torch.float64), config), mixed_params(torch.float64)
    for t in range(1, 15):
        ref_params = ref.step(ref_params, random_grads(ref_params, t), 1e-2)
    assert relative_update_error(params, ref_params) < 1e-10


def test_the_reference_check_sees_a_wrong_phase():
    """The oracle is sharp: with every block refreshed at once (the periodic schedule, same f)
    the reference of the staggered schedule disagrees by far more than 1e-10."""
    config = staggered(block_size=8, inv_root_freq=3, eps=1e-3)
    params, _ = run(mixed_params(torch.float64), config.replace(refresh_schedule="periodic"), 14)
    ref, ref_params = ReferenceDash(mixed_params(torch.float64), config), mixed_params(torch.float64)
    for t in range(1, 15):
        ref_params = ref.step(ref_params, random_grads(ref_params, t), 1e-2)
    assert relative_update_error(params, ref_params) > 1e-4


def test_each_step_refreshes_its_phase_and_every_root_within_a_period():
    """Steps s + p + k f refresh exactly the blocks of phase p; over any f consecutive steps
    every root changes, and each step solves ceil(K / f) blocks or a few more per stack."""
    config = staggered(block_size=8, inv_root_freq=3, start_prec_step=2)
    params = mixed_params()
    state = dash_fn.init(params, config)
    phase = {k: state["schedule", k, "phase"] for k in state["factors"].keys()}
    for k, stack in enumerate(state["plan"].factors):
        width = state["schedule", str(k), "slices"].shape[1]
        assert -(-stack.count // 3) <= width <= -(-stack.count // 3) + len(state["plan"].groups), k
    before = roots(state)
    last_change = {k: torch.zeros_like(p) for k, p in phase.items()}
    for t in range(1, 12):
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=1e-2)
        after = roots(state)
        for k in before:
            changed = (before[k] != after[k]).flatten(1).any(1)
            due = (phase[k] == (t - 2) % 3) & (t >= 2)
            assert torch.equal(changed, due), (t, k)
            last_change[k][changed] = t
            if t >= 4:
                assert (last_change[k] > t - 3).all(), (t, k)
        before = after


@pytest.mark.sets_accelerator
def test_same_work_every_step_means_the_same_graph():
    """Compiled with fullgraph over three periods: one graph, no recompile, no refresh flag,
    no node that reads the device on the host, and nothing CUDA graphs would skip."""
    config = staggered(block_size=8, solver="ndb", inv_root_freq=3, mu=0.5, newton_steps=4)
    params, graphs = mixed_params(shapes={"w": (24, 20), "b": (20,)}), []
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    with simulated_accelerator():
        state = dash_fn.init(params, config)
        run(params, config, 9, state=state, step=compiled)
    assert len(graphs) == 1
    gm, reasons = graphs[0]
    assert reasons == [], reasons[0][:2000]


def test_compiled_adapter_makes_one_graph():
    graphs = []
    model = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    opt = dash_fn.DASH(
        model.parameters(),
        lr=1e-2,
        block_size=8,
        solver="ndb",
        newton_steps=2,
        scaling="fro",  # a short unrolled refresh: compile time
        inv_root_freq=3,
        refresh_schedule="staggered",
        compile={"backend": inspecting_backend(graphs)},
    )
    with simulated_accelerator():
        for t in range(9):
            model.zero_grad()
            model(torch.randn(16, 20, generator=torch.Generator().manual_seed(t))).square().mean().backward()
            opt.step()
    assert len(graphs) == 1
    assert graphs[0][1] == []


@pytest.mark.sets_accelerator
@pytest.mark.parametrize("solver", ["ndb", "cn", "chebyshev"])
def test_eager_steps_do_not_sync_under_the_accelerator_strategy(solver):
    config = staggered(solver=solver, inv_root_freq=3, mu=0.5, cheb_degree=8, start_prec_step=2)
    params, counter = mixed_params(), SyncCounter()
    with simulated_accelerator():
        state = dash_fn.init(params, config)
        for t in range(1, 8):
            with counter if t > 1 else SyncCounter():
                params, state = dash_fn.step(params, random_grads(params, t), state, lr=torch.tensor(1e-2))
    assert counter.syncs == []


@pytest.mark.sets_accelerator
def test_compiled_equals_eager_bitwise_under_the_accelerator_strategy():
    config = staggered(block_size=8, solver="ndb", inv_root_freq=3, newton_steps=4)
    params = mixed_params(shapes={"w": (24, 20), "b": (20,)})
    with simulated_accelerator():
        eager, _ = run(params, config, 7)
        compiled, _ = run(params, config, 7, step=torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager"))
    for k in eager:
        assert torch.equal(eager[k], compiled[k]), k


def test_a_checkpoint_resumes_mid_period_bit_exact(tmp_path):
    config = staggered(block_size=8, inv_root_freq=4, mu=0.5)
    whole, _ = run(mixed_params(), config, 10)
    params, state = run(mixed_params(), config, 5)  # mid-period: phase 1 of 4 is next
    dash_fn.save_state(tmp_path / "state.pt", state)
    saved = torch.load(tmp_path / "state.pt", weights_only=True)["state"]
    assert not any(key in ("schedule", "phase", "slices") for entry in saved.values() for key in entry)  # rebuilt
    resumed, _ = run(params, config, 5, state=dash_fn.load_state(tmp_path / "state.pt"), start=6)
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "accelerator"])
def test_a_skipped_step_refreshes_nothing_and_the_next_one_refreshes_its_slice(accelerator):
    with simulated_accelerator(accelerator):
        skip_then_step()


def skip_then_step():
    config = staggered(block_size=8, inv_root_freq=3)
    params = mixed_params()
    params, state = run(params, config, 2)
    before = roots(state)
    bad = random_grads(params, 3)
    bad["rect"] = bad["rect"].clone().index_fill_(0, torch.tensor([0]), float("nan"))
    params, state = dash_fn.step(params, bad, state, lr=1e-2)
    assert int(state["skipped"]) == 1 and int(state["step"]) == 2
    assert all(torch.equal(before[k], v) for k, v in roots(state).items())
    clean, _ = run(mixed_params(), config, 3)
    params, state = dash_fn.step(params, random_grads(params, 3), state, lr=1e-2)
    for k in clean:
        assert torch.equal(params[k], clean[k]), k


def test_a_refresh_flag_is_refused_and_is_refresh_step_says_none():
    config = staggered()
    assert dash_fn.is_refresh_step(config, 1) is None
    params = mixed_params()
    with pytest.raises(ValueError, match="staggered schedule.*refresh=None"):
        dash_fn.step(params, random_grads(params, 1), dash_fn.init(params, config), lr=1e-2, refresh=True)


def test_with_config_switches_schedules_on_one_state():
    """The tables are constants: a periodic state runs on staggered (and back) unchanged."""
    from dash_fn.checkpoint import with_config

    params, state = run(mixed_params(), dash_fn.DashConfig(block_size=8, solver="eigh"), 3)
    state = with_config(state, state["config"].replace(refresh_schedule="staggered", inv_root_freq=3))
    assert state["schedule", "0", "slices"].shape[0] == 3
    params, state = run(params, state["config"], 3, state=state, start=4)
    assert "schedule" not in with_config(state, state["config"].replace(refresh_schedule="periodic")).keys()


def test_a_period_longer_than_the_model_keeps_the_tables_small():
    """inv_root_freq=10**9 ("refresh once"): a table row per block number, not per phase, and
    each block's roots change once, at step s + its number, and never after."""
    config = staggered(block_size=8, inv_root_freq=10**9)
    params = mixed_params(shapes={"w": (24, 16), "b": (16,)})  # 6 blocks: numbers 0-5
    state = dash_fn.init(params, config)
    assert all(state["schedule", k, "slices"].shape[0] == 6 for k in state["schedule"].keys())
    phase = state["schedule", "0", "phase"]
    before = roots(state)
    for t in range(1, 10):
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=1e-2)
        changed = (before["0"] != roots(state)["0"]).flatten(1).any(1)
        assert torch.equal(changed, phase == t - 1), t
        before = roots(state)


@pytest.mark.sets_accelerator
@pytest.mark.parametrize("solver", ["eigh", "ndb"])
def test_the_default_config_trains_alike_eager_compiled_and_on_the_accelerator_strategy(solver):
    """One config, one training: the default schedule is the same math eager or compiled, on the
    CPU strategy or the accelerator's (only the forms differ, so float64 agrees to rounding,
    amplified by the factors' conditioning). The other schedule, which the old default ("auto")
    ran eagerly on the CPU, is far outside that."""
    # every other field its default but eps: at 1e-10 the near-null eigenvalues of these
    # rank-deficient factors turn rounding noise into 1e-6 differences (eps^(-1/4)), any two forms
    config = dash_fn.DashConfig(block_size=24, solver=solver, inv_root_freq=3, eps=1e-6)
    assert config.refresh_schedule == "staggered"
    params = mixed_params(torch.float64)
    runs = {}
    with simulated_accelerator(False):
        runs["eager, cpu"], _ = run(params, config, 9)
        compiled = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
        runs["compiled, cpu"], _ = run(params, config, 9, step=compiled)
    torch._dynamo.reset()
    with simulated_accelerator():
        runs["eager, accelerator"], _ = run(params, config, 9)
    with simulated_accelerator(False):
        periodic, _ = run(params, config.replace(refresh_schedule="periodic"), 9)
    want = runs.pop("eager, cpu")
    start = mixed_params(torch.float64)

    def difference(got) -> float:
        return max(float((got[k] - want[k]).norm() / (want[k] - start[k]).norm()) for k in want)

    assert {name: difference(got) < 1e-8 for name, got in runs.items()} == dict.fromkeys(runs, True)
    assert difference(periodic) > 1e-4
