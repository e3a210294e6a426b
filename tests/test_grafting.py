"""Closed-form properties of the grafted Shampoo direction (docs/ALGORITHM.md 4 (ii), oracles 10-12)."""

import pytest
import torch

import dash_fn
from conftest import mixed_params, random_grads


def blocks_of(x2d, B):
    R, C = x2d.shape
    return {(i, j): x2d[i : i + B, j : j + B] for i in range(0, R, B) for j in range(0, C, B)}


def adam_norms(grad_history, config, B):
    """||D_b||_F per block from first principles (float64 EMAs of the raw gradients)."""
    Gt = A = None
    for t, G in enumerate(grad_history, start=1):
        Gt = G if Gt is None else config.beta_G * Gt + (1 - config.beta_G) * G
        if t == 1:
            Gt = (1 - config.beta_G) * G
        A = (1 - config.beta_graft) * G * G if A is None else config.beta_graft * A + (1 - config.beta_graft) * G * G
    D = (Gt / (1 - config.beta_G**t)) / (config.eps_graft + (A / (1 - config.beta_graft**t)).sqrt())
    return {k: v.norm() for k, v in blocks_of(D, B).items()}


@pytest.mark.parametrize("rescale_roots", [False, True])
def test_block_update_norm_equals_lr_times_adam_norm(rescale_roots):
    B, lr = 24, 0.03
    config = dash_fn.DashConfig(block_size=B, solver="eigh", inv_root_freq=100, nesterov_G=False)
    params = mixed_params(torch.float64)
    state = dash_fn.init(params, config)
    history = []
    for t in range(1, 6):
        grads = random_grads(params, t)
        history.append(grads["square"].double())
        if rescale_roots and t == 3:  # any positive per-block rescaling of the roots leaves the norm alone
            for k in state["factors"].keys():
                Fbar = state["factors", k, "Fbar"]
                Fbar.mul_(torch.rand(Fbar.shape[0], 1, 1, dtype=Fbar.dtype) * 10 + 0.1)
        new, state = dash_fn.step(params, grads, state, lr=lr)
        delta = blocks_of(new["square"] - params["square"], B)
        expected = adam_norms(history, config, B)
        for key in expected:
            torch.testing.assert_close(delta[key].norm(), lr * expected[key], rtol=1e-10, atol=0)
        params = new


def test_rank_one_first_step_is_polar_factor():
    """t = 1, eigh, eps << lambda: G = sigma u v^T gives dW = -lr n sign(sigma) u v^T (oracle 11).

    eps = 1e-10 stands for "eps -> 0": far below lambda_max = 0.31 (1 - beta_LR) sigma^2, yet far
    above eigh's float64 noise (1e-17), whose inverse 4th root would otherwise amplify rounding.
    """
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(16, 1, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 12, generator=gen, dtype=torch.float64)
    u, v = u / u.norm(), v / v.norm()
    sigma = -2.5
    G = sigma * u @ v
    config = dash_fn.DashConfig(block_size=32, solver="eigh", eps=1e-10)
    params = {"w": torch.zeros(16, 12, dtype=torch.float64)}
    state = dash_fn.init(params, config)
    new, _ = dash_fn.step(params, {"w": G}, state, lr=0.1)
    n = (G / (config.eps_graft + G.abs())).norm()
    torch.testing.assert_close(new["w"], -0.1 * n * (-1.0) * u @ v, rtol=1e-9, atol=1e-12)


def test_scale_invariance():
    """Gradients x 1e3 give the same parameters (eigh, fresh roots; oracle 12)."""
    config = dash_fn.DashConfig(block_size=24, solver="eigh", inv_root_freq=1)
    runs = []
    for scale in (1.0, 1e3):
        params = mixed_params(torch.float64)
        state = dash_fn.init(params, config)
        for t in range(1, 6):
            params, state = dash_fn.step(params, random_grads(params, t, scale=scale), state, lr=0.01)
        runs.append(params)
    for k in runs[0]:
        assert (runs[0][k] - runs[1][k]).norm() <= 1e-5 * runs[0][k].norm(), k


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_block_norm_neither_overflows_nor_underflows(compiled):
    """Squares of float32 entries near 1e20 (or 1e-30) leave float32's range; the norm does
    not, eager (direct norms where they are safe, the rest scaled) or compiled (all scaled),
    in a stack that mixes such blocks with ordinary, zero and barely-out-of-range ones; and a
    part of the stack gets the bits of the whole (a rank holding some of the blocks)."""
    from dash_fn.forms import forms_for
    from dash_fn.strategy import for_device

    def block_norm(X):
        return forms_for(for_device(X.device)).block_norm(X)

    values = (1e20, 1e-30, 0.0, 1.0, 1e-15, 3e17)
    X = torch.stack([v * torch.randn(256, 256) for v in values])
    norm = torch.compile(block_norm, fullgraph=True, backend="aot_eager") if compiled else block_norm
    expected = torch.linalg.vector_norm(X.double(), dim=(-2, -1), keepdim=True)
    got = norm(X)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=0)
    for part in (slice(0, 1), slice(2, 5), slice(3, 4)):
        assert torch.equal(norm(X[part].clone()), got[part])
