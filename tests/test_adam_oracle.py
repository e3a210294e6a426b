"""Before preconditioning starts, DASH is Adam: checked against torch.optim itself."""

import math

import pytest
import torch

import dash_fn
from conftest import mixed_params, random_grads

MATRICES = ("square", "rect", "conv")
VECTORS = ("bias", "vec", "scalar")


def torch_adamw_run(config, steps, lr, param_groups_fn):
    params = {k: v.clone().requires_grad_(True) for k, v in mixed_params().items()}
    opt = param_groups_fn(params)
    for t in range(1, steps + 1):
        for k, g in random_grads(params, t).items():
            params[k].grad = g
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def dash_run(config, steps, lr):
    params = mixed_params()
    state = dash_fn.init(params, config)
    for t in range(1, steps + 1):
        params, state = dash_fn.step(params, random_grads(params, t), state, lr=lr)
    return params


def adamw_groups(config, lr):
    # documented rule: vectors decay with weight_decay_1d, or with weight_decay when it is None
    vector_decay = config.weight_decay if config.weight_decay_1d is None else config.weight_decay_1d

    def make(params):
        return torch.optim.AdamW(
            [
                {
                    "params": [params[k] for k in MATRICES],
                    "betas": (config.beta_G, config.beta_graft),
                    "eps": config.eps_graft,
                    "weight_decay": config.weight_decay,
                },
                {
                    "params": [params[k] for k in VECTORS],
                    "betas": (config.adamw_beta1, config.adamw_beta2),
                    "eps": config.adamw_eps,
                    "weight_decay": vector_decay,
                },
            ],
            lr=lr,
        )

    return make


@pytest.mark.parametrize("weight_decay, weight_decay_1d", [(0.0, None), (0.1, None), (0.1, 0.05), (0.1, 0.0)])
def test_never_preconditioned_is_adamw(weight_decay, weight_decay_1d):
    """weight_decay alone decays every parameter, as torch.optim.AdamW's does."""
    config = dash_fn.DashConfig(
        block_size=24,
        solver="eigh",
        start_prec_step=math.inf,
        nesterov_G=False,  # Adam's EMA, not Nesterov's look-ahead (the reference checks that)
        beta_G=0.8,
        beta_graft=0.99,
        weight_decay=weight_decay,
        weight_decay_1d=weight_decay_1d,
        adamw_beta1=0.7,
        adamw_beta2=0.9,
    )
    ours = dash_run(config, 20, 0.01)
    theirs = torch_adamw_run(config, 20, 0.01, adamw_groups(config, 0.01))
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], msg=k)


def test_steps_before_start_prec_step_are_adam():
    """Every step t < s equals Adam; step s then departs (preconditioning starts)."""
    s = 6
    config = dash_fn.DashConfig(block_size=24, solver="eigh", start_prec_step=s, nesterov_G=False)
    for steps in range(1, s):
        ours = dash_run(config, steps, 0.01)
        theirs = torch_adamw_run(config, steps, 0.01, adamw_groups(config, 0.01))
        for k in theirs:
            torch.testing.assert_close(ours[k], theirs[k], msg=f"{k} at step {steps}")
    ours = dash_run(config, s, 0.01)
    theirs = torch_adamw_run(config, s, 0.01, adamw_groups(config, 0.01))
    assert (ours["square"] - theirs["square"]).abs().max() > 1e-4


def test_adagrad_grafting_never_preconditioned_is_adagrad():
    config = dash_fn.DashConfig(block_size=24, solver="eigh", start_prec_step=math.inf, grafting="adagrad", beta_G=0.0)

    def make(params):
        return torch.optim.Adagrad([params[k] for k in MATRICES], lr=0.01, eps=config.eps_graft)

    ours = dash_run(config, 15, 0.01)
    theirs = torch_adamw_run(config, 15, 0.01, make)
    for k in MATRICES:
        torch.testing.assert_close(ours[k], theirs[k], msg=k)


def test_lr_as_tensor_equals_lr_as_float():
    config = dash_fn.DashConfig(block_size=24, solver="eigh")
    params = mixed_params()
    a, sa = params, dash_fn.init(params, config)
    b, sb = params, dash_fn.init(params, config)
    for t in range(1, 4):
        grads = random_grads(params, t)
        a, sa = dash_fn.step(a, grads, sa, lr=0.02)
        b, sb = dash_fn.step(b, grads, sb, lr=torch.tensor(0.02))
    for k in a:
        assert torch.equal(a[k], b[k]), k
