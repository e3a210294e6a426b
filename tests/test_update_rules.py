"""The step-size, damping, momentum and exponent options (docs/ALGORITHM.md 4 e, 4 g, 5.6):
closed forms, their errors, and the accelerator strategy, one compiled graph and checkpoints
with all of them on. Their agreement with the float64 per-block reference is in
tests/test_reference_agreement.py and tests/test_staggered.py; DDP and FSDP2 in the workers'
"update_rules" scenarios."""

from __future__ import annotations

import math

import pytest
import torch

import dash_fn
from benchmarks.syncs import assert_one_graph_without_syncs
from conftest import mixed_params, random_grads
from dash_fn.roots import resolve_solver, solve, start_vectors
from dash_fn.roots.scaling import spectral_norm_estimate
from dash_fn.strategy import ACCELERATOR, CPU, simulated_accelerator

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

# every option on, at a power-of-two order so that NDB serves it (the preset's test covers CN)
ALL_OPTIONS = dict(grafting="rms", graft_rms=0.25, nesterov_G=True, eps_rel=1e-4, root_order=2)


def blocks_of(update: torch.Tensor, size: int) -> list[torch.Tensor]:
    rows, cols = update.shape
    return [update[r : r + size, c : c + size] for r in range(0, rows, size) for c in range(0, cols, size)]


def block_updates(config: dash_fn.DashConfig, lr: float):
    """``(t, block)`` of each 8 x 8 (or edge) block's update of a (20, 13) matrix over 5 steps,
    its gradients' scale changing tenfold from step to step (1e-2 .. 1e2)."""
    params = {"w": torch.randn(20, 13, dtype=torch.float64, generator=torch.Generator().manual_seed(0))}
    state = dash_fn.init(params, config)
    for t in range(1, 6):
        grads = {"w": random_grads(params, t)["w"] * 10.0 ** (t - 3)}
        new, state = dash_fn.step(params, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))
        for block in blocks_of(new["w"] - params["w"], config.block_size):
            yield t, block
        params = new


@pytest.mark.parametrize("schedule", ["periodic", "staggered"])
def test_rms_grafting_gives_every_block_the_same_rms_before_and_after_its_roots(schedule):
    """grafting="rms" (mu = wd = 0): each block moves by lr graft_rms sqrt(rows cols) in
    Frobenius norm, whether it takes the Adam direction (before its first root, staggered) or
    Shampoo's, whatever its gradient's scale."""
    config = dash_fn.DashConfig(
        block_size=8, solver="eigh", grafting="rms", graft_rms=0.3, inv_root_freq=3, refresh_schedule=schedule
    )
    for t, block in block_updates(config, lr=0.01):
        expected = 0.01 * 0.3 * math.sqrt(block.numel())
        assert float(block.norm()) == pytest.approx(expected, rel=1e-12), t


@pytest.mark.parametrize("schedule", ["periodic", "staggered"])
def test_spectral_grafting_gives_every_block_muons_spectral_norm(schedule):
    """grafting="spectral" (mu = wd = 0): each block's update has spectral norm
    lr graft_rms sqrt(max(rows, cols)), up to the power iteration's estimate (which never
    exceeds sigma_max, so the norm is never below it), before and after its roots."""
    config = dash_fn.DashConfig(
        block_size=8, solver="eigh", grafting="spectral", inv_root_freq=3, refresh_schedule=schedule
    )
    for t, block in block_updates(config, lr=0.01):
        target = 0.01 * 0.2 * math.sqrt(max(block.shape))
        assert target * (1 - 1e-12) <= float(torch.linalg.matrix_norm(block, ord=2)) < 1.05 * target, t


def test_spectral_norm_estimate_converges_and_never_overshoots():
    """On blocks of known singular values (sigma_2 / sigma_1 = 0.5), the estimate is sigma_1
    to (1/4)^8; on nearly equal ones it stays within them; a zero block gives 0."""
    gen = torch.Generator().manual_seed(3)
    U = torch.linalg.qr(torch.randn(4, 12, 12, dtype=torch.float64, generator=gen))[0][..., :7]
    V = torch.linalg.qr(torch.randn(4, 7, 7, dtype=torch.float64, generator=gen))[0]
    spread = torch.tensor([3.0, 1.5, 1.0, 0.5, 0.2, 0.1, 0.0], dtype=torch.float64)
    close = torch.tensor([3.0, 2.99, 2.98, 1.0, 0.5, 0.1, 0.0], dtype=torch.float64)
    X = torch.stack([U[0] * spread @ V[0].T, U[1] * close @ V[1].T, 1e30 * U[2] * spread @ V[2].T, 0 * U[3]])
    got = spectral_norm_estimate(X).flatten()
    assert abs(float(got[0]) - 3.0) < 3.0 * 1e-4 and float(got[0]) <= 3.0
    assert 2.98 <= float(got[1]) <= 3.0
    assert abs(float(got[2]) / 3e30 - 1) < 1e-4  # no overflow
    assert float(got[3]) == 0.0


@pytest.mark.parametrize("strategy", [CPU, ACCELERATOR], ids=["cpu-op", "device-form"])
def test_eigh_relative_floor_is_a_pseudo_inverse_root(strategy):
    """eps_rel > 0: eigenvalues at or below eps_rel lambda_max map to 0, the others to
    lambda^(-1/p) (closed form on a rotated diagonal, in either form of eigh)."""
    Q = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))[0]
    lam = torch.tensor([4.0, 1.0, 2e-3, 1.1e-3, 8e-4, 1e-6, 0.0, 0.0], dtype=torch.float64)
    X = (Q * lam) @ Q.T
    config = dash_fn.DashConfig(solver="eigh", eps=0.0, eps_rel=3e-4)  # floor 1.2e-3
    expected_scale = torch.tensor([4.0**-0.25, 1.0, 2e-3**-0.25, 0, 0, 0, 0, 0], dtype=torch.float64)
    got = solve("eigh", torch.stack([X, 2 * X]), 4, config, None, strategy)
    assert torch.allclose(got[0], (Q * expected_scale) @ Q.T, atol=1e-9)
    assert torch.allclose(got[1], (Q * expected_scale * 2**-0.25) @ Q.T, atol=1e-9)  # relative: scales along


@pytest.mark.parametrize("solver", ["ndb", "cn"])
def test_newton_relative_damping_uses_the_power_iterations_estimate(solver):
    """Under pim the shift is eps_rel lambda_hat with lambda_hat = s / scaling_const, the power
    iteration's lambda_max (converged here, 200 steps): the root of X + eps_rel lambda_max I."""
    Q = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2)))[0]
    lam = torch.tensor([3.0, 1.0, 0.5, 1e-4, 0.0, 0.0], dtype=torch.float64)
    X = ((Q * lam) @ Q.T)[None]
    config = dash_fn.DashConfig(
        solver=solver,
        root_order=4,
        eps=0.0,
        eps_rel=1e-2,
        eps_power_iter=0.0,
        pi_steps=200,
        newton_steps=60,
        scaling="pim",
    )
    got = dash_fn.inverse_root(X, 4, config, start=start_vectors(6, config, torch.float64))
    expected = (Q * (lam + 1e-2 * 3.0) ** -0.25) @ Q.T
    assert torch.allclose(got[0], expected, atol=1e-9)


def test_options_the_solver_cannot_serve_are_refused():
    with pytest.raises(ValueError, match="power-of-two order"):
        dash_fn.DashConfig(solver="ndb", root_order=3)
    # Chebyshev's own shift cheb_eps s floors the spectrum up to cheb_eps, the boundary included
    for eps_rel in (0.0, 1e-5, 1e-3):
        dash_fn.DashConfig(solver="chebyshev", eps_rel=eps_rel, cheb_eps=1e-3)
    with pytest.raises(ValueError, match="cheb_eps"):
        dash_fn.DashConfig(solver="chebyshev", eps_rel=2e-3, cheb_eps=1e-3)
    # the eigenvalue-corrected mode computes no roots: the root options do not apply either way
    for changed in ({}, {"root_order": 4, "eps_rel": 0.0}):
        dash_fn.DashConfig(preconditioner="eigenvalue_corrected", **changed)
    with pytest.raises(ValueError, match="eps_rel"):
        dash_fn.DashConfig(eps_rel=1.0)
    with pytest.raises(ValueError, match="graft_rms"):
        dash_fn.DashConfig(graft_rms=0.0)
    with pytest.raises(ValueError, match="root_order"):
        dash_fn.DashConfig(root_order=0)


def test_the_look_ahead_of_no_ema_is_the_gradient_itself():
    """With beta_G = 0 there is no EMA: Nesterov's beta Gt + (1 - beta) G is G, bit for bit."""
    params = mixed_params()
    runs = []
    for nesterov_G in (True, False):
        config = dash_fn.DashConfig(block_size=8, beta_G=0.0, nesterov_G=nesterov_G, inv_root_freq=2)
        p, state = dict(params), dash_fn.init(params, config)
        for t in range(1, 5):
            p, state = dash_fn.step(p, random_grads(params, t), state, lr=1e-2)
        runs.append(p)
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in params)
    assert not any(torch.equal(runs[0][k], params[k]) for k in params)


@pytest.mark.parametrize("order, solver", [(1, "cn"), (2, "ndb"), (3, "cn"), (4, "ndb"), (6, "cn"), (8, "ndb")])
def test_auto_takes_coupled_newton_where_ndb_cannot_serve_the_order(order, solver):
    """Off the CPU "auto" is NDB for powers of two and coupled Newton otherwise, so that every
    root order runs on an accelerator without a sync; on the CPU it stays eigh."""
    config = dash_fn.DashConfig(root_order=order)
    assert resolve_solver(config, ACCELERATOR) == solver and resolve_solver(config, CPU) == "eigh"
    with simulated_accelerator():
        dash_fn.init(mixed_params(), config)  # the resolved solver serves the order: no refusal


@pytest.mark.sets_accelerator
@pytest.mark.parametrize("grafting", ["rms", "spectral"])
def test_all_options_compile_to_one_graph_without_syncs(grafting):
    """Staggered, every option on, NDB: one graph over three periods, no node reading the
    device, nothing CUDA graphs would skip; and eager steps make no sync."""
    options = {**ALL_OPTIONS, "grafting": grafting}
    config = dash_fn.DashConfig(block_size=8, solver="ndb", inv_root_freq=3, newton_steps=4, mu=0.5, **options)
    assert_one_graph_without_syncs(
        config, mixed_params(shapes={"w": (24, 20), "thin": (2, 40), "b": (20,)}), random_grads
    )


@pytest.mark.sets_accelerator
def test_the_tuned_preset_compiles_to_one_graph_without_syncs():
    """DashConfig.tuned() as an accelerator runs it ("auto": coupled Newton for its cube roots)."""
    config = dash_fn.DashConfig.tuned(block_size=8, newton_steps=4)
    assert_one_graph_without_syncs(
        config, mixed_params(shapes={"w": (24, 20), "thin": (2, 40), "b": (20,)}), random_grads
    )


@pytest.mark.parametrize("solver", ["eigh", "ndb"])
def test_a_checkpoint_with_all_options_resumes_bit_exact(solver, tmp_path):
    changes = {"eigh": dict(root_order=3, grafting="spectral"), "ndb": {}}[solver]
    config = dash_fn.DashConfig(block_size=8, solver=solver, inv_root_freq=3, **{**ALL_OPTIONS, **changes})

    def run(params, state, steps):
        for t in steps:
            params, state = dash_fn.step(params, random_grads(params, t), state, lr=0.01)
        return params, state

    whole, _ = run(mixed_params(), dash_fn.init(mixed_params(), config), range(1, 8))
    params, state = run(mixed_params(), dash_fn.init(mixed_params(), config), range(1, 5))
    dash_fn.save_state(tmp_path / "state.pt", state)
    params, _ = run(params, dash_fn.load_state(tmp_path / "state.pt", params=params, config=config), range(5, 8))
    for k in whole:
        assert torch.equal(params[k], whole[k]), k
