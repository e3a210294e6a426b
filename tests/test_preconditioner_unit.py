"""A preconditioner is a unit: a new one is its module, its registry entry and config's choice.

The toy here (the identity: the gradient EMA's look-ahead itself, grafted onto Adam's norm per
block) is added in exactly those three places, at run time, and the step runs it as it runs
Shampoo's: its update against a float64 closed form, under both strategies, eager and compiled.
"""

from __future__ import annotations

import pytest
import torch

import dash_fn
from dash_fn import config as config_module
from dash_fn import preconditioners
from dash_fn.preconditioners import Directions, Preconditioner

pytestmark = pytest.mark.accelerator


class Identity(Preconditioner):
    """No factor is ever solved: the direction is the gradient EMA (its look-ahead)."""

    name = "identity"
    auto_precision = "float32"

    def solver(self, config, strategy):
        return "auto"  # it solves nothing

    def solve(self, factors, old, p, config, start, strategy, products, due):
        return old, torch.zeros(old.shape[:1], dtype=torch.bool, device=old.device)

    def direction(self, ctx, g, G):
        Gt, D = ctx.forms.adam_direction(ctx.config, ctx.state["groups", str(g)], G, ctx.corrections, ctx.t, ctx.guard)
        return Directions(D, Gt.clone(), True)


@pytest.fixture
def identity_registered(monkeypatch):
    """The identity in the registry and in config's choices (the two places besides its module)."""
    monkeypatch.setitem(preconditioners.UNITS, "identity", Identity())
    choice = config_module.Choice(("auto",), config_module.GRAFTINGS, computes_roots=False)
    monkeypatch.setitem(config_module.PRECONDITIONERS, "identity", choice)


def grafted_lookahead(W, grads, lr, block, beta=0.9, beta2=0.95, eps=1e-8):
    """float64 closed form: per block, the bias-corrected gradient EMA's look-ahead
    ``L = beta m_hat + (1 - beta) g`` scaled to the Frobenius norm of Adam's direction
    ``L / (sqrt(v_hat) + eps)``."""
    W = W.double().clone()
    m, v = torch.zeros_like(W), torch.zeros_like(W)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = beta * m + (1 - beta) * g
        v = beta2 * v + (1 - beta2) * g * g
        L = beta * m / (1 - beta**t) + (1 - beta) * g
        D = L / ((v / (1 - beta2**t)).sqrt() + eps)
        for i in range(0, W.shape[0], block):
            for j in range(0, W.shape[1], block):
                Lb, Db = L[i : i + block, j : j + block], D[i : i + block, j : j + block]
                W[i : i + block, j : j + block] -= lr * Lb * Db.norm() / (Lb.norm() + 1e-16)
    return W


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_new_preconditioner_needs_its_module_the_registry_and_a_choice(identity_registered, compiled):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(8, 12, generator=g)
    grads = [torch.randn(8, 12, generator=g) * (t + 1) for t in range(4)]
    config = dash_fn.DashConfig(preconditioner="identity", block_size=4, precision="float32")
    state = dash_fn.init({"w": W}, config)
    step = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager") if compiled else dash_fn.step
    params = {"w": W}
    for G in grads:
        params, state = step(params, {"w": G}, state, lr=torch.tensor(0.01))
    want = grafted_lookahead(W, grads, 0.01, block=4)
    torch.testing.assert_close(params["w"].double(), want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(params["w"], W)
    assert int(state["step"]) == 4


def test_an_unregistered_preconditioner_is_refused():
    with pytest.raises(ValueError, match="preconditioner"):
        dash_fn.DashConfig(preconditioner="identity")
