"""dash_fn.step against the plain float64 per-block reference (tests/reference.py)."""

import math

import pytest
import torch

import dash_fn
from conftest import mixed_params, random_grads
from reference import ReferenceDash

CONFIGS = {
    "default-eigh": dict(solver="eigh", inv_root_freq=1),
    "freq3-s4-momentum": dict(solver="eigh", inv_root_freq=3, start_prec_step=4, mu=0.5, nesterov=True, weight_decay=0.1, weight_decay_1d=0.05),
    "plain-momentum-adagrad": dict(solver="eigh", inv_root_freq=1, mu=0.3, nesterov=False, grafting="adagrad", beta_G=0.0, beta_LR=1.0),
    "shampoo-vectors-nobc": dict(solver="eigh", one_dim="shampoo", bias_correction=False, eigh_heuristic="abs_add", inv_root_freq=2),
    "relu-heuristic": dict(solver="eigh", inv_root_freq=1, eigh_heuristic="relu", eps=1e-6, start_prec_step=2),
}


def run_both(config, dtype, steps, lr=0.01):
    params = mixed_params(dtype)
    state = dash_fn.init(params, config)
    ref = ReferenceDash(mixed_params(torch.float64), config)
    ref_params = mixed_params(torch.float64)
    for t in range(1, steps + 1):
        grads = random_grads(params, t)
        params, state = dash_fn.step(params, grads, state, lr=lr)
        ref_params = ref.step(ref_params, random_grads(ref_params, t), lr)
    return params, ref_params


def max_relative_error(params, ref_params):
    errs = {}
    for k in ref_params:
        diff = (params[k].double() - ref_params[k]).norm()
        errs[k] = float(diff / ref_params[k].norm().clamp_min(1e-30))
    return errs


BLOCK_SIZES = pytest.mark.parametrize("block_size", [8, 24, 1024], ids=["B8-divides", "B24-ragged", "B1024-one-block"])


@BLOCK_SIZES
@pytest.mark.parametrize("name", list(CONFIGS))
def test_float64_matches_reference(name, block_size):
    """Every config in float64 within 1e-5 relative over 20 steps.

    Stale roots (inv_root_freq > 1) and rank-deficient factors put gradient mass on
    eigenvalues near eps = 1e-10, where the root (eps^{-1/4} = 316) amplifies eigh's
    rounding: there float64 agreement is ~1e-6, not 1e-15.
    """
    config = dash_fn.DashConfig(block_size=block_size, **CONFIGS[name])
    params, ref_params = run_both(config, torch.float64, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-5, errs


@BLOCK_SIZES
def test_float64_fresh_roots_match_reference_to_1e9(block_size):
    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", inv_root_freq=1)
    params, ref_params = run_both(config, torch.float64, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-9, errs


@pytest.mark.parametrize("block_size", [8, 24])
def test_float32_matches_reference(block_size):
    """float32 state and arithmetic within 1e-5 of the float64 reference.

    eps = 1e-4 keeps the factors' condition number where float32 eigh is accurate; with the
    default 1e-10 the float32 eigendecomposition itself differs by up to 1e-3 (measured) on
    these rank-deficient factors, for any implementation.
    """
    config = dash_fn.DashConfig(block_size=block_size, solver="eigh", eps=1e-4, inv_root_freq=1)
    params, ref_params = run_both(config, torch.float32, steps=20)
    errs = max_relative_error(params, ref_params)
    assert max(errs.values()) < 1e-5, errs


def test_update_is_not_trivial():
    """Guard against a vacuous agreement: 20 steps move every parameter measurably."""
    config = dash_fn.DashConfig(block_size=24, solver="eigh")
    params, _ = run_both(config, torch.float64, steps=20)
    start = mixed_params(torch.float64)
    for k in start:
        assert (params[k] - start[k]).norm() > 1e-3 * math.sqrt(start[k].numel()) * 0.01, k
