"""Thin blocks (docs/ALGORITHM.md 2.5): a block whose long side is at least ``thin_ratio`` times
its short side keeps a full factor on its short side only (root order 4); its long side is
scaled by the fourth root of a diagonal factor, the grafting moment's sums along the short side."""

from __future__ import annotations

import math

import pytest
import torch

import dash_fn
from conftest import random_grads
from dash_fn.plan import make_plan
from reference import ReferenceDash

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

SHAPES = {"tall": (96, 6), "wide": (5, 96), "square": (24, 24), "bias": (5,)}  # factors of sizes 6, 5 and 24


def start() -> dict:
    gen = torch.Generator().manual_seed(3)
    return {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in SHAPES.items()}


def groups(shape, block_size=256, thin_ratio=4.0):
    plan = make_plan([("w", shape, torch.float32)], block_size, "adamw", None, thin_ratio)
    return [(g.rows, g.cols, g.sides, g.count, g.order) for g in plan.groups]


def test_the_short_side_alone_gets_a_full_factor():
    assert groups((32000, 64)) == [(256, 64, "tall", 125, 4)]  # an embedding
    assert groups((64, 4096)) == [(64, 256, "wide", 16, 4)]  # a thin projection
    assert groups((256, 65)) == [(256, 65, "both", 1, 4)]  # just under the ratio
    assert groups((32000, 64), thin_ratio=math.inf) == [(256, 64, "both", 125, 4)]
    plan = make_plan([("w", (32000, 64), torch.float32)], 256, "adamw", None, 4.0)
    assert plan.groups[0].left is None and plan.groups[0].right is not None


def test_an_embedding_holds_ten_bytes_per_entry():
    """nn.Embedding(32000, 64), block 256: per 256 x 64 block, A and Gt (256 * 64 each) and
    one 64 x 64 factor with its root, (2 * 16384 + 2 * 4096) float32 for 16384 entries (10 B
    each), and one int64 fallback counter; two int64 step counters in all."""
    config = dash_fn.DashConfig(solver="eigh", thin_ratio=4)
    state = dash_fn.init({"w": torch.empty(32000, 64, device="meta")}, config)
    nbytes = sum(
        x.numel() * x.element_size()
        for key, x in state.items(include_nested=True, leaves_only=True)
        if isinstance(x, torch.Tensor) and key[0] not in dash_fn.state.CONSTANTS
    )
    assert nbytes == 125 * ((2 * 16384 + 2 * 4096) * 4 + 8) + 2 * 8
    assert nbytes / (32000 * 64) < 10.001


@pytest.mark.parametrize("schedule", ["periodic", "staggered"])
def test_matches_the_reference_with_thin_blocks(schedule):
    """10 steps on float64 parameters with tall (full right factor, diagonal rows) and wide
    (full left factor, diagonal columns) thin blocks agree to 1e-10 with the float64
    reference; the two-sided reference disagrees."""
    config = dash_fn.DashConfig(
        block_size=24, solver="eigh", inv_root_freq=3, eps=1e-3, refresh_schedule=schedule, thin_ratio=4
    )
    params, state = start(), dash_fn.init(start(), config)
    assert {g.sides for g in state["plan"].groups} == {"tall", "wide", "both"}
    ref, ref_params = ReferenceDash(start(), config), start()
    two_sided = ReferenceDash(start(), config.replace(thin_ratio=math.inf))
    two_sided_params = start()
    for t in range(1, 11):
        grads = random_grads(params, t)
        params, state = dash_fn.step(params, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
        ref_params = ref.step(ref_params, grads, 1e-2)
        two_sided_params = two_sided.step(two_sided_params, grads, 1e-2)
    for k in ("tall", "wide"):
        moved = (ref_params[k] - start()[k]).norm()
        assert (params[k] - ref_params[k]).norm() / moved < 1e-10, k
        assert (params[k] - two_sided_params[k]).norm() / moved > 1e-3, k


def test_the_diagonal_is_the_diagonal_of_the_two_sided_factor():
    """With the grafting moment's decay equal to the factors' (the default: beta_graft = beta_LR
    = 0.95), a tall block's diagonal (A summed over each row) is diag(L) of the two-sided
    factor L = EMA(G G^T), computed here from the gradients in float64."""
    config = dash_fn.DashConfig(block_size=24, solver="eigh", thin_ratio=4)
    params = {"tall": start()["tall"]}
    state = dash_fn.init(params, config)
    L = torch.zeros(24, 24, dtype=torch.float64)
    for t in range(1, 6):
        grads = random_grads(params, t)
        params, state = dash_fn.step(params, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
        G = grads["tall"][:24]  # the first 24 x 6 block
        L = config.beta_LR * L + (1 - config.beta_LR) * G @ G.T
    (group,) = state["plan"].groups
    assert group.diagonal_dim == -1
    d = state["groups", "0", "A"][0].sum(-1)
    assert torch.allclose(d, L.diagonal(), rtol=1e-12, atol=0)


@pytest.mark.parametrize("eps", [0.0, 1e-10])
def test_rows_without_gradients_stay_put(eps):
    """An embedding whose gradient rows are zero but for a few tokens: the other rows get an
    exactly zero update (their diagonal is 0: no division by it), and nothing is NaN, eps 0 too."""
    config = dash_fn.DashConfig(block_size=32, solver="eigh", thin_ratio=4, eps=eps)
    params = {"emb": torch.randn(64, 8, dtype=torch.float64)}
    state = dash_fn.init(params, config)
    before = params["emb"].clone()
    for t in range(1, 5):
        grad = torch.zeros(64, 8, dtype=torch.float64)
        grad[[3, 40]] = torch.randn(2, 8, dtype=torch.float64)
        params, state = dash_fn.step(params, {"emb": grad}, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
    moved = (params["emb"] - before).abs().sum(-1) > 0
    assert torch.isfinite(params["emb"]).all()
    assert moved.nonzero().flatten().tolist() == [3, 40]
