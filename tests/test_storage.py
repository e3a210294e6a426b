"""Storage dtypes (dash_fn.storage, docs/ALGORITHM.md 3.5): each kind of block state kept in its
own dtype, computed in the state dtype, rounded once when written."""

from __future__ import annotations

import io

import pytest
import torch

import dash_fn
from benchmarks.syncs import SyncCounter, inspecting_backend
from conftest import mixed_params, random_grads
from dash_fn.strategy import simulated_accelerator
from reference import ReferenceDash

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

KIND_FIELDS = {"F": "factor_dtype", "Fbar": "root_dtype", "Gt": "grad_ema_dtype", "A": "graft_dtype"}
ALL_NARROW = {field: "bfloat16" for field in KIND_FIELDS.values()}


def config(schedule="periodic", **changes) -> dash_fn.DashConfig:
    return dash_fn.DashConfig(
        **{"block_size": 24, "solver": "eigh", "inv_root_freq": 3, "eps": 1e-3, "refresh_schedule": schedule, **changes}
    )


def run(params, cfg, steps, state=None, start=1, step=dash_fn.step):
    state = dash_fn.init(params, cfg) if state is None else state
    for t in range(start, start + steps):
        refresh = dash_fn.is_refresh_step(state["config"], t)
        params, state = step(params, random_grads(params, t), state, lr=1e-2, refresh=refresh)
    return params, state


def reference_run(cfg, steps):
    ref, params = ReferenceDash(mixed_params(torch.float64), cfg), mixed_params(torch.float64)
    for t in range(1, steps + 1):
        params = ref.step(params, random_grads(params, t), 1e-2)
    return params


def update_error(params, ref_params) -> float:
    start = mixed_params(torch.float64)
    return max(float((params[k].double() - ref_params[k]).norm() / (ref_params[k] - start[k]).norm()) for k in start)


def test_defaults_keep_every_kind_in_the_state_dtype():
    state = dash_fn.init(mixed_params(), config())
    for key in ("F", "Fbar"):
        assert all(state["factors", k, key].dtype == torch.float32 for k in state["factors"].keys())
    for key in ("A", "Gt"):
        assert all(state["groups", g, key].dtype == torch.float32 for g in state["groups"].keys())


@pytest.mark.parametrize("key, field", list(KIND_FIELDS.items()))
def test_each_kind_takes_its_own_dtype(key, field):
    state = dash_fn.init(mixed_params(), config(**{field: "bfloat16"}))
    entries = state["factors"] if key in ("F", "Fbar") else state["groups"]
    for k in entries.keys():
        assert entries[k, key].dtype == torch.bfloat16
        others = [name for name in ("F", "Fbar", "A", "Gt") if name != key and name in entries[k].keys()]
        assert all(entries[k, name].dtype == torch.float32 for name in others)


# float64 parameters: the state is computed in float64 on both sides, so rounding a stored
# kind to its dtype is the only narrowing, and the two runs round the same values
@pytest.mark.parametrize("schedule", ["periodic", "staggered"])
@pytest.mark.parametrize(
    "narrow",
    [{field: "bfloat16"} for field in KIND_FIELDS.values()]
    + [ALL_NARROW, {f: "float32" for f in KIND_FIELDS.values()}],
    ids=[*KIND_FIELDS.values(), "all-bfloat16", "all-float32"],
)
def test_matches_the_reference_that_rounds_each_kind_when_written(narrow, schedule):
    """12 steps on float64 parameters with some kinds kept narrow agree to 1e-10 with the float64
    reference that rounds those kinds when it assigns them, and not with the one that does not
    (the rounding matters: the oracle is sharp)."""
    cfg = config(schedule, **narrow)
    params, _ = run(mixed_params(torch.float64), cfg, 12)
    assert update_error(params, reference_run(cfg, 12)) < 1e-10
    unrounded = reference_run(config(schedule), 12)
    assert update_error(params, unrounded) > 1e-6


def test_a_step_changes_no_kind_by_more_than_its_rounding():
    """A stored narrow tensor is the state-dtype value rounded once: the float32 run's state,
    rounded to bfloat16, is within a bfloat16 ulp of the bfloat16 run's state after one step."""
    wide = run(mixed_params(), config(), 1)[1]
    narrow = run(mixed_params(), config(**ALL_NARROW), 1)[1]
    for key in ("A", "Gt"):
        for g in wide["groups"].keys():
            a, b = wide["groups", g, key], narrow["groups", g, key]
            assert torch.equal(a.to(torch.bfloat16), b), key  # the same value, rounded once
    for k in wide["factors"].keys():
        assert torch.equal(wide["factors", k, "F"].to(torch.bfloat16), narrow["factors", k, "F"])


def test_checkpoint_resumes_bit_exact_and_refuses_another_storage_dtype():
    cfg = config("staggered", **ALL_NARROW)
    _, state = run(mixed_params(), cfg, 4)
    buffer = io.BytesIO()
    dash_fn.save_state(buffer, state)
    buffer.seek(0)
    loaded = dash_fn.load_state(buffer)
    assert loaded["factors", "0", "Fbar"].dtype == torch.bfloat16
    params = mixed_params()
    a, _ = run(params, cfg, 3, state=state.clone(), start=5)
    b, _ = run(params, cfg, 3, state=loaded, start=5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    buffer.seek(0)
    with pytest.raises(ValueError, match="root_dtype"):
        dash_fn.load_state(buffer, config=cfg.replace(root_dtype=None))


@pytest.mark.sets_accelerator
def test_compiled_accelerator_step_is_one_capturable_graph_without_syncs():
    """Under the accelerator strategy (simulated) a step with every kind narrow compiles to one
    graph that CUDA graphs can capture, equals the eager step, and the eager step never syncs."""
    cfg = config("staggered", solver="ndb", newton_steps=4, mu=0.5, **ALL_NARROW)
    graphs: list = []
    compiled = torch.compile(dash_fn.step, backend=inspecting_backend(graphs), fullgraph=True)
    counter = SyncCounter()
    with simulated_accelerator():
        params = mixed_params()
        state = dash_fn.init(params, cfg)
        for t in range(1, 5):
            with counter if t > 1 else SyncCounter():
                params, state = dash_fn.step(params, random_grads(params, t), state, lr=torch.tensor(1e-2))
        compiled_params, _ = run(mixed_params(), cfg, 4, step=compiled)
    assert counter.syncs == [], counter.syncs[:3]
    assert len(graphs) == 1
    assert graphs[0][1] == []  # nothing that keeps Inductor from capturing it in a CUDA graph
    assert all(torch.allclose(params[k], compiled_params[k], rtol=0, atol=1e-6) for k in params)
