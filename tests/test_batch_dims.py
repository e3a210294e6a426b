"""Batched weights (mixture-of-experts, heads): ``batch_dims`` makes each leading index its own matrix."""

from __future__ import annotations

import warnings

import pytest
import torch

import dash_fn
from conftest import assert_equal_states, random_grads

E = 3
CONFIG = dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=2, mu=0.5)
# the same step in the other mode, Adam in the factors' eigenbases ("auto": eigh bases on the
# CPU, qr under the accelerator strategy)
CORRECTED = CONFIG.replace(solver="auto", preconditioner="eigenvalue_corrected")


def batched_params():
    gen = torch.Generator().manual_seed(0)
    return {
        "pre": torch.randn(10, 6, generator=gen),
        "experts": torch.randn(E, 20, 12, generator=gen),
        "post": torch.randn(7, generator=gen),
    }


def as_separate(tree):
    """The same values with the experts as E parameters of their own, in their place."""
    out = {"pre": tree["pre"]}
    out.update({f"experts.{e}": tree["experts"][e] for e in range(E)})
    out["post"] = tree["post"]
    return out


def run(params, step=dash_fn.step, batch_dims=None, steps=6, config=CONFIG):
    state = dash_fn.init(params, config, batch_dims=batch_dims)
    for t in range(1, steps + 1):
        grads = random_grads(batched_params(), t)
        params, state = step(
            params,
            grads if batch_dims else as_separate(grads),
            state,
            lr=1e-2,
            refresh=dash_fn.is_refresh_step(config, t),
        )
    return params, state


@pytest.mark.accelerator
@pytest.mark.parametrize("config", [CONFIG, CORRECTED], ids=["roots", "eigenvalue-corrected"])
@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_experts_step_bitwise_as_separate_parameters(backend, config):
    step = dash_fn.step if backend is None else torch.compile(dash_fn.step, fullgraph=True, backend=backend)
    batched, batched_state = run(batched_params(), step, {"experts": 1}, config=config)
    separate, separate_state = run(as_separate(batched_params()), step, config=config)
    for name, value in as_separate(batched).items():
        assert torch.equal(value, separate[name]), name
    for key in ("groups", "factors"):  # the same stacks, block for block
        assert_equal_states(batched_state.select(key), separate_state.select(key))


def test_an_experts_update_ignores_the_other_experts_gradients():
    """Undeclared, (E, m, n) is one (E, m n) matrix whose left factor mixes the experts."""

    def expert0_update(batch_dims, scale_expert1):
        params = batched_params()
        state = dash_fn.init(params, CONFIG.replace(block_size=64), batch_dims=batch_dims)
        grads = random_grads(params, 1)
        grads["experts"][1] *= scale_expert1
        new, _ = dash_fn.step(params, grads, state, lr=1.0)
        return params["experts"][0] - new["experts"][0]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not torch.allclose(expert0_update(None, 1.0), expert0_update(None, 10.0))
    assert torch.equal(expert0_update({"experts": 1}, 1.0), expert0_update({"experts": 1}, 10.0))


def test_checkpoint_round_trip_keeps_the_experts(tmp_path):
    params, state = run(batched_params(), batch_dims={"experts": 1}, steps=3)
    dash_fn.save_state(tmp_path / "state.pt", state)
    loaded = dash_fn.load_state(tmp_path / "state.pt", params=params)
    assert_equal_states(loaded, state)
    assert loaded["plan"] == state["plan"]
    saved = dash_fn.state_to_dict(state)
    assert "rows_20_28_cols_0_8" in saved["state"]["experts"]  # expert 1's first block: rows of the (E 20, 12) view
    assert_equal_states(dash_fn.state_from_dict(dash_fn.init(params, CONFIG, batch_dims={"experts": 1}), saved), state)
    with pytest.raises(ValueError, match="parameter 'experts' has batch_dims 0 but 1 in the checkpoint"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dash_fn.state_from_dict(dash_fn.init(params, CONFIG), saved)


def test_adapter_group_key_batch_dims():
    experts = torch.nn.Parameter(batched_params()["experts"])
    separate = [torch.nn.Parameter(experts.detach()[e].clone()) for e in range(E)]
    batched_opt = dash_fn.DASH([{"params": [experts], "batch_dims": 1}], lr=1e-2, block_size=8, solver="eigh")
    separate_opt = dash_fn.DASH(separate, lr=1e-2, block_size=8, solver="eigh")
    for t in range(1, 4):
        grad = random_grads({"experts": experts.detach()}, t)["experts"]
        experts.grad = grad.clone()
        for e, p in enumerate(separate):
            p.grad = grad[e].clone()
        batched_opt.step()
        separate_opt.step()
    for e in range(E):
        assert torch.equal(experts.detach()[e], separate[e].detach()), e
    restored = dash_fn.DASH([{"params": [experts], "batch_dims": 1}], lr=1e-2, block_size=8, solver="eigh")
    restored.load_state_dict(batched_opt.state_dict())
    assert_equal_states(restored.state[experts]["dash"], batched_opt.state[experts]["dash"])
    with pytest.raises(ValueError, match="batch_dims=3 leaves no matrix in parameter '0' of shape"):
        dash_fn.DASH([{"params": [experts], "batch_dims": 3}])


def test_undeclared_batched_weights_warn_once_and_conv_kernels_do_not():
    params = {
        "experts": torch.zeros(4, 16, 32),
        "conv": torch.zeros(8, 4, 3, 3),
        "conv1d": torch.zeros(8, 4, 5),
        "w": torch.zeros(6, 6),
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dash_fn.init(params, CONFIG)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "'experts' of shape (4, 16, 32) is viewed as one (4, 512) matrix" in messages[0]
    assert "batch_dims={'experts': 1}" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dash_fn.init(params, CONFIG, batch_dims={"experts": 1})


@pytest.mark.parametrize(
    "batch_dims, error, match",
    [
        ({"nope": 1}, ValueError, "batch_dims names 'nope', which is not a parameter"),
        ({"experts": 3}, ValueError, r"batch_dims\['experts'\] must be an integer in \[0, 2\]"),
        ({"experts": True}, ValueError, "must be an integer"),
        ([("experts", 1)], TypeError, "batch_dims must map parameter names to integers"),
    ],
)
def test_bad_batch_dims_raise(batch_dims, error, match):
    with pytest.raises(error, match=match):
        dash_fn.init(batched_params(), CONFIG, batch_dims=batch_dims)


def test_main_job_with_experts_declares_them(tmp_path):
    """train_lm --experts 2: the stacked expert weights are declared, so nothing warns."""
    import json

    from examples import train_lm

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        train_lm.main(
            [
                "--runs",
                "dash-eigh@3e-3",
                "--steps",
                "2",
                "--eval-every",
                "2",
                "--eval-batches",
                "1",
                "--experts",
                "2",
                "--d-model",
                "32",
                "--n-layers",
                "1",
                "--n-heads",
                "2",
                "--context",
                "16",
                "--batch",
                "2",
                "--block-size",
                "16",
                "--corpus-bytes",
                "100000",
                "--backend",
                "none",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
    run = json.loads((tmp_path / "log.json").read_text())["runs"][0]
    assert run["val_loss"][-1] > 0
