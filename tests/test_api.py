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
    name = next(n for n, entry in blob["state"].items() if any(k.startswith("rows_") for k in entry))
    block = next(k for k in blob["state"][name] if k.startswith("rows_"))

    def changed(**entry):
        return {**blob, "state": {**blob["state"], name: {**blob["state"][name], **entry}}}

    _resave(changed(**{block: {**blob["state"][name][block], "X": torch.zeros(1)}}), tmp_path / "extra.pt")
    with pytest.raises(ValueError, match=f"unexpected entry '{name}/{block}/X'"):
        dash_fn.load_state(tmp_path / "extra.pt")
    A = blob["state"][name][block]["A"]
    _resave(changed(**{block: {**blob["state"][name][block], "A": A[:1]}}), tmp_path / "misshaped.pt")
    with pytest.raises(ValueError, match=f"parameter '{name}' {block}: 'A' has shape"):
        dash_fn.load_state(tmp_path / "misshaped.pt")
    _resave(changed(step=blob["state"][name]["step"].double()), tmp_path / "retyped.pt")
    with pytest.raises(ValueError, match=f"parameter '{name}': 'step' has shape .* and dtype torch.float64"):
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


def test_the_public_surface_is_what_a_user_trains_with():
    """``dash_fn`` exports the config, init, step, the schedule helper, the adapter, the state's
    save/load forms and the inverse-root utility; utilities live in ``dash_fn.utils``; every
    public name has a docstring."""
    assert set(dash_fn.__all__) == {
        "DashConfig",
        "init",
        "step",
        "is_refresh_step",
        "DASH",
        "save_state",
        "load_state",
        "state_to_dict",
        "state_from_dict",
        "inverse_root",
        "utils",
    }
    assert set(dash_fn.utils.__all__) == {"retain_freed_cpu_memory", "atomic_save", "mark_static", "start_vectors"}
    for module in (dash_fn, dash_fn.utils):
        for name in module.__all__:
            assert getattr(module, name).__doc__, name
    assert not any(hasattr(dash_fn, name) for name in dash_fn.utils.__all__)
