"""Public API corners: pickling the adapter, checkpoints through file objects, argument errors."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from tensordict import TensorDict

import dash_fn
from conftest import assert_equal_states, mixed_params, random_grads, tensors

CONFIG = dash_fn.DashConfig(block_size=24, solver="eigh", inv_root_freq=2)


def test_adapter_pickles_and_steps_on_identically():
    params = {k: torch.nn.Parameter(v) for k, v in mixed_params().items()}
    opt = dash_fn.DASH(params.values(), lr=1e-2, block_size=24, solver="eigh")
    for t in (1, 2):
        for k, g in random_grads(params, t).items():
            params[k].grad = g
        opt.step()
    copy_params, copy_opt = pickle.loads(pickle.dumps((params, opt)))
    assert_equal_states(copy_opt.state[copy_params["square"]]["dash"], opt.state[params["square"]]["dash"])
    for t in (3, 4):
        for tree in (params, copy_params):
            for k, g in random_grads(tree, t).items():
                tree[k].grad = g
        opt.step()
        copy_opt.step()
    for k in params:
        assert torch.equal(params[k], copy_params[k]), k


def test_save_and_load_state_through_file_objects():
    params = mixed_params()
    state = dash_fn.init(params, CONFIG)
    params, state = dash_fn.step(params, random_grads(params, 1), state, lr=1e-2)
    buffer = io.BytesIO()
    dash_fn.save_state(buffer, state)
    buffer.seek(0)
    assert_equal_states(dash_fn.load_state(buffer, params=params), state)
    with pytest.raises(ValueError, match="cannot be read"):
        dash_fn.load_state(io.BytesIO(buffer.getvalue()[:100]))


def _resave(blob, path):
    from dash_fn.checkpoint import _checksum

    blob["checksum"] = _checksum(blob)
    torch.save(blob, path)


def test_load_state_rejects_unexpected_or_misshaped_tensors(tmp_path):
    state = dash_fn.init(mixed_params(), CONFIG)
    dash_fn.save_state(tmp_path / "state.pt", state)
    blob = torch.load(tmp_path / "state.pt", weights_only=True)
    extra = {**blob, "tensors": {**blob["tensors"], "groups/0/X": torch.zeros(1)}}
    _resave(extra, tmp_path / "extra.pt")
    with pytest.raises(ValueError, match="unexpected state tensor 'groups/0/X'"):
        dash_fn.load_state(tmp_path / "extra.pt")
    misshaped = {**blob, "tensors": {**blob["tensors"], "groups/0/A": blob["tensors"]["groups/0/A"][:1]}}
    _resave(misshaped, tmp_path / "misshaped.pt")
    with pytest.raises(ValueError, match="state tensor 'groups/0/A' has shape"):
        dash_fn.load_state(tmp_path / "misshaped.pt")
    retyped = {**blob, "tensors": {**blob["tensors"], "step": blob["tensors"]["step"].double()}}
    _resave(retyped, tmp_path / "retyped.pt")
    with pytest.raises(ValueError, match="state tensor 'step' has shape .* and dtype torch.float64"):
        dash_fn.load_state(tmp_path / "retyped.pt")


@pytest.mark.parametrize(
    "stack, p, match",
    [
        (torch.eye(4), 4, r"expects a \(K, b, b\) stack"),
        (torch.zeros(2, 3, 4), 4, r"expects a \(K, b, b\) stack"),
        (torch.eye(4)[None], 0, "p must be a positive integer"),
        (torch.eye(4)[None], 2.0, "p must be a positive integer"),
    ],
)
def test_inverse_root_argument_errors(stack, p, match):
    with pytest.raises(ValueError, match=match):
        dash_fn.inverse_root(stack, p, CONFIG)


def test_a_name_given_twice_is_refused_by_init_and_step():
    """A TensorDict's nested ("a", "b") and a flat "a.b" both name parameter "a.b"."""
    twice = TensorDict({"a": {"b": torch.zeros(3, 3)}, "a.b": torch.zeros(3, 3)}, batch_size=[])
    with pytest.raises(ValueError, match="names a parameter twice"):
        dash_fn.init(twice, CONFIG)
    state = dash_fn.init({"a.b": torch.zeros(3, 3)}, CONFIG)
    before = {k: v.clone() for k, v in tensors(state).items()}
    with pytest.raises(ValueError, match="params names a parameter twice|params has parameter"):
        dash_fn.step(twice, {"a.b": torch.zeros(3, 3)}, state, lr=0.1)
    assert all(torch.equal(v, before[k]) for k, v in tensors(state).items())
