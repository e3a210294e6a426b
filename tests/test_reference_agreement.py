"""dash_fn.step against the plain float64 per-block reference (tests/reference.py)."""

import math

import pytest
import torch

import dash_fn
from conftest import mixed_params, random_grads
from reference import ReferenceDash

# also run under the simulated accelerator strategy, and on the oldest and newest supported torch
# (docs/CONTRIBUTING.md)
pytestmark = [pytest.mark.accelerator, pytest.mark.compat]

CONFIGS = {
    "default-eigh": dict(solver="eigh", inv_root_freq=1),
    "freq3-s4-momentum": dict(
        solver="eigh", inv_root_freq=3, start_prec_step=4, mu=0.5, nesterov=True, weight_decay=0.1, weight_decay_1d=0.05
    ),
    "plain-momentum-adagrad": dict(
        solver="eigh", inv_root_freq=1, mu=0.3, nesterov=False, grafting="adagrad", beta_G=0.0, beta_LR=1.0
    ),
    "shampoo-vectors-nobc": dict(
        solver="eigh", one_dim="shampoo", bias_correction=False, eigh_heuristic="abs_add", inv_root_freq=2
    ),
    "relu-heuristic": dict(solver="eigh", inv_root_freq=1, eigh_heuristic="relu", eps=1e-6, start_prec_step=2),
    "abs-heuristic": dict(solver="eigh", inv_root_freq=2, eigh_heuristic="abs", eps=1e-6),
    "shampoo-vectors-two-decays": dict(
        solver="eigh", inv_root_freq=1, one_dim="shampoo", weight_decay=0.1, weight_decay_1d=0.03
    ),
    "adagrad-with-gradient-ema": dict(solver="eigh", inv_root_freq=1, grafting="adagrad", beta_G=0.9, mu=0.2),
    # the step-size, damping, momentum and exponent options (docs/ALGORITHM.md 4 e, 4 g, 5.6)
    "rms-nesterov-G-order3": dict(
        solver="eigh", inv_root_freq=2, grafting="rms", graft_rms=0.3, nesterov_G=True, root_order=3
    ),
    "relative-floor-order2-late-start": dict(
        solver="eigh", inv_root_freq=1, eps_rel=1e-3, root_order=2, start_prec_step=3, grafting="rms"
    ),
    "spectral-nesterov-G-late-start": dict(
        solver="eigh", inv_root_freq=2, grafting="spectral", graft_rms=0.3, nesterov_G=True, start_prec_step=3
    ),
    "nesterov-G-nobc-floor-momentum": dict(
        solver="eigh", inv_root_freq=3, nesterov_G=True, bias_correction=False, eps_rel=1e-2, mu=0.5, beta_G=0.95
    ),
}


def run_both(config, dtype, steps, lr=0.01, scale=1.0, root=None):
    """dash_fn and the reference from the same start; ``root`` replaces the reference's eigh root."""
    params = mixed_params(dtype)
    state = dash_fn.init(params, config)
    ref = ReferenceDash(mixed_params(torch.float64), config, root=root)
    ref_params = mixed_params(torch.float64)
    for t in range(1, steps + 1):
        grads = random_grads(params, t, scale=scale)
        params, state = dash_fn.step(params, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))
        ref_params = ref.step(ref_params, random_grads(ref_params, t, scale=scale), lr)
    return params, ref_params


def max_relative_error(params, ref_params):
    """Per parameter, the error of the total update (W_T - W_0) relative to the reference's
    update: the parameters themselves would hide an update error behind ||W_0||."""
    start = mixed_params(torch.float64)
    errs = {}
    for k in ref_params:
        ours, theirs = params[k].double() - start[k], ref_params[k] - start[k]
        errs[k] = float((ours - theirs).norm() / theirs.norm().clamp_min(1e-30))
    return errs


BLOCK_SIZES = pytest.mark.parametrize("block_size", [8, 24, 1024], ids=["B8-divides", "B24-ragged", "B1024-one-block"])


@BLOCK_SIZES
@pytest.mark.parametrize("name", list(CONFIGS))
def test_float64_matches_reference(name, block_size):
    """Every config in float64 over 20 steps, the total update within 1e-5 relative of the
    reference's with fresh roots, 1e-4 with stale ones.

    Stale roots (inv_root_freq > 1) and rank-deficient factors put gradient mass on
    eigenvalues near eps = 1e-10, where the root (eps^{-1/4} = 316) amplifies eigh's
    rounding: there two float64 implementations agree to ~2e-5 of the update (measured 4.7e-5
    for one (100, 37) block), not 1e-15.
    """
    config = dash_fn.DashConfig(block_size=block_size, **CONFIGS[name])
    params, ref_params = run_both(config, torch.float64, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < (1e-5 if config.inv_root_freq == 1 else 1e-4), errs


@BLOCK_SIZES
def test_float64_fresh_roots_match_reference_to_1e9(block_size):
    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", inv_root_freq=1)
    params, ref_params = run_both(config, torch.float64, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-9, errs


@pytest.mark.parametrize("block_size", [8, 24])
def test_float32_matches_reference(block_size):
    """float32 state and arithmetic: the update within 1e-4 of the float64 reference's
    (measured 2-5e-5: float32 eigh on factors of condition ~1e4).

    eps = 1e-4 keeps the factors' condition number where float32 eigh is accurate; with the
    default 1e-10 the float32 eigendecomposition itself differs by up to 1e-3 (measured) on
    these rank-deficient factors, for any implementation.
    """
    # float32 products named: "auto" is float16 on tensor cores in the accelerator pass, as on a GPU
    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", eps=1e-4, inv_root_freq=1, precision="float32")
    params, ref_params = run_both(config, torch.float32, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-4, errs


def test_update_is_not_trivial():
    """Guard against a vacuous agreement: 20 steps move every parameter measurably."""
    config = dash_fn.DashConfig(block_size=24, solver="eigh")
    params, _ = run_both(config, torch.float64, steps=20)
    start = mixed_params(torch.float64)
    for k in start:
        assert (params[k] - start[k]).norm() > 1e-3 * math.sqrt(start[k].numel()) * 0.01, k


def test_tiny_gradients_where_the_epsilons_and_bias_correction_matter():
    """Gradients x 1e-5: eps_graft, adamw_eps (1e-8) and the bias corrections shape the update."""
    for name in ("default-eigh", "freq3-s4-momentum", "shampoo-vectors-two-decays"):
        config = dash_fn.DashConfig(block_size=24, **CONFIGS[name])
        params, ref_params = run_both(config, torch.float64, steps=12, scale=1e-5)
        errs = max_relative_error(params, ref_params)
        assert max(errs.values()) < (1e-5 if config.inv_root_freq == 1 else 1e-4), (name, errs)


@pytest.mark.parametrize("solver, scaling", [("ndb", "pim"), ("ndb", "fro"), ("cn", "pim"), ("cn", "fro")])
def test_matmul_solvers_inside_step_match_the_eigh_reference(solver, scaling):
    """Converged Newton iterations (float64, 40 steps, eps 1e-2 bounding the condition number)
    give the same roots as the reference's eigh, so the whole step agrees."""
    config = dash_fn.DashConfig(
        block_size=24,
        solver=solver,
        scaling=scaling,
        newton_steps=40,
        eps=1e-2,
        eps_rel=0.0,  # eigh's floor is a pseudo-inverse, the Newton solvers' a shift: not the same roots
        inv_root_freq=2,
        mu=0.3,
        cn_tol=1e-14,
        ndb_tol=1e-14,
    )
    params, ref_params = run_both(config, torch.float64, steps=8)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-7, errs


@pytest.mark.parametrize("solver", ["ndb", "cn"])
def test_relative_damping_of_the_newton_solvers_matches_the_shifted_eigh_root(solver):
    """Under fro scaling the Newton solvers' relative floor inverts ``X + eps I + eps_rel
    ||X + eps I||_F I`` (docs/ALGORITHM.md 5.6); the reference gets that root by eigh."""
    config = dash_fn.DashConfig(
        block_size=24, solver=solver, scaling="fro", eps=1e-6, eps_rel=1e-2, newton_steps=40, inv_root_freq=2
    )
    config = config.replace(cn_tol=1e-14, ndb_tol=1e-14)

    def damped_root(X, p):
        identity = torch.eye(X.shape[0], dtype=X.dtype)
        Xr = X + config.eps * identity
        mu, Q = torch.linalg.eigh(Xr + config.eps_rel * torch.linalg.norm(Xr) * identity)
        return Q @ torch.diag(mu ** (-1.0 / p)) @ Q.T

    params, ref_params = run_both(config, torch.float64, steps=6, root=damped_root)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-9, errs


def test_chebyshev_inside_step_matches_the_shifted_eigh_root():
    """Chebyshev computes (X + cheb_eps s I)^{-1/p} with s = ||X||_F under fro scaling
    (docs/ALGORITHM.md 5.4); the reference gets that root by eigh through its root hook."""
    config = dash_fn.DashConfig(
        block_size=24, solver="chebyshev", scaling="fro", cheb_eps=1e-2, cheb_degree=60, inv_root_freq=1
    )

    def shifted_root(X, p):
        s = max(float(torch.linalg.norm(X)), 1e-30)
        mu, Q = torch.linalg.eigh(X + config.cheb_eps * s * torch.eye(X.shape[0], dtype=X.dtype))
        return Q @ torch.diag(mu ** (-1.0 / p)) @ Q.T

    params, ref_params = run_both(config, torch.float64, steps=8, root=shifted_root)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-5, errs
