"""Blocking and stacking (docs/ALGORITHM.md 2-3, oracle 9)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_fn.plan import ADAMW, MATRIX, SEGMENTS, gather, make_plan, scatter_param

LLAMA_953M = [(6144, 2048), (2048, 2048), (5632, 2048), (5632, 2048), (2048, 5632)] * 16 + [(32000, 2048)] * 2


def plan_for(shapes, block_size, one_dim="adamw"):
    return make_plan([(str(i), tuple(s), torch.float32) for i, s in enumerate(shapes)], block_size, one_dim)


def round_trip(shapes, block_size, one_dim="adamw"):
    plan = plan_for(shapes, block_size, one_dim)
    tensors = [torch.randn(s) for s in shapes]
    stacks = gather(plan, tensors, torch.float32)
    for p, x in zip(plan.params, tensors):
        if p.kind in (MATRIX, SEGMENTS):
            assert torch.equal(scatter_param(p, stacks).reshape(p.shape), x), p.shape
    return plan, stacks


def test_llama_953m_stacks():
    """The stack inventory of docs/ALGORITHM.md 3.2, from shapes alone."""
    plan = plan_for(LLAMA_953M, 1024)
    groups = {(g.rows, g.cols): g.count for g in plan.groups}
    assert groups == {(1024, 1024): 860, (256, 1024): 4, (512, 1024): 64, (1024, 512): 32}
    factors = {f.size: f.count for f in plan.factors}
    assert factors == {1024: 1820, 512: 96, 256: 4}


def test_32000_by_2048_blocks():
    plan = plan_for([(32000, 2048)], 1024)
    assert [(g.rows, g.cols, g.count) for g in plan.groups] == [(1024, 1024, 62), (256, 1024, 2)]
    assert {f.size: f.count for f in plan.factors} == {1024: 126, 256: 2}


def test_1025_square_has_four_block_kinds():
    plan = plan_for([(1025, 1025)], 1024)
    assert [(g.rows, g.cols) for g in plan.groups] == [(1024, 1024), (1024, 1), (1, 1024), (1, 1)]


def test_blocks_are_row_major_and_consecutive():
    """Block k of a parameter is (i, j) with k = i * nc + j, for the (2 x 3) grid of full blocks."""
    B = 4
    x = torch.arange(8 * 12.0).reshape(8, 12)
    plan = plan_for([(8, 12)], B)
    (stack,) = gather(plan, [x], torch.float32)
    for i in range(2):
        for j in range(3):
            assert torch.equal(stack[i * 3 + j], x[i * B : (i + 1) * B, j * B : (j + 1) * B])


@pytest.mark.parametrize(
    "shape",
    [
        (32000, 2048),
        (5632, 2048),
        (2048, 5632),
        (256, 1024),
        (768, 768),
        (1025, 1025),
        (1, 3000),
        (64, 16, 3, 3),
        (),
        (700,),
        (1024,),
        (1500,),
    ],
)
def test_round_trip_is_exact(shape):
    round_trip([shape], 1024)
    round_trip([shape], 1024, one_dim="shampoo")


def test_views_of_odd_shapes():
    plan = plan_for([(1, 5), (3, 1, 4), (1, 1), (0, 4), (2, 3, 4, 5)], 8)
    kinds = [(p.kind, p.view) for p in plan.params]
    assert kinds == [(ADAMW, (5, 1)), (MATRIX, (3, 4)), (ADAMW, (1, 1)), ("empty", (0, 1)), (MATRIX, (2, 60))]


def test_one_sided_segments_last_is_shorter():
    plan = plan_for([(10,)], 4, one_dim="shampoo")
    assert [(g.rows, g.cols, g.sides, g.count) for g in plan.groups] == [(4, 1, "left", 2), (2, 1, "left", 1)]
    assert [(f.size, f.order) for f in plan.factors] == [(4, 2), (2, 2)]


def test_factor_slices_are_contiguous_per_group():
    """Each group's L factors then R factors occupy one slice of their size's stack, in group order."""
    plan = plan_for([(12, 12), (8, 12), (12, 8)], 4)
    stack = plan.factors[0]
    assert (stack.size, stack.order) == (4, 4)
    expected_offset = 0
    for g in plan.groups:
        assert g.left.offset == expected_offset
        assert g.right.offset == expected_offset + g.count
        expected_offset += 2 * g.count
    assert expected_offset == stack.count


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(1, 23), min_size=0, max_size=4).map(tuple), min_size=1, max_size=5),
    block_size=st.integers(1, 17),
    one_dim=st.sampled_from(["adamw", "shampoo"]),
)
def test_round_trip_property(shapes, block_size, one_dim):
    plan, stacks = round_trip(shapes, block_size, one_dim)
    covered = sum(s.numel() for s in stacks)
    assert covered == sum(p.numel for p in plan.params if p.kind in (MATRIX, SEGMENTS))
