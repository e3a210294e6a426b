"""FSDP2 row shards and DCP checkpoints that move between world sizes.

The planner is tested here directly; the process tests spawn W gloo CPU processes running
tests/fsdp_worker.py and compare every rank's shards with one process, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import dash_fn
import fsdp_worker
from conftest import DISTRIBUTED_WORLD_SIZE, root_on_path, selected_scenarios
from dash_fn.distributed.fsdp import local_shape, make_fsdp_shard, moved_elements, plan_tiles, row_layout, row_rects
from dash_fn.plan import make_plan

WORKER = os.path.join(os.path.dirname(__file__), "fsdp_worker.py")
SHAPES = [(30, 20), (2, 9), (5, 3, 2, 2), (1, 12, 4), (30,), (7,), (0, 4), (17, 1)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shard_rows_follow_torch_chunk(world_size):
    """Rank k's rows are where torch.chunk puts them (FSDP2's Shard(0) split), in view rows."""
    for shape in SHAPES:
        x = torch.arange(torch.Size(shape).numel()).reshape(shape)
        pieces = list(torch.chunk(x, world_size)) if shape[0] else []
        pieces += [x[:0]] * (world_size - len(pieces))
        kind, (R, C) = dash_fn.plan.matrix_view(shape)
        view = x.reshape(R, C) if x.numel() else None
        for k, ((lo, hi, c0, c1), piece) in enumerate(zip(row_rects(shape, world_size), pieces)):
            assert local_shape(shape, world_size, k) == tuple(piece.shape), (shape, k)
            if view is not None:
                assert torch.equal(view[lo:hi, c0:c1].reshape(-1), piece.reshape(-1)), (shape, k)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_every_block_is_owned_once_and_owned_rows_are_whole_bands(world_size, block_size):
    specs = [(f"p{i}", s, torch.float32) for i, s in enumerate(SHAPES)]
    plan = make_plan(specs, block_size, "shampoo")
    shards = [make_fsdp_shard(plan, row_layout(plan, k, world_size, "g"), False, "shampoo") for k in range(world_size)]
    for i, p in enumerate(plan.params):
        owned = sorted((row, col) for s in shards for j, row, col, _, _ in s.block_origins(plan) if j == i)
        want = sorted(
            (r.row_start + a * r.block_rows, r.col_start + b * r.block_cols)
            for r in p.regions
            for a in range(r.n_rows)
            for b in range(r.n_cols)
        )
        assert owned == want, p.name
    for g, group in enumerate(plan.groups):  # the local stacks add up to the whole groups
        assert sum(s.local.groups[g].count for s in shards) == group.count


def test_a_straddling_band_goes_to_the_rank_holding_most_of_its_rows():
    """30 rows over 2 ranks (15 each), blocks of 8: band [8, 16) has 7 rows on rank 0, 1 on
    rank 1; band [24, 30) is rank 1's alone. Rank 1 sends its row 15 and gets its update back."""
    plan = make_plan([("w", (30, 20), torch.float32)], 8, "adamw")
    rows = tuple(row_rects(p.shape, 2) for p in plan.params)
    owned, loads = plan_tiles(plan, rows, 2)
    assert owned == (((0, 16, 0, 20), (16, 30, 0, 20)),)
    assert moved_elements(plan, rows, owned) == moved_elements(plan, owned, rows) == 1 * 20
    band = 2 * (8**3 + 8**3) + 8**3 + 4**3  # two (8, 8) blocks and an (8, 4) strip
    last = 2 * (6**3 + 8**3) + 6**3 + 4**3  # the 6-row band
    assert loads == [2 * band, band + last]
    whole = tuple(row_rects(p.shape, 1) for p in plan.params)
    assert moved_elements(plan, whole, plan_tiles(plan, whole, 1)[0]) == 0


def test_band_owners_prefer_rows_over_load():
    """Fewest rows moved first: rank 0 holds 6 of the second band's 8 rows and takes it,
    though rank 1 carries no load; ties in rows go to the less-loaded rank."""
    from dash_fn.distributed.ownership import band_owners

    assert band_owners([((8, 0), 100), ((6, 2), 10)], 2) == ([0, 0], [110, 0])
    assert band_owners([((4, 4), 10), ((4, 4), 10), ((0, 8), 5)], 2) == ([0, 1, 1], [10, 15])  # rank 1 starts with 5


def test_ties_between_holders_go_to_the_least_loaded_rank():
    """Rows 16 over 2 ranks at block 16: one band, 8 rows each: rank 0 (ties: lower rank);
    a second such parameter then goes to rank 1, the less loaded."""
    plan = make_plan([("a", (16, 16), torch.float32), ("b", (16, 16), torch.float32)], 16, "adamw")
    rows = tuple(row_rects(p.shape, 2) for p in plan.params)
    owned, loads = plan_tiles(plan, rows, 2)
    assert owned == (((0, 16, 0, 16), (0, 0, 0, 0)), ((0, 0, 0, 0), (0, 16, 0, 16)))
    assert loads == [2 * 16**3, 2 * 16**3]


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path_factory.mktemp('pg') / 'init'}", rank=0, world_size=1
    )
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_one_rank_mesh_equals_one_process_bitwise(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    for config in fsdp_worker.SCENARIOS.values():
        single = fsdp_worker.run_functional(config)[0]
        sharded = fsdp_worker.run_functional(config, mesh)[0]
        for name in single:
            assert type(sharded[name]).__name__ == "DTensor"
            assert torch.equal(sharded[name].to_local(), single[name]), name


def test_unsupported_placements_raise_type_errors(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    config = dash_fn.DashConfig(block_size=4)
    w = torch.randn(8, 6)
    cases = [
        (
            {"w": DTensor.from_local(w, mesh, [Partial()])},
            r"params\['w'\] has placements \(Partial\(sum\),\).*not Partial",
        ),
        (
            {"w": distribute_tensor(torch.randn(2, 3, 4), mesh, [Shard(2)])},
            r"params\['w'\] has placements \(Shard\(dim=2\),\)",
        ),
        (
            {"w": distribute_tensor(w, init_device_mesh("cpu", (1, 1, 1, 1)), [Shard(0)] * 4)},
            "4-D DeviceMesh",
        ),
        (
            {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": torch.zeros(3)},
            r"mixes DTensors \('w'\) and plain tensors \('b'\)",
        ),
    ]
    for params, match in cases:
        with pytest.raises(TypeError, match=match):
            dash_fn.init(params, config)
    with pytest.raises(TypeError, match="pass process_group=None"):
        dash_fn.init({"w": distribute_tensor(w, mesh, [Shard(0)])}, config, process_group=one_rank_group)


def launch(world_size: int, out, task: str, *args: str, worker: str = WORKER) -> None:
    env = root_on_path({**os.environ, "OMP_NUM_THREADS": "1"})
    init = out / f"init_{task}_{world_size}_{'_'.join(args)}"
    procs = [
        subprocess.Popen(
            [sys.executable, worker, str(rank), str(world_size), str(init), str(out), task, *args],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    errors = [proc.communicate(timeout=600)[1] for proc in procs]
    for proc, error in zip(procs, errors):
        assert proc.returncode == 0, error[-3000:]


@pytest.fixture(scope="module", params=[pytest.param(DISTRIBUTED_WORLD_SIZE, marks=pytest.mark.accelerator)])
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"fsdp_w{request.param}")
    launch(request.param, out, "equal", *selected_scenarios(request))
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(request.param)]


# make compat: the compiled step on DTensor shards (tracing DTensors changes between releases)
@pytest.mark.parametrize("scenario", [*fsdp_worker.SCENARIOS, pytest.param("compiled", marks=pytest.mark.compat)])
def test_every_rank_equals_one_process_bitwise(ranks, scenario):
    """10 float32 steps on Shard(0) DTensors, uneven and empty shards, straddling bands."""
    config = fsdp_worker.SCENARIOS.get(scenario, fsdp_worker.SCENARIOS["eigh"])
    backend = "aot_eager" if scenario == "compiled" else None  # compiled sharded against compiled one process
    single = fsdp_worker.run_functional(config, compile_backend=backend)[0]
    for name, whole in single.items():
        assert torch.equal(torch.cat([results[scenario][name] for results in ranks]), whole), name
    if scenario != "compiled":
        assert all(results[scenario + "_moved"] for results in ranks)  # rows did travel


def test_every_rank_skips_a_nan_that_only_one_shard_holds(ranks):
    """A NaN in the last rank's rows: every rank skips that step, and the run equals the clean
    one-process run bitwise."""
    single = fsdp_worker.run_functional(fsdp_worker.SCENARIOS["eigh"])[0]
    assert [results["skips_count"] for results in ranks] == [1] * len(ranks)
    for name, whole in single.items():
        assert torch.equal(torch.cat([results["skips"][name] for results in ranks]), whole), name


def test_compiled_adapter_under_fsdp2_equals_one_process(ranks):
    """DASH(compile=...) on fully_shard parameters: the compiled one-process run, bitwise."""
    reference = fsdp_worker.reference(compile={"backend": "aot_eager"})
    for results in ranks:
        for got, want in zip(results["compiled_adapter"], reference):
            assert torch.equal(got, want)


def test_fsdp2_steps_do_not_sync_under_the_accelerator_strategy(ranks):
    """Functional steps on DTensor shards and the adapter on fully_shard parameters, eager,
    NDB with momentum and the guard, the accelerator strategy simulated on the CPU: no op that
    reads a device value on the host, on any rank."""
    assert [results["syncs"] for results in ranks] == [[]] * len(ranks)


def test_local_blocks_are_each_shard_stepped_alone(ranks):
    """fsdp_blocks="local" equals one process run on each rank's shard as a whole parameter,
    and differs from the exact blocks (the price of no communication)."""
    for results in ranks:
        for name, want in results["local_oracle"].items():
            assert torch.equal(results["local"][name], want), name
    assert any(not torch.equal(results["local"]["w"], results["eigh"]["w"]) for results in ranks)


def test_hsdp_mesh_equals_one_process_bitwise(tmp_path):
    """(Replicate(), Shard(0)) on a 2 x 2 mesh of 4 processes."""
    launch(4, tmp_path, "hsdp")
    single = fsdp_worker.run_functional(fsdp_worker.SCENARIOS["eigh"])[0]
    for rank in range(4):
        got = torch.load(tmp_path / f"hsdp_rank{rank}.pt")
        for name in single:
            assert torch.equal(got[name], single[name]), (rank, name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """DCP checkpoints after 5 steps, saved by 1, 2 and 3 ranks (functional, FSDP2, DDP)."""
    out = tmp_path_factory.mktemp("dcp")
    for world_size in (1, 2, 3):
        launch(world_size, out, "save")
    return out


@pytest.mark.parametrize("saved, resumed", [(1, 2), (2, 3), (3, 1)])
def test_checkpoint_resumes_at_another_world_size_bitwise(checkpoints, saved, resumed):
    """Saved at W ranks, resumed at W': the next 5 steps equal an uninterrupted one-process run.
    Every world size saves once and resumes once, growing and shrinking (a fourth pair would
    only repeat a save and a resume already checked)."""
    launch(resumed, checkpoints, "resume", str(saved))
    reference = fsdp_worker.reference()
    functional = fsdp_worker.run_functional(fsdp_worker.FUNCTIONAL)[0]
    for rank in range(resumed):
        results = torch.load(checkpoints / f"resume_w{saved}_to_w{resumed}_rank{rank}.pt", weights_only=False)
        for mode in ("fsdp", "ddp"):
            for got, want in zip(results[mode], reference):
                assert torch.equal(got, want), (mode, rank)
        for name, want in functional.items():
            assert torch.equal(results["functional"][name], want), name
        # another block size: a ValueError naming the field on every rank, the state untouched
        assert "block_size is 4 here but 8 in the checkpoint" in results["errors"][0]
        assert results["errors"][1] == "unchanged: True"


def _stepped_state(config, steps=4):
    params = fsdp_worker.full_params()
    state = dash_fn.init(params, config)
    for t in range(1, steps + 1):
        params, state = dash_fn.step(params, fsdp_worker.random_grads(params, t), state, lr=1e-2)
    return params, state


@pytest.mark.parametrize("sharding, world_size", [("replicated", 2), ("replicated", 3), ("fsdp", 2), ("fsdp", 3)])
def test_state_dict_moves_to_any_rank_of_any_world_size(sharding, world_size):
    """A one-process state dict loaded as each rank's share: every block the rank holds, and
    its AdamW rows, carry the one-process values (no process group is needed to lay it out)."""
    from dash_fn.checkpoint import _block_views
    from dash_fn.plan import ADAMW
    from dash_fn.state import make_state

    config = dash_fn.DashConfig(block_size=8, solver="eigh", mu=0.5, one_dim="adamw")
    params, state = _stepped_state(config)
    saved = dash_fn.state_to_dict(state)
    specs = [(n, tuple(x.shape), x.dtype) for n, x in params.items()]
    held = 0
    for rank in range(world_size):
        template = make_state(specs, config, torch.device("cpu"), rank, world_size, "g", sharding=sharding)
        loaded = dash_fn.state_from_dict(template, saved)
        shard, plan = loaded["shard"], loaded["plan"]
        for i, row, col, g, pos in shard.block_origins(plan):
            group = shard.local.groups[g]
            entry = saved["state"][plan.params[i].name][f"rows_{row}_{row + group.rows}_cols_{col}_{col + group.cols}"]
            for field, x in _block_views(loaded, shard.local, g, pos).items():
                assert torch.equal(x, entry[field]), (rank, i, row, col, field)
            held += 1
        for i, p in enumerate(shard.local.params):
            if p.kind == ADAMW:
                lo, hi = shard.rects[i][rank][:2] if sharding == "fsdp" else (0, p.numel)
                for field in ("m", "v"):
                    got = loaded["adamw", field][p.flat_offset : p.flat_offset + p.numel]
                    assert torch.equal(got, saved["state"][p.name][field].reshape(-1)[lo:hi]), (rank, p.name, field)
        assert int(loaded["step"]) == 4
    assert held == sum(1 for entry in saved["state"].values() for key in entry if key.startswith("rows_"))


def test_functional_load_state_dict_names_the_differing_field_and_changes_nothing():
    config = dash_fn.DashConfig(block_size=8, solver="eigh")
    _, state = _stepped_state(config)
    saved = dash_fn.state_to_dict(state)
    other = dash_fn.init(fsdp_worker.full_params(), config.replace(beta_LR=0.9))
    before = {
        k: v.clone() for k, v in other.exclude("config", "plan", "shard").items(include_nested=True, leaves_only=True)
    }
    with pytest.raises(ValueError, match=r"config.beta_LR is 0.9 here but 0.95 in the checkpoint"):
        dash_fn.state_from_dict(other, saved)
    for k, v in other.exclude("config", "plan", "shard").items(include_nested=True, leaves_only=True):
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="expected the dict of dash_fn.state_to_dict"):
        dash_fn.state_from_dict(other, {"state": {}})


def test_fsdp_states_are_not_single_files():
    from dash_fn.state import make_state

    specs = [(n, tuple(x.shape), x.dtype) for n, x in fsdp_worker.full_params().items()]
    state = make_state(specs, dash_fn.DashConfig(block_size=8), torch.device("cpu"), 0, 2, "g", sharding="fsdp")
    with pytest.raises(TypeError, match="torch.distributed.checkpoint through dash_fn.state_to_dict"):
        dash_fn.save_state(os.devnull, state)


def test_get_state_dict_of_a_fresh_optimizer_keeps_the_parameters():
    """DCP's get_state_dict steps a fresh optimizer once with zero grads and lr 0: no bit moves,
    and the state comes back under the parameters' names."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    before = [p.detach().clone() for p in net.parameters()]
    opt = dash_fn.DASH(net.parameters(), lr=0.1, block_size=4, solver="eigh", weight_decay=0.1, weight_decay_1d=0.1)
    _, optim_sd = get_state_dict(net, opt)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert sorted(optim_sd["state"]) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert "rows_4_5_cols_4_6" in optim_sd["state"]["0.weight"] and optim_sd["state"]["0.bias"]["m"].shape == (5,)
