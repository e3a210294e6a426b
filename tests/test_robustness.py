"""Numerical robustness (docs/ALGORITHM.md 7): zero blocks, non-finite factors, no NaN from finite input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dash_fn
from conftest import mixed_params


def finite_state(state):
    return all(
        torch.isfinite(v).all()
        for v in state.values(include_nested=True, leaves_only=True)
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    )


@pytest.mark.parametrize("heuristic", ["shampoo", "abs", "abs_add", "relu"])
@pytest.mark.parametrize("eps", [0.0, 1e-10])
def test_all_zero_gradients_give_zero_update(heuristic, eps):
    config = dash_fn.DashConfig(block_size=24, solver="eigh", eigh_heuristic=heuristic, eps=eps, one_dim="shampoo")
    params = mixed_params()
    state = dash_fn.init(params, config)
    for _ in range(3):
        new, state = dash_fn.step(params, {k: torch.zeros_like(v) for k, v in params.items()}, state, lr=0.1)
        for k in params:
            assert torch.equal(new[k], params[k]), k
    assert finite_state(state)


def test_zero_blocks_inside_a_matrix_do_not_move():
    config = dash_fn.DashConfig(block_size=8, solver="eigh")
    params = {"w": torch.randn(16, 16)}
    state = dash_fn.init(params, config)
    for _t in range(1, 4):
        g = torch.randn(16, 16)
        g[:8, 8:] = 0  # block (0, 1) never sees a gradient
        new, state = dash_fn.step(params, {"w": g}, state, lr=0.1)
        assert torch.equal(new["w"][:8, 8:], params["w"][:8, 8:])
        assert (new["w"][:8, :8] != params["w"][:8, :8]).any()
        params = new


def test_non_finite_factor_keeps_old_root_and_is_counted():
    config = dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=1)
    params = {"w": torch.randn(16, 24)}
    state = dash_fn.init(params, config)
    params, state = dash_fn.step(params, {"w": torch.randn(16, 24)}, state, lr=0.01)
    old = state["factors", "0", "Fbar"].clone()
    state["factors", "0", "F"][2, 1, 1] = float("nan")  # poison one block's factor
    params, state = dash_fn.step(params, {"w": torch.randn(16, 24)}, state, lr=0.01)
    new = state["factors", "0", "Fbar"]
    assert torch.equal(new[2], old[2])
    others = [k for k in range(new.shape[0]) if k != 2]
    assert all(not torch.equal(new[k], old[k]) for k in others)
    assert int(state["factors", "0", "fallbacks"].sum()) == 1
    assert torch.isfinite(new).all()
    params, state = dash_fn.step(params, {"w": torch.randn(16, 24)}, state, lr=0.01)
    assert int(state["factors", "0", "fallbacks"].sum()) == 2  # still poisoned: +1 per refresh


@pytest.mark.filterwarnings("ignore:parameter .* is viewed as one")
@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 20), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4),
    block_size=st.integers(1, 12),
    one_dim=st.sampled_from(["adamw", "shampoo"]),
    zero=st.booleans(),
    scale=st.sampled_from([1e-20, 1.0, 1e15]),
)
def test_step_never_produces_non_finite_values(shapes, block_size, one_dim, zero, scale):
    torch._dynamo.reset()
    params = {f"p{i}": torch.randn(s) for i, s in enumerate(shapes)}
    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", one_dim=one_dim)
    state = dash_fn.init(params, config)
    for _t in range(1, 4):
        grads = {k: torch.zeros_like(v) if zero else scale * torch.randn_like(v) for k, v in params.items()}
        params, state = dash_fn.step(params, grads, state, lr=0.01)
    assert all(torch.isfinite(v).all() for v in params.values())
    assert finite_state(state)
