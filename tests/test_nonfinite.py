"""The non-finite guard: a step with a NaN/Inf gradient, or an overflowing factor product, changes nothing."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch._dynamo.utils import counters

import dash_fn
from conftest import assert_equal_states, mixed_params, random_grads, tensors
from dash_fn.strategy import simulated_accelerator

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

# the periodic schedule: these tests follow its refresh flag through skipped steps
CONFIG = dash_fn.DashConfig(
    block_size=24, solver="eigh", inv_root_freq=2, mu=0.5, weight_decay=0.1, refresh_schedule="periodic"
)
FAULTS = {  # what spoils one parameter's gradient
    "nan": lambda g: g.view(-1)[:1].fill_(float("nan")),  # one entry
    "inf": lambda g: g.fill_(-math.inf),
    "overflowing product": lambda g: g.mul_(1e25),  # finite, but G G^T is 1e50 > float32's 3e38
    "overflowing column": lambda g: g[:, 0].fill_(
        1e19
    ),  # rows' sums of squares 1e38 fit, a column's (in G^T G) does not
}


def run(
    faulty_step=None, fault=None, step=dash_fn.step, config=CONFIG, steps=6, where="rect", bad_lr=None, lr=torch.tensor
):
    """Steps 1..steps with deterministic gradients and learning rates ``lr(0.01)``;
    ``faulty_step`` gets a step inserted before it with a spoiled gradient (of parameter
    ``where``) or the learning rate ``lr(bad_lr)`` (so a skipping run takes steps + 1 calls)."""
    params = mixed_params()
    state = dash_fn.init(params, config)
    for t in range(1, steps + 1):
        refresh = dash_fn.is_refresh_step(config, t)
        if t == faulty_step:
            bad = random_grads(params, 100)
            if fault is not None:
                FAULTS[fault](bad[where])
            params, state = step(params, bad, state, lr=lr(0.01 if bad_lr is None else bad_lr), refresh=refresh)
        params, state = step(params, random_grads(params, t), state, lr=lr(0.01), refresh=refresh)
    return params, state


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_step_changes_nothing(fault):
    """The run with a spoiled step inserted equals the run without it, bitwise."""
    clean, clean_state = run()
    params, state = run(faulty_step=3, fault=fault)
    for name in clean:
        assert torch.equal(params[name], clean[name]), name
    assert int(state["skipped"]) == 1 and int(clean_state["skipped"]) == 0
    state["skipped"].zero_()
    assert_equal_states(state, clean_state)


@pytest.mark.parametrize("skip_nonfinite", [True, False])
@pytest.mark.parametrize("bad_lr", [math.nan, math.inf, -0.01])
def test_a_bad_tensor_lr_changes_nothing(bad_lr, skip_nonfinite):
    """A tensor lr that is NaN, infinite or negative (a schedule gone wrong) is checked where it
    lives, without a host read: the step changes nothing and is counted as skipped, whatever
    skip_nonfinite says, and the run equals the one without it, bitwise."""
    config = CONFIG.replace(skip_nonfinite=skip_nonfinite)
    clean, clean_state = run(config=config)
    params, state = run(faulty_step=3, bad_lr=bad_lr, config=config)
    for name in clean:
        assert torch.equal(params[name], clean[name]), name
    assert int(state["skipped"]) == 1
    state["skipped"].zero_()
    assert_equal_states(state, clean_state)


@pytest.mark.parametrize("where", ["square", "rect"])
@pytest.mark.parametrize("fault", ["nan", "overflowing product", "overflowing column"])
def test_a_bad_step_changes_nothing_where_the_factor_update_is_fused(fault, where):
    """At block 32 (float32 rows of whole 64-byte lines) eager CPU steps form the factor EMA
    inside its product (baddbmm) when every block is below the bound that keeps the products
    finite; a spoiled block is not, so its products are formed and checked as at block 24."""
    config = CONFIG.replace(block_size=32)
    clean, clean_state = run(config=config)
    params, state = run(faulty_step=3, fault=fault, config=config, where=where)
    for name in clean:
        assert torch.equal(params[name], clean[name]), name
    assert int(state["skipped"]) == 1
    state["skipped"].zero_()
    assert_equal_states(state, clean_state)


def test_a_block_above_the_bound_with_finite_products_still_steps():
    """One entry of 2e18 in a 32-block: above the fused path's bound (sqrt(3.4e38 / 128) =
    1.6e18) but its products (4e36) are finite, so the step counts, through the checked path."""
    config = CONFIG.replace(block_size=32)
    params = mixed_params()
    state = dash_fn.init(params, config)
    grads = random_grads(params, 1)
    grads["square"][0, 0] = 2e18
    new, state = dash_fn.step(params, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, 1))
    assert int(state["skipped"]) == 0 and int(state["step"]) == 1
    assert all(torch.isfinite(x).all() for x in tensors(state).values())
    assert not torch.equal(new["square"], params["square"])


@pytest.mark.parametrize("where", ["square", "conv", "bias", "vec", "scalar"])
def test_a_fault_anywhere_is_seen(where):
    """Wherever the NaN sits (a block's gradient is read only through its products' diagonals,
    an AdamW vector's directly), the step is skipped: eager and compiled."""
    for step in (dash_fn.step, torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")):
        clean, _ = run(step=step)
        params, state = run(faulty_step=3, fault="nan", where=where, step=step)
        assert int(state["skipped"]) == 1
        for name in clean:
            assert torch.equal(params[name], clean[name]), (where, name)


@pytest.mark.parametrize("refresh", [False, True], ids=["plain", "refresh"])
def test_the_skipped_step_itself_leaves_params_and_state_bitwise(refresh):
    """A skipped step changes nothing but the skip counter; on a refresh step it also
    refreshes the roots, from the factors it left unchanged (so a schedule counted on the host
    loses no refresh to a skip)."""
    params = mixed_params()
    state = dash_fn.init(params, CONFIG)
    for t in range(1, 4):
        params, state = dash_fn.step(
            params, random_grads(params, t), state, lr=1e-2, refresh=dash_fn.is_refresh_step(CONFIG, t)
        )
    before = {k: v.clone() for k, v in tensors(state).items()}
    bad = random_grads(params, 4)
    bad["square"][0, 0] = float("nan")
    new, state = dash_fn.step(params, bad, state, lr=1e-2, refresh=refresh)
    for name in params:
        assert torch.equal(new[name], params[name]), name
    for key, value in tensors(state).items():
        if refresh and key[-1] == "Fbar":
            k = int(key[1])
            order = state["plan"].factors[k].order  # 4: a matrix block's side, roots of root_order
            p = CONFIG.resolved_root_order if order == 4 else order
            expected = dash_fn.inverse_root(before[("factors", str(k), "F")], p, CONFIG)
            assert torch.equal(value, expected) and not torch.equal(value, before[key]), key
        else:
            assert torch.equal(value, before[key] + (1 if key == "skipped" else 0)), key


def test_compiled_step_skips_on_the_device_without_recompiling():
    """A NaN gradient, and a NaN or negative lr, skipped inside the compiled step: the tensor
    lr's runs make two graphs (plain and refresh steps); a float lr, which Dynamo traces as a
    symbol whose value the host never sees, is checked in the graph too."""
    step = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    for lr in (torch.tensor, float):
        counters.clear()
        clean, _ = run(step=step, lr=lr)
        for bad in ({"fault": "nan"}, {"bad_lr": math.nan}, {"bad_lr": -0.01}):
            params, state = run(faulty_step=4, step=step, lr=lr, **bad)
            for name in clean:
                assert torch.equal(params[name], clean[name]), (lr, bad, name)
            assert int(state["skipped"]) == 1
        if lr is torch.tensor:
            assert counters["stats"]["unique_graphs"] == 2


def adapter_run(values, faulty_call, compile=False, steps=5):
    """DASH over ``steps`` finite steps with a NaN gradient inserted as call ``faulty_call``."""
    params = {k: torch.nn.Parameter(v.clone()) for k, v in values.items()}
    opt = dash_fn.DASH(params.values(), lr=1e-2, compile=compile, **ADAPTER_CONFIG)
    calls = 0
    for t in range(1, steps + 1):
        calls += 1
        if calls == faulty_call:
            for k, g in random_grads(values, 50).items():
                params[k].grad = g.fill_(math.nan) if k == "bias" else g
            opt.step()
            calls += 1
        for k, g in random_grads(values, t).items():
            params[k].grad = g
        opt.step()
    return params, opt


ADAPTER_CONFIG = {
    "refresh_schedule": "periodic",
    "block_size": 24,
    "solver": "eigh",
    "inv_root_freq": 2,
    "eps": 1e-6,
    "eps_graft": 1e-8,
}  # eps_graft: eps is the damping


@pytest.mark.sets_accelerator  # runs both strategies itself
def test_adapter_schedule_counts_every_call_skipped_or_not():
    """The adapter's refresh schedule counts calls on the host: a NaN gradient on a refresh
    step (call 4) is skipped and still refreshes the roots from the unchanged factors, and the
    run equals the functional step given ``refresh=is_refresh_step(config, call)`` with the
    same calls, eager and compiled, under the CPU and the accelerator strategy alike (float64;
    eps 1e-6, as between eager and compiled elsewhere)."""
    values = {k: v.double() for k, v in mixed_params().items()}
    config = dash_fn.DashConfig(**ADAPTER_CONFIG)
    expected, state = dict(values), dash_fn.init(values, config)
    for call in range(1, 7):
        t = call if call < 4 else call - 1
        grads = random_grads(values, t)
        if call == 4:
            grads = {k: g.fill_(math.nan) if k == "bias" else g for k, g in random_grads(values, 50).items()}
        with simulated_accelerator(False):  # the CPU strategy's bits (also under DASH_FN_SIMULATE_ACCELERATOR=1)
            expected, state = dash_fn.step(
                expected, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, call)
            )
    assert int(state["skipped"]) == 1
    names = list(values)
    runs = {}
    for simulated in (False, True):
        with simulated_accelerator(simulated):
            for compiled in (False, {"backend": "aot_eager"}):
                torch._dynamo.reset()
                params, opt = adapter_run(values, faulty_call=4, compile=compiled)
                assert opt.skipped_steps() == [1]
                runs[simulated, bool(compiled)] = [params[k].detach() for k in names]
    for got in runs.values():
        for name, x, want in zip(names, got, (expected[k] for k in names)):
            torch.testing.assert_close(x, want, rtol=1e-9, atol=1e-9, msg=name)
    assert all(
        torch.equal(x, y) for x, y in zip(runs[False, False], (expected[k] for k in names))
    )  # eager CPU: bitwise
    assert all(torch.equal(x, y) for x, y in zip(runs[True, False], runs[True, True]))  # accelerator: compiled = eager


def test_guard_off_keeps_the_unguarded_behaviour_and_the_same_bits_on_finite_steps():
    off = CONFIG.replace(skip_nonfinite=False)
    guarded, _ = run()
    unguarded, _ = run(config=off)
    for name in guarded:
        assert torch.equal(guarded[name], unguarded[name]), name  # identities: the same arithmetic
    params, state = run(faulty_step=3, fault="nan", config=off)
    assert not all(torch.isfinite(x).all() for x in tensors(state).values())  # NaN got in, as before
    assert int(state["skipped"]) == 0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.sets_accelerator
def test_skipped_steps_are_heard_at_a_growing_interval():
    """Eager on the CPU, where the host knows of each skip: a WARNING of the dash_fn logger at the
    1st and the 10th skip of 12 (then at the 100th...); the accelerator strategy, which must not
    read the count, logs nothing and still counts them."""
    handler = _Records()
    logger = logging.getLogger("dash_fn")
    logger.addHandler(handler)
    try:
        for accelerator, expected in ((False, [1, 10]), (True, [])):
            handler.messages.clear()
            params = mixed_params()
            with simulated_accelerator(accelerator):
                state = dash_fn.init(params, CONFIG)
                bad = {k: torch.full_like(v, math.inf) for k, v in params.items()}
                for _ in range(12):
                    params, state = dash_fn.step(params, bad, state, lr=0.01, refresh=False)
            assert int(state["skipped"]) == 12
            heard = [int(m.split()[1]) for m in handler.messages]
            assert heard == expected, handler.messages
            assert all("NaN or Inf" in m and 'state["skipped"]' in m for m in handler.messages)
    finally:
        logger.removeHandler(handler)
