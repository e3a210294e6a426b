"""The eigenvalue-corrected preconditioner (docs/ALGORITHM.md 4 k, 5.7): SOAP's Adam in the
eigenbases of the stacked blocks' factors. Against the float64 per-block reference (eigh and
orthogonal-iteration bases, both schedules), against torch.optim.Adam before any basis, the basis
solvers' closed forms, one compiled graph without syncs, checkpoints and the non-finite guard.
DDP and FSDP2: the workers' "eigenvalue_corrected" scenarios."""

from __future__ import annotations

import math

import pytest
import torch

import dash_fn
from benchmarks.syncs import assert_one_graph_without_syncs
from conftest import mixed_params, random_grads
from dash_fn.roots.basis import eigenbasis, qr_basis
from reference import ReferenceDash, gram_schmidt_step

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

EC = "eigenvalue_corrected"
# every two-sided block of the mixed shapes at B = 8 has a full-rank factor by step 4 (its long
# side is under 4 x its short one), a vector segment's (one rank a step) by step 8: each basis
# is then unique up to signs, which the update does not see, so two implementations can agree
# to rounding (before, a factor's null space has no unique basis)
FULL_RANK_FROM = 4
CONFIGS = {
    "eigh-periodic": dict(solver="eigh", inv_root_freq=2, refresh_schedule="periodic"),
    "eigh-staggered-momentum": dict(solver="eigh", inv_root_freq=3, mu=0.5, nesterov_G=True),
    "qr-periodic-adagrad": dict(
        solver="qr", qr_steps=2, inv_root_freq=2, refresh_schedule="periodic", grafting="adagrad", beta_LR=1.0
    ),
    # B = 24: thin blocks (4 x 24, 3 x 24: a full factor on the short side only, the long side unrotated)
    "eigh-thin-blocks-B24": dict(solver="eigh", inv_root_freq=2, block_size=24),
    # every basis at the warm-up's steps (the gradient EMA of every block rotated), then slices
    "eigh-staggered-warmup": dict(solver="eigh", inv_root_freq=3, inv_root_warmup=3),
    "qr-staggered-vectors-nobc": dict(
        solver="qr", inv_root_freq=2, one_dim="shampoo", bias_correction=False, start_prec_step=8
    ),
}


def qr_reference_basis(steps: int):
    def basis(X, Q):
        for _ in range(steps):
            Q = gram_schmidt_step(X, Q)
        return Q

    return basis


def run_both(config: dash_fn.DashConfig, steps: int = 9, dtype=torch.float64):
    basis = qr_reference_basis(config.qr_steps) if config.solver == "qr" else None
    params, ref_params = mixed_params(dtype), mixed_params(torch.float64)
    state, ref = dash_fn.init(params, config), ReferenceDash(mixed_params(torch.float64), config, basis=basis)
    for t in range(1, steps + 1):
        params, state = dash_fn.step(
            params, random_grads(params, t), state, lr=0.01, refresh=dash_fn.is_refresh_step(config, t)
        )
        ref_params = ref.step(ref_params, random_grads(ref_params, t), 0.01)
    return params, ref_params


def update_errors(params, ref_params) -> dict[str, float]:
    start = mixed_params(torch.float64)
    return {
        k: float((params[k].double() - ref_params[k]).norm() / (ref_params[k] - start[k]).norm().clamp_min(1e-30))
        for k in ref_params
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_float64_matches_the_soap_reference(name):
    config = dash_fn.DashConfig(
        preconditioner=EC, **{"block_size": 8, "start_prec_step": FULL_RANK_FROM, **CONFIGS[name]}
    )
    params, ref_params = run_both(config, steps=config.start_prec_step + 6)
    errors = update_errors(params, ref_params)
    assert max(errors.values()) < 1e-10, errors


def test_the_reference_tells_the_bases_apart_from_roots_and_from_adam():
    """The agreement above is not vacuous: with the bases in place the update differs from
    Shampoo's and from Adam's (no basis: start_prec_step past the run)."""
    base = dict(block_size=8, solver="eigh", inv_root_freq=2, refresh_schedule="periodic", start_prec_step=4)
    corrected = run_both(dash_fn.DashConfig(preconditioner=EC, **base))[0]
    for other in (dash_fn.DashConfig(**base), dash_fn.DashConfig(preconditioner=EC, **{**base, "start_prec_step": 99})):
        assert max(update_errors(corrected, run_both(other)[1]).values()) > 1e-2


def test_float32_stays_near_the_float64_reference():
    config = dash_fn.DashConfig(block_size=8, preconditioner=EC, start_prec_step=FULL_RANK_FROM, solver="eigh")
    errors = update_errors(*run_both(config, dtype=torch.float32))
    assert max(errors.values()) < 1e-3, errors


def test_without_a_basis_it_is_adam():
    """Before a block's first basis its Fbar is I: the step is torch.optim.Adam's on every
    matrix (betas beta_G, beta_graft; eps eps_graft), to rounding."""
    config = dash_fn.DashConfig(
        block_size=16, preconditioner=EC, start_prec_step=math.inf, beta_graft=0.99, nesterov_G=False
    )
    params = mixed_params(torch.float64, shapes={"w": (40, 24), "conv": (3, 5, 2, 2)})
    state = dash_fn.init(params, config)
    torch_params = {k: v.clone().requires_grad_() for k, v in params.items()}
    adam = torch.optim.Adam(torch_params.values(), lr=0.01, betas=(0.9, 0.99), eps=1e-8)
    for t in range(1, 6):
        grads = random_grads(params, t)
        params, state = dash_fn.step(params, grads, state, lr=0.01)
        for k, x in torch_params.items():
            x.grad = grads[k].clone()
        adam.step()
    for k in params:
        assert torch.allclose(params[k], torch_params[k].detach(), rtol=0, atol=1e-13), k


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bases_diagonalize_by_decreasing_eigenvalue_wherever_a_block_sits(dtype):
    """eigenbasis: orthogonal, Q^T X Q diagonal with a decreasing diagonal, each block the same
    bits in stacks of different lengths (b = 5: not a whole 64-byte row); qr_basis: from an
    exact eigenbasis, a fixed point up to column signs, and from I it converges to one."""
    gen = torch.Generator().manual_seed(0)
    Y = torch.randn(6, 5, 9, generator=gen, dtype=torch.float64)
    X = (Y @ Y.mT + torch.diag_embed(torch.linspace(0.5, 3.0, 5, dtype=torch.float64))).to(dtype)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    Q = eigenbasis(X)
    eye = torch.eye(5, dtype=dtype)
    assert torch.allclose(Q.mT @ Q, eye.expand(6, 5, 5), atol=tolerance)
    M = Q.mT @ X @ Q
    d = torch.diagonal(M, dim1=-2, dim2=-1)
    assert torch.allclose(M, torch.diag_embed(d), atol=tolerance * float(d.max()))
    assert bool((d[:, :-1] >= d[:, 1:]).all())
    for start in range(6):
        assert torch.equal(eigenbasis(X[start:])[0], Q[start])
    assert torch.allclose(qr_basis(X, Q, 1).abs(), Q.abs(), atol=10 * tolerance)
    if dtype == torch.float64:
        converged = qr_basis(X, eye.expand(6, 5, 5).contiguous(), 400)
        assert torch.allclose(converged.abs(), Q.abs(), atol=1e-8)


def test_options_it_does_not_take_are_refused():
    with pytest.raises(ValueError, match=r"'eigenvalue_corrected' takes solver \('eigh', 'qr', 'auto'\), not 'ndb'"):
        dash_fn.DashConfig(preconditioner=EC, solver="ndb")
    with pytest.raises(ValueError, match="no grafting"):
        dash_fn.DashConfig(preconditioner=EC, grafting="spectral")
    with pytest.raises(ValueError, match="not 'qr' \\(which serves preconditioner 'eigenvalue_corrected'\\)"):
        dash_fn.DashConfig(solver="qr")
    with pytest.raises(ValueError, match="preconditioner"):
        dash_fn.DashConfig(preconditioner="soap")
    with pytest.raises(ValueError, match="qr_steps"):
        dash_fn.DashConfig(preconditioner=EC, qr_steps=0)
    with pytest.raises(ValueError, match="computes roots"):
        dash_fn.inverse_root(torch.eye(4)[None], 4, dash_fn.DashConfig(preconditioner=EC))


@pytest.mark.sets_accelerator
def test_one_compiled_graph_without_syncs():
    """Staggered with qr bases ("auto" under the accelerator strategy) and momentum: one graph
    over three periods, no node reading the device, nothing CUDA graphs would skip; eager
    steps make no sync; compiled and eager agree."""
    config = dash_fn.DashConfig(block_size=8, preconditioner=EC, inv_root_freq=3, mu=0.5, nesterov_G=True)
    assert_one_graph_without_syncs(
        config, mixed_params(shapes={"w": (24, 20), "thin": (2, 40), "b": (20,)}), random_grads
    )


def test_due_block_rows_hold_every_block_of_their_phase():
    """The staggered schedule's due-block rows (dash_fn.schedule.due_block_tables): row j of a
    group holds every block of phase j (read from the factor stacks' own phase tables), then
    other blocks, all distinct, as many as the largest phase has; a period longer than the
    blocks keeps a row per block number."""
    for period in (3, 10**9):
        config = dash_fn.DashConfig(block_size=8, preconditioner=EC, inv_root_freq=period)
        state = dash_fn.init(mixed_params(), config)
        plan = state["plan"]
        blocks = sum(group.count for group in plan.groups)  # numbered 0 to blocks - 1
        for g, group in enumerate(plan.groups):
            table = state["due_blocks", str(g)]
            side = group.factor_sides[0]
            phase = state["schedule", str(side.stack), "phase"][side.offset : side.offset + group.count]
            assert table.shape[0] == min(period, blocks), g
            width = max(int((phase == j).sum()) for j in range(table.shape[0]))
            assert table.shape[1] == width, g
            for j, row in enumerate(table.tolist()):
                own = (phase == j).nonzero().flatten().tolist()
                assert row[: len(own)] == own and len(set(row)) == len(row), (g, j)
    assert "due_blocks" not in dash_fn.init(mixed_params(), config.replace(beta_G=0.0)).keys()  # no EMA to move


@pytest.mark.parametrize("solver", ["eigh", "qr"])
def test_a_checkpoint_resumes_bit_exact(solver, tmp_path):
    config = dash_fn.DashConfig(block_size=8, preconditioner=EC, solver=solver, inv_root_freq=3, mu=0.5)

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


def test_a_nonfinite_step_changes_nothing():
    """A NaN gradient at the 4th call leaves parameters, bases and moments as they were: the
    run equals, bitwise, one that never saw that call's gradients."""
    config = dash_fn.DashConfig(block_size=8, preconditioner=EC, solver="eigh", inv_root_freq=2)
    gradients = [random_grads(mixed_params(), t) for t in range(1, 8)]
    poisoned = {k: v.clone() for k, v in gradients[3].items()}
    poisoned["rect"][3, 4] = math.nan

    def run(sequence):
        params, state = mixed_params(), dash_fn.init(mixed_params(), config)
        for grads in sequence:
            params, state = dash_fn.step(params, grads, state, lr=0.01)
        return params, state

    skipped, skipped_state = run([*gradients[:3], poisoned, *gradients[4:]])
    clean, clean_state = run([*gradients[:3], *gradients[4:]])
    assert int(skipped_state["skipped"]) == 1 and int(skipped_state["step"]) == 6
    for k in clean:
        assert torch.equal(skipped[k], clean[k]), k
    for k, x in clean_state.exclude("config", "plan", "shard", "skipped").items(True, True):
        assert torch.equal(skipped_state[k], x), k


def test_a_stack_lapack_cannot_decompose_is_decomposed_in_float64(monkeypatch):
    """The CPU eigenbasis retries in float64 where LAPACK reports no convergence (as MKL's
    ssyevd did on a factor with many zero rows): the refresh never ends a run."""
    calls = []
    eigh = torch.linalg.eigh

    def failing_in_float32(X, *args, **kwargs):
        calls.append(X.dtype)
        if X.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigh(X, *args, **kwargs)

    Y = torch.randn(3, 16, 40, generator=torch.Generator().manual_seed(0))
    Y[:, 5:] = 0  # an embedding's factor: rows of tokens never seen
    X = Y @ Y.mT
    want = eigenbasis(X.double()).float()
    monkeypatch.setattr(torch.linalg, "eigh", failing_in_float32)
    Q = eigenbasis(X, cpu_ops=True)
    assert calls.count(torch.float32) == calls.count(torch.float64) >= 1  # each part (thread) retried
    assert torch.allclose(Q[:, :, :5].abs(), want[:, :, :5].abs(), atol=1e-5)  # the nonzero eigenvalues' vectors
    assert torch.allclose(Q.mT @ Q, torch.eye(16).expand(3, 16, 16), atol=1e-5)


@pytest.mark.parametrize("solver", ["eigh", "qr"])
def test_compiled_on_the_cpu_matches_eager(solver):
    """The step traced on the CPU (its eigh as the opaque CPU op) gives eager's updates."""
    config = dash_fn.DashConfig(block_size=8, preconditioner=EC, solver=solver, inv_root_freq=2, mu=0.5)
    compiled_step = torch.compile(dash_fn.step, fullgraph=True, backend="aot_eager")
    runs = []
    for step in (dash_fn.step, compiled_step):
        params, state = mixed_params(), dash_fn.init(mixed_params(), config)
        for t in range(1, 7):
            params, state = step(params, random_grads(params, t), state, lr=torch.tensor(1e-2))
        runs.append(params)
    for k in runs[0]:
        assert torch.allclose(runs[1][k], runs[0][k], rtol=1e-5, atol=1e-6), k


def test_the_cpu_eigenvector_op_keeps_the_layout_it_promises_the_compiler():
    """torch.library.opcheck: the fake op's shape, dtype and strides are the real op's (LAPACK
    returns column-major eigenvectors; Inductor asserts the promised row-major strides)."""
    X = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.library.opcheck(torch.ops.dash_fn.cpu_eigenvectors.default, (X @ X.mT,))
