"""Bad input raises a clear error naming the first mismatch, and changes nothing."""

import math

import pytest
import torch
from tensordict import TensorDict

import dash_fn
from conftest import mixed_params, random_grads

CONFIG = dash_fn.DashConfig(block_size=24, solver="eigh")


@pytest.fixture
def setup():
    params = mixed_params()
    state = dash_fn.init(params, CONFIG)
    params, state = dash_fn.step(params, random_grads(params, 1), state, lr=0.01)
    return params, random_grads(params, 2), state


def snapshot(params, state):
    return {k: v.clone() for k, v in params.items()}, state.clone()


def assert_unchanged(params, state, snap):
    old_params, old_state = snap
    for k in old_params:
        assert torch.equal(params[k], old_params[k]), k
    for key, value in old_state.items(include_nested=True, leaves_only=True):
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key


def drop(d, key):
    return {k: v for k, v in d.items() if k != key}


BAD_CALLS = {
    "params missing a key": (lambda p, g: (drop(p, "rect"), g, {}), ValueError, "params lacks parameter 'rect'"),
    "grads missing a key": (lambda p, g: (p, drop(g, "bias"), {}), ValueError, "grads lacks parameter 'bias'"),
    "params with extra key": (
        lambda p, g: ({**p, "new": torch.zeros(3)}, g, {}),
        ValueError,
        "params has parameter 'new'",
    ),
    "param of wrong shape": (
        lambda p, g: ({**p, "square": torch.zeros(64, 63)}, g, {}),
        ValueError,
        r"params\['square'\] has shape \(64, 63\)",
    ),
    "grad of wrong shape": (
        lambda p, g: (p, {**g, "conv": torch.zeros(3, 5, 7)}, {}),
        ValueError,
        r"grads\['conv'\] has shape",
    ),
    "param of wrong dtype": (
        lambda p, g: ({**p, "vec": p["vec"].double()}, g, {}),
        ValueError,
        r"params\['vec'\] has dtype torch.float64",
    ),
    "grad of wrong dtype": (
        lambda p, g: (p, {**g, "rect": g["rect"].half()}, {}),
        ValueError,
        r"grads\['rect'\] has dtype torch.float16",
    ),
    "grad on another device": (
        lambda p, g: (p, {**g, "square": torch.empty(64, 64, device="meta")}, {}),
        ValueError,
        r"grads\['square'\] is on meta",
    ),
    "negative lr": (lambda p, g: (p, g, {"lr": -1.0}), ValueError, "lr must be"),
    "nan lr": (lambda p, g: (p, g, {"lr": math.nan}), ValueError, "lr must be"),
    "lr vector": (lambda p, g: (p, g, {"lr": torch.ones(2)}), ValueError, "lr must be"),
    "refresh not bool": (lambda p, g: (p, g, {"refresh": 1}), TypeError, "refresh must be"),
    "grads not a mapping": (lambda p, g: (p, list(g.values()), {}), TypeError, "grads must be a Mapping"),
    "grad not a tensor": (
        lambda p, g: (p, {**g, "vec": [1.0] * 7}, {}),
        TypeError,
        r"grads\['vec'\] must be a torch.Tensor",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_step_raises_and_changes_nothing(case, setup):
    params, grads, state = setup
    make, error, message = BAD_CALLS[case]
    bad_params, bad_grads, kwargs = make(params, grads)
    kwargs = {"lr": 0.01, **kwargs}
    snap = snapshot(params, state)
    with pytest.raises(error, match=message):
        dash_fn.step(bad_params, bad_grads, state, **kwargs)
    assert_unchanged(params, state, snap)
    dash_fn.step(params, grads, state, lr=0.01)  # and the state still works


def test_state_from_another_model_is_rejected(setup):
    params, grads, _ = setup
    other = dash_fn.init({"x": torch.zeros(5, 5)}, CONFIG)
    snap = snapshot(params, other)
    with pytest.raises(ValueError, match="params lacks parameter 'x' that the state was initialized with"):
        dash_fn.step(params, grads, other, lr=0.01)
    assert_unchanged(params, other, snap)


def test_not_a_state():
    with pytest.raises(TypeError, match="state must be the TensorDict returned by dash_fn.init"):
        dash_fn.step({"w": torch.zeros(2, 2)}, {"w": torch.zeros(2, 2)}, {"step": 0}, lr=0.1)


def test_keys_in_other_order_are_accepted(setup):
    params, grads, state = setup
    reordered = dict(reversed(list(grads.items())))
    new, _ = dash_fn.step(params, reordered, state.clone(), lr=0.01)
    ref, _ = dash_fn.step(params, grads, state.clone(), lr=0.01)
    assert list(new) == list(params)
    for k in ref:
        assert torch.equal(new[k], ref[k])


def test_tensordict_in_tensordict_out():
    params = TensorDict({"layer": {"w": torch.randn(6, 5), "b": torch.randn(5)}}, batch_size=[])
    state = dash_fn.init(params, CONFIG)
    new, state = dash_fn.step(params, params.apply(torch.ones_like), state, lr=0.1)
    assert isinstance(new, TensorDict)
    assert set(new.keys(include_nested=True, leaves_only=True)) == {("layer", "w"), ("layer", "b")}
    assert not torch.equal(new["layer", "w"], params["layer", "w"])


@pytest.mark.parametrize(
    "params, error, message",
    [
        ({}, ValueError, "params is empty"),
        ({"w": torch.zeros(3, dtype=torch.int64)}, TypeError, r"params\['w'\] has dtype torch.int64"),
        ({"w": [1.0, 2.0]}, TypeError, r"params\['w'\] must be a torch.Tensor"),
        ([torch.zeros(3)], TypeError, "params must be a Mapping"),
        ({"a": torch.zeros(3), "b": torch.zeros(3, device="meta")}, ValueError, r"params\['b'\] is on meta"),
    ],
)
def test_bad_init(params, error, message):
    with pytest.raises(error, match=message):
        dash_fn.init(params, CONFIG)


def test_init_needs_a_config():
    with pytest.raises(TypeError, match="config must be a DashConfig"):
        dash_fn.init({"w": torch.zeros(2, 2)}, {"block_size": 4})
