"""Tensor parallel beside FSDP2: a Llama block laid out as torchtitan lays it out.

The process tests spawn W gloo CPU processes running tests/tp_worker.py on a (dp, tp) mesh
and compare every rank's pieces with one process, bit for bit.
"""

from __future__ import annotations

import os

import pytest
import torch

import dash_fn
import tp_worker
from dash_fn.distributed.layout import piece_rects
from test_fsdp import launch

WORKER = os.path.join(os.path.dirname(__file__), "tp_worker.py")
# W = 4: FSDP2 over tensor parallel (torchtitan's 2-D layout); W = 2: tensor parallel alone
LAYOUTS = [(2, 2), (1, 2)]


def _chunk(x: torch.Tensor, parts: int, index: int, dim: int) -> torch.Tensor:
    """torch.chunk's piece ``index`` of ``parts``, empty past the last (FSDP2's and DTensor's split)."""
    pieces = torch.chunk(x, parts, dim) if x.shape[dim] else ()
    return pieces[index] if index < len(pieces) else x.narrow(dim, 0, 0)


@pytest.mark.parametrize("shape", [(40, 24), (30, 7), (5, 3), (10, 3, 2), (9,)])
@pytest.mark.parametrize("dp, tp", [(2, 2), (3, 2), (2, 4)])
def test_pieces_are_where_nested_chunks_put_them(shape, dp, tp):
    """Each rank's rect of the 2-D view holds what chunking puts there: colwise under FSDP2
    (tp chunks of dim 0, each chunked over dp: FSDP2's _StridedShard) and rowwise (dp chunks of
    dim 0, each chunked over tp along dim 1); vectors replicated over tp."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    x = torch.arange(torch.Size(shape).numel()).reshape(shape)
    kind, (R, C) = dash_fn.plan.matrix_view(shape)
    view = x.reshape(R, C)
    layouts = {
        "colwise": ((_StridedShard(0, split_factor=tp), Shard(0)), lambda d, t: _chunk(_chunk(x, tp, t, 0), dp, d, 0)),
        "rowwise": ((Shard(0), Shard(1)), lambda d, t: _chunk(_chunk(x, dp, d, 0), tp, t, 1)),
        "replicated": ((Shard(0), Replicate()), lambda d, t: _chunk(x, dp, d, 0)),
    }
    for name, (placements, oracle) in layouts.items():
        if len(shape) == 1 and name == "rowwise":
            continue
        rects = piece_rects("w", shape, 0, (dp, tp), placements, [0, 1])
        for (d, t), (r0, r1, c0, c1) in zip([(d, t) for d in range(dp) for t in range(tp)], rects):
            want = oracle(d, t)
            assert torch.equal(view[r0:r1, c0:c1].reshape(-1), want.reshape(-1)), (name, d, t)
            assert (r1 - r0) * (c1 - c0) == want.numel(), (name, d, t)


def test_tensor_parallel_tiles_are_the_equal_bands_of_its_pieces():
    """fsdp_blocks="aligned" tiles a parameter where tensor parallelism alone cuts it into
    equal bands: rows of a colwise weight (under FSDP2's _StridedShard too), columns of a
    rowwise one; nothing where it leaves it whole, cuts unevenly or cuts between experts."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    from dash_fn.distributed.layout import tensor_parallel_tiles

    mesh, tp = (2, 2), [1]
    assert tensor_parallel_tiles("q", (40, 24), 0, mesh, (_StridedShard(0, split_factor=2), Shard(0)), tp) == (2, 1)
    assert tensor_parallel_tiles("o", (24, 40), 0, mesh, (Shard(0), Shard(1)), tp) == (1, 2)
    assert tensor_parallel_tiles("norm", (24,), 0, mesh, (Shard(0), Replicate()), tp) == (1, 1)
    assert tensor_parallel_tiles("q", (40, 24), 0, mesh, (_StridedShard(0, split_factor=2), Shard(0)), []) == (1, 1)
    assert tensor_parallel_tiles("k", (10, 24), 0, (1, 4), (Replicate(), Shard(0)), tp) == (1, 1)  # 3, 3, 3, 1 rows
    assert tensor_parallel_tiles("experts", (4, 6, 8), 1, (1, 2), (Replicate(), Shard(0)), tp) == (1, 1)
    assert tensor_parallel_tiles("conv", (8, 6, 3), 0, (1, 2), (Replicate(), Shard(0)), tp) == (2, 1)


def test_tiles_of_whole_blocks_are_the_untiled_plan():
    """Tiles whose sides are multiples of the block size give the one-process plan itself (same
    blocks, same numbering, so the same staggered refresh); other tiles start blocks at their
    own edges: 20 columns a tile at block 8 cut at 0, 8, 16 | 20, 28, 36."""
    shapes = [("w", (16, 40), torch.float32)]
    untiled = dash_fn.plan.make_plan(shapes, 8, "adamw")
    assert dash_fn.plan.make_plan(shapes, 8, "adamw", splits={"w": (2, 1)}) == untiled
    tiled = dash_fn.plan.make_plan(shapes, 8, "adamw", splits={"w": (1, 2)})
    starts = sorted({r.col_start + j * r.block_cols for r in tiled.params[0].regions for j in range(r.n_cols)})
    assert starts == [0, 8, 16, 20, 28, 36]
    x = torch.randn(16, 40)
    assert torch.equal(dash_fn.plan.scatter_param(tiled.params[0], dash_fn.plan.gather(tiled, [x], x.dtype)), x)


def test_tensor_parallel_dims_are_named_tp_or_hold_a_replicated_parameter():
    """FSDP2 shards every parameter on its dims: a dim where one is replicated is tensor
    parallel's; so is one named "tp", where a param group holds only sharded weights."""
    from torch.distributed.tensor import Replicate, Shard

    from dash_fn.distributed.layout import tensor_parallel_dims

    weights = [(Shard(0), Shard(0)), (Shard(0), Shard(1))]
    assert tensor_parallel_dims([*weights, (Shard(0), Replicate())], [0, 1]) == [1]
    assert tensor_parallel_dims(weights, [0, 1]) == []
    assert tensor_parallel_dims(weights, [0, 1], ("dp", "tp")) == [1]


def test_aligned_blocks_warn_when_no_tensor_parallel_edge_cuts_a_parameter():
    """A layout without tensor-parallel tiles (FSDP2 alone, or a mesh dim DASH cannot tell
    from FSDP2's) gives exact blocks under "aligned": a warning says so."""
    from dash_fn.distributed.layout import Layout
    from dash_fn.state import make_state

    specs = [("w", (16, 8), torch.float32)]
    layout = Layout(0, 1, None, (((0, 16, 0, 8),),), ((16, 8),), (), ((1, 1),))
    with pytest.warns(UserWarning, match='aligned" found no parameter'):
        make_state(
            specs, dash_fn.DashConfig(fsdp_blocks="aligned"), torch.device("cpu"), sharding="fsdp", pieces=layout
        )


def test_a_piece_that_is_no_rectangle_is_refused():
    """Shard(1) of 3 stacked experts (batch_dims=1) splits each expert's rows: no one range of
    the (3 x 10, 6) view's rows; a TypeError names the parameter."""
    from torch.distributed.tensor import Shard

    with pytest.raises(TypeError, match=r"params\['experts'\] of shape \(3, 10, 6\).*not a rectangle"):
        piece_rects("experts", (3, 10, 6), 1, (2,), (Shard(1),), [0])


@pytest.fixture(
    scope="module",
    # the accelerator pass runs the 2-D layout alone: it holds tensor parallel's pieces too, and
    # a second layout would repeat its strategy's code at the price of another 2-process launch
    params=[pytest.param(layout, marks=[pytest.mark.accelerator] if layout == (2, 2) else []) for layout in LAYOUTS],
    ids=lambda layout: f"{layout[0]}x{layout[1]}",
)
def ranks(request, tmp_path_factory):
    dp, tp = request.param
    out = tmp_path_factory.mktemp(f"tp_{dp}x{tp}")
    launch(dp * tp, out, "equal", str(dp), str(tp), worker=WORKER)
    return [torch.load(out / f"equal_{dp}x{tp}_rank{rank}.pt", weights_only=False) for rank in range(dp * tp)]


def test_the_layout_is_torchtitans(ranks):
    """The placements under test are the ones the issue names: FSDP2 over a colwise weight
    records _StridedShard, a rowwise weight is Shard(1) on tp, the norms replicate on tp, the
    router lives on the dp sub-mesh; each rank's piece sits where DTensor's offsets say."""
    placements = ranks[0]["placements"]
    if len(ranks) == 4:
        assert placements["attention.wq.weight"] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
        assert placements["attention.wo.weight"] == "(Shard(dim=0), Shard(dim=1))"
        assert placements["attention_norm.weight"] == "(Shard(dim=0), Replicate())"
        assert placements["router.weight"] == "(Shard(dim=0),)"
    else:
        assert placements["attention.wq.weight"] == "(Shard(dim=0),)"
        assert placements["attention.wo.weight"] == "(Shard(dim=1),)"
        assert placements["router.weight"] == "(Replicate(),)"
    assert all(results["holds"] for results in ranks)


@pytest.mark.parametrize("scenario", [*tp_worker.SCENARIOS, pytest.param("compiled", marks=pytest.mark.compat)])
def test_every_rank_equals_one_process_bitwise(ranks, scenario):
    """Exact blocks on tensor-parallel pieces: each rank's pieces after the steps are the one
    process's, bit for bit; pieces did travel (edges inside blocks)."""
    config = tp_worker.SCENARIOS.get(scenario, tp_worker.SCENARIOS["eigh"])
    backend = "aot_eager" if scenario == "compiled" else None
    single = tp_worker.run_functional(config, compile_backend=backend)[0]
    for rank, results in enumerate(ranks):
        for name, whole in single.items():
            assert torch.equal(results[scenario][name], whole[results["boxes"][name]]), (rank, name)
    if scenario == "eigh":
        assert any(results["eigh_exchanges"] for results in ranks)


def test_the_planned_bytes_are_what_a_step_sends(ranks):
    """What the all-to-alls of one step send, per rank, equals the plan's count (the figures of
    benchmarks/fsdp_bench.py's tensor-parallel table come from the same count)."""
    assert [results["sent"] for results in ranks] == [results["planned"] for results in ranks]
    assert sum(results["sent"] for results in ranks) > 0


def test_the_adapter_equals_one_process_bitwise(ranks):
    net = tp_worker.block()
    tp_worker.adapter_run(net, range(1, tp_worker.STEPS + 1))
    for results in ranks:
        for name, whole in net.named_parameters():
            assert torch.equal(results["adapter"][name], whole.detach()[results["boxes"][name]]), name


def test_local_blocks_are_each_piece_stepped_alone(ranks):
    """fsdp_blocks="local" equals one process run on each rank's piece as a whole parameter."""
    for results in ranks:
        for name, want in results["local_oracle"].items():
            assert torch.equal(results["local"][name], want), name
    assert any(
        not torch.equal(results["local"]["feed_forward.w1.weight"], results["eigh"]["feed_forward.w1.weight"])
        for results in ranks
    )


def test_aligned_blocks_are_the_tensor_parallel_pieces_stepped_alone(ranks):
    """fsdp_blocks="aligned" equals one process run on each tensor-parallel piece as a parameter
    of its own, at every data-parallel size (FSDP2's edges still cut inside those blocks at 2 x
    2); it differs from exact blocks, whose edges the tensor-parallel ones cut (20 rows or
    columns a tp rank, blocks of 8)."""
    tp = 2
    oracle = tp_worker.tiles_oracle(tp_worker.ALIGNED, tp)
    for rank, results in enumerate(ranks):
        for name, whole in oracle.items():
            assert torch.equal(results["aligned"][name], whole[results["boxes"][name]]), (rank, name)
    assert any(
        not torch.equal(results["aligned"]["feed_forward.w1.weight"], results["eigh"]["feed_forward.w1.weight"])
        for results in ranks
    )


def test_aligned_blocks_send_only_across_data_parallel_edges(ranks):
    """Tensor parallel alone (1 x 2): aligned blocks send only the update of the router, the
    matrix both tp ranks hold whole (one steps it); under FSDP2 (2 x 2) they also send the rows
    at FSDP2's edges, less than exact blocks, whose edges the tensor-parallel ones cut too."""
    aligned = sum(results["aligned_sent"] for results in ranks)
    exact = sum(results["sent"] for results in ranks)
    router = tp_worker.full_params()["router.weight"].numel()
    assert aligned == router if len(ranks) == 2 else router < aligned < exact


def test_steps_do_not_sync_under_the_accelerator_strategy(ranks):
    assert [results["syncs"] for results in ranks] == [[]] * len(ranks)


def test_hsdp_beside_tensor_parallel_equals_one_process_bitwise(tmp_path):
    """(dp_replicate, dp_shard, tp) = (2, 2, 2): 8 processes, each rank's pieces."""
    launch(8, tmp_path, "hsdp", worker=WORKER)
    single = tp_worker.run_functional(tp_worker.SCENARIOS["eigh"])[0]
    for rank in range(8):
        results = torch.load(tmp_path / f"hsdp_rank{rank}.pt", weights_only=False)
        assert results["placements"]["attention.wq.weight"] == "(Replicate(), _StridedShard(dim=0, sf=2), Shard(dim=0))"
        for name, whole in single.items():
            assert torch.equal(results["pieces"][name], whole[results["boxes"][name]]), (rank, name)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """DCP checkpoints of the functional state after half the steps on the 2 x 2 layout, with
    exact and with aligned blocks."""
    out = tmp_path_factory.mktemp("tp_dcp")
    launch(4, out, "save", "2", "2", worker=WORKER)
    launch(4, out, "save_aligned", "2", "2", worker=WORKER)
    return out


@pytest.mark.parametrize("layout", [(1, 1), (1, 2), (4, 1)], ids=lambda layout: f"{layout[0]}x{layout[1]}")
def test_a_2x2_checkpoint_resumes_on_another_layout_bitwise(checkpoint, layout):
    """Saved on (dp, tp) = (2, 2), resumed on one process, on tensor parallel alone and on
    FSDP2 alone: the remaining steps equal an uninterrupted one-process run."""
    dp, tp = layout
    launch(dp * tp, checkpoint, "resume", str(dp), str(tp), "2", "2", worker=WORKER)
    single = tp_worker.run_functional(tp_worker.FUNCTIONAL)[0]
    for rank in range(dp * tp):
        got = torch.load(checkpoint / f"resume_exact_2x2_to_{dp}x{tp}_rank{rank}.pt")
        for name, want in single.items():
            assert torch.equal(got[name], want), (rank, name)


def test_an_aligned_checkpoint_resumes_at_the_same_tensor_parallel_degree_bitwise(checkpoint):
    """Aligned blocks depend on the tensor-parallel degree only: saved on 2 x 2, resumed on
    tensor parallel alone (1 x 2), the remaining steps equal the uninterrupted aligned run."""
    launch(2, checkpoint, "resume_aligned", "1", "2", "2", "2", worker=WORKER)
    oracle = tp_worker.tiles_oracle(tp_worker.ALIGNED, 2)
    for rank in range(2):
        got = torch.load(checkpoint / f"resume_aligned_2x2_to_1x2_rank{rank}.pt")
        for name, want in oracle.items():
            assert torch.equal(got[name], want), (rank, name)
