"""Root refresh schedule (docs/ALGORITHM.md 4 d, oracle 13) and the static refresh flag."""

import torch

import dash_fn
from conftest import mixed_params, random_grads


def roots(state):
    return {k: state["factors", k, "Fbar"].clone() for k in state["factors"].keys()}


def test_roots_change_only_on_refresh_steps():
    config = dash_fn.DashConfig(
        block_size=24, solver="eigh", start_prec_step=3, inv_root_freq=4, refresh_schedule="periodic"
    )
    expected_refreshes = {3, 4, 8, 12}
    assert {t for t in range(1, 15) if dash_fn.is_refresh_step(config, t)} == expected_refreshes
    params = mixed_params()
    state = dash_fn.init(params, config)
    before = roots(state)
    for t in range(1, 15):
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=0.01)
        after = roots(state)
        for k in before:
            if t in expected_refreshes:
                assert not torch.equal(before[k], after[k]), (t, k)
            else:
                assert torch.equal(before[k], after[k]), (t, k)
        before = after
    assert int(state["step"]) == 14


def test_static_refresh_flag_equals_device_schedule():
    config = dash_fn.DashConfig(block_size=24, solver="eigh", start_prec_step=2, inv_root_freq=3)
    params = mixed_params()
    a, sa = params, dash_fn.init(params, config)
    b, sb = params, dash_fn.init(params, config)
    for t in range(1, 10):
        grads = random_grads(params, t)
        a, sa = dash_fn.step(a, grads, sa, lr=0.01)
        b, sb = dash_fn.step(b, grads, sb, lr=0.01, refresh=dash_fn.is_refresh_step(config, t))
        for k in a:
            assert torch.equal(a[k], b[k]), (t, k)


def test_first_preconditioned_step_uses_fresh_roots():
    """s = 5, f = 10: step 5 refreshes although 5 % 10 != 0, so no step t >= s runs on initial I roots."""
    config = dash_fn.DashConfig(block_size=24, solver="eigh", start_prec_step=5, inv_root_freq=10)
    params = mixed_params()
    state = dash_fn.init(params, config)
    for t in range(1, 6):
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=0.01)
        identity = torch.eye(24).expand_as(state["factors", "0", "Fbar"])
        assert torch.equal(state["factors", "0", "Fbar"], identity) == (t < 5)
