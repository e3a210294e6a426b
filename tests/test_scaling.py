"""Matrix scaling (docs/ALGORITHM.md 6, oracle 8): fro, pi, pim and their start vectors.

Oracles are float64 closed forms and torch.linalg.eigh in float64, never numbers from the code
under test.
"""

import math

import pytest
import torch

from dash_fn import DashConfig
from dash_fn.roots.scaling import SCALE_FLOOR, matrix_scale, rayleigh_estimates
from dash_fn.utils import start_vectors

f64 = torch.float64


def spd_stack(K, b, cond, dtype=f64, seed=0):
    """K random SPD blocks, eigenvalues log-spaced from 1 down to 1/cond."""
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(K, b, b, generator=gen, dtype=f64))
    lam = torch.logspace(0, -math.log10(cond), b, dtype=f64)
    return ((Q * lam) @ Q.mT).to(dtype)


def wishart_stack(K, b, n, dtype=f64, seed=0):
    """K factors G G^T / n with G (b, n) Gaussian: rank min(b, n), spectra as gradients give them."""
    gen = torch.Generator().manual_seed(seed)
    G = torch.randn(K, b, n, generator=gen, dtype=f64)
    return (G @ G.mT / n).to(dtype)


STACKS = {
    "cond1e1": lambda dtype: spd_stack(4, 24, 1e1, dtype),
    "cond1e6": lambda dtype: spd_stack(4, 24, 1e6, dtype, seed=1),
    "wishart-rank5": lambda dtype: wishart_stack(4, 24, 5, dtype, seed=2),
    "wishart-full": lambda dtype: wishart_stack(4, 24, 100, dtype, seed=3),
}


@pytest.mark.parametrize("dtype", [f64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("scaling", ["pi", "pim"])
def test_power_iteration_never_exceeds_lambda_max(scaling, stack, dtype):
    """Every per-vector estimate (before the constant) is a Rayleigh quotient of Xd = X + 1e-6 I:
    at most lambda_max(X) + 1e-6 (up to rounding), and pim picks the largest candidate."""
    config = DashConfig(scaling=scaling)
    X = STACKS[stack](dtype)
    V0 = start_vectors(X.shape[-1], config, dtype)
    estimates = rayleigh_estimates(X, V0, config.pi_steps, config.eps_power_iter).double()
    lam_max = torch.linalg.eigvalsh(X.double())[:, -1:] + config.eps_power_iter
    rounding = 1e-12 if dtype == f64 else 1e-6
    assert (estimates <= lam_max * (1 + rounding)).all()
    s = matrix_scale(X, config, V0).double().reshape(-1, 1)
    torch.testing.assert_close(s, config.scaling_const * estimates.amax(dim=-1, keepdim=True), rtol=1e-6, atol=0)
    assert (s >= config.scaling_const * estimates - 1e-12).all()


def test_power_iteration_finds_lambda_max_with_a_gap():
    """With a spectral gap of 10x, 10 steps from generic vectors converge to lambda_max."""
    lam = torch.tensor([3.0, 0.3] + [0.1] * 14, dtype=f64)
    gen = torch.Generator().manual_seed(5)
    Q, _ = torch.linalg.qr(torch.randn(16, 16, generator=gen, dtype=f64))
    X = ((Q * lam) @ Q.T)[None]
    for scaling in ("pi", "pim"):
        config = DashConfig(scaling=scaling, eps_power_iter=0.0)
        s = matrix_scale(X, config, start_vectors(16, config, f64))
        torch.testing.assert_close(s.reshape(()), torch.tensor(2 * 3.0, dtype=f64), rtol=1e-6, atol=0)


def test_fro_is_the_frobenius_norm_without_constant():
    X = spd_stack(3, 16, 1e3)
    s = matrix_scale(X, DashConfig(scaling="fro"), None)
    expected = torch.sqrt((X**2).sum(dim=(-2, -1)))
    torch.testing.assert_close(s.reshape(-1), expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("scaling", ["fro", "pi", "pim"])
@pytest.mark.parametrize("factor", [1e-20, 1e20])
def test_scales_are_finite_and_proportional_at_extreme_magnitudes(scaling, factor):
    """float32 blocks times 1e-20 or 1e20: squares would underflow or overflow, the scale does not.

    fro is homogeneous: s(cX) = c s(X). pi/pim add the absolute damping 1e-6 to Xd, so at 1e-20
    they see a zero block (s = 2e-6, the damping's closed form); at 1e20 they are homogeneous.
    """
    config = DashConfig(scaling=scaling)
    X = spd_stack(3, 16, 1e2, torch.float32)
    V0 = start_vectors(16, config)
    base = matrix_scale(X, config, V0).double()
    scaled = matrix_scale(X * factor, config, V0).double()
    assert torch.isfinite(scaled).all() and (scaled > 0).all()
    if scaling != "fro" and factor < 1:
        torch.testing.assert_close(scaled, torch.full_like(scaled, 2e-6), rtol=1e-5, atol=0)
    else:
        torch.testing.assert_close(scaled / factor, base, rtol=1e-5, atol=0)


@pytest.mark.parametrize("eps", [0.0, 1e-10])
@pytest.mark.parametrize("scaling", ["pi", "pim"])
def test_zero_block_power_iteration_gives_the_damping(scaling, eps):
    """docs/ALGORITHM.md 6: a zero block gives lambda_hat = eps + 1e-6, s = 2 (eps + 1e-6)."""
    config = DashConfig(scaling=scaling, eps=eps)
    Xr = torch.zeros(2, 8, 8) + eps * torch.eye(8)
    s = matrix_scale(Xr, config, start_vectors(8, config))
    torch.testing.assert_close(s, torch.full_like(s, 2 * (eps + 1e-6)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("scaling", ["fro", "pi", "pim"])
def test_zero_block_without_damping_hits_the_floor(scaling):
    config = DashConfig(scaling=scaling, eps_power_iter=0.0)
    s = matrix_scale(torch.zeros(2, 8, 8), config, start_vectors(8, config))
    assert torch.equal(s, torch.full_like(s, SCALE_FLOOR))


def test_start_vectors_are_deterministic_unit_columns():
    pim, pi = DashConfig(scaling="pim"), DashConfig(scaling="pi")
    V = start_vectors(32, pim, f64)
    assert V.shape == (32, 16) and start_vectors(32, pi).shape == (32, 1)
    assert torch.equal(V, start_vectors(32, pim, f64))
    torch.testing.assert_close(V.norm(dim=0), torch.ones(16, dtype=f64), rtol=1e-14, atol=0)
    assert not torch.equal(start_vectors(32, pim.replace(scaling_seed=1), f64), V)
    assert not torch.equal(start_vectors(33, pim, f64)[:32], V)


@pytest.mark.parametrize("scaling", ["fro", "pi", "pim"])
def test_scaling_is_bitwise_repeatable_per_block_and_leaves_the_global_rng_alone(scaling):
    """Oracle 8: runs are bit-identical, a block's scale does not depend on its stack companions,
    and no global random numbers are drawn."""
    config = DashConfig(scaling=scaling)
    X = wishart_stack(6, 20, 7, torch.float32)
    V0 = start_vectors(20, config)
    rng = torch.get_rng_state()
    s = matrix_scale(X, config, V0)
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(s, matrix_scale(X, config, V0))
    for k in range(6):
        assert torch.equal(matrix_scale(X[k : k + 1], config, V0), s[k : k + 1])


def test_scaling_dtype_float64_for_float32_blocks():
    """scaling_dtype is the minimum precision of the scale; the result has the block's dtype."""
    X = spd_stack(3, 16, 1e4, torch.float32)
    config = DashConfig(scaling="pim", scaling_dtype="float64")
    s = matrix_scale(X, config, start_vectors(16, config))
    assert s.dtype == torch.float32
    expected = matrix_scale(X.double(), config, start_vectors(16, config, f64))
    torch.testing.assert_close(s.double(), expected, rtol=1e-7, atol=0)


def test_scaling_dtype_float64_is_the_float64_computation_bitwise():
    """float64 scaling of float32 blocks = the float64 computation on the same inputs, rounded
    once at the end; and it differs from the float32 path (so the option is not ignored)."""
    X = spd_stack(4, 16, 1e4, torch.float32)
    for scaling in ("pi", "pim", "fro"):
        wide, narrow = DashConfig(scaling=scaling, scaling_dtype="float64"), DashConfig(scaling=scaling)
        V0 = start_vectors(16, wide)  # float32, as the step stores them
        s = matrix_scale(X, wide, V0)
        assert torch.equal(s, matrix_scale(X.double(), narrow, V0.double()).float()), scaling
        if scaling != "fro":  # 10 power iterations round differently in float32 (one norm may not)
            assert not torch.equal(s, matrix_scale(X, narrow, V0)), scaling


def test_power_iteration_needs_start_vectors():
    with pytest.raises(ValueError, match="start vectors"):
        matrix_scale(torch.eye(4)[None], DashConfig(scaling="pim"), None)
