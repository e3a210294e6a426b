"""Block ownership across ranks (docs/ALGORITHM.md 8): the planner, and real gloo process groups.

The process tests spawn W = 2 and W = 3 CPU processes (tests/distributed_worker.py); each rank
runs every scenario as one process and as a rank of W, and here the two must agree bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import dash_fn
from conftest import DISTRIBUTED_WORLD_SIZE, mixed_params, root_on_path, selected_scenarios
from dash_fn.distributed import make_shard, owned_ranges, ownership, rank_loads
from dash_fn.plan import make_plan

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")

# The DASH paper's Llama 953M (docs/ALGORITHM.md 3.2): 16 layers and two embeddings.
LLAMA_953M = [
    (f"l{i}.{name}", shape, torch.float32)
    for i in range(16)
    for name, shape in (
        ("qkv", (6144, 2048)),
        ("o", (2048, 2048)),
        ("gate", (5632, 2048)),
        ("up", (5632, 2048)),
        ("down", (2048, 5632)),
    )
]
LLAMA_953M += [("embed", (32000, 2048), torch.float32), ("head", (32000, 2048), torch.float32)]


def test_cost_balance_llama_953m_w8():
    plan = make_plan(LLAMA_953M, 1024, "adamw")
    loads = rank_loads(plan, ownership(plan, 8))
    mean = sum(loads) / len(loads)
    assert max(loads) <= 1.10 * mean, [load / mean for load in loads]
    # the whole-model root cost (sum of b^3 over all factors) is split, not lost or doubled
    assert sum(loads) == sum(stack.count * stack.size**3 for stack in plan.factors)


def test_extra_blocks_go_to_the_least_loaded_ranks():
    """One 64-block then one 8-block over 2 ranks: the big one to rank 0 (a tie), the small one
    to rank 1, the less loaded (handing extras to the lowest ranks would give rank 0 both)."""
    plan = make_plan([("a", (64, 64), torch.float32), ("b", (8, 8), torch.float32)], 64, "adamw")
    counts = ownership(plan, 2)
    assert counts == ((1, 0), (0, 1))
    assert rank_loads(plan, counts) == [2 * 64**3, 2 * 8**3]
    three = ownership(
        make_plan(
            [("a", (64, 64), torch.float32)] * 1 + [("b", (32, 32), torch.float32), ("c", (8, 8), torch.float32)],
            64,
            "adamw",
        ),
        3,
    )
    assert three == ((1, 0, 0), (0, 1, 0), (0, 0, 1))


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 40])
def test_ownership_partitions_every_group(world_size):
    plan = make_plan([(n, tuple(x.shape), x.dtype) for n, x in mixed_params().items()], 24, "shampoo")
    counts = ownership(plan, world_size)
    for group, n in zip(plan.groups, counts):
        assert sum(n) == group.count and max(n) - min(n) <= 1
    # each block of each parameter is owned by exactly one rank, at consecutive local positions
    for p in plan.params:
        for g, start, stop in [(r.group, r.offset, r.offset + r.count) for r in p.regions]:
            owned = []
            for rank in range(world_size):
                shard = make_shard(plan, rank, world_size, "group")
                lo, _ = shard.bounds(g)
                owned += [lo + i for gg, a, b in owned_ranges(shard, p) if gg == g for i in range(a, b)]
            assert sorted(owned) == list(range(start, stop))


def test_more_ranks_than_blocks_leaves_ranks_without_blocks():
    plan = make_plan([("w", (12, 10), torch.float32)], 64, "adamw")  # one block
    shards = [make_shard(plan, rank, 3, "group") for rank in range(3)]
    assert [s.local.groups[0].count for s in shards] == [1, 0, 0]
    assert [s.local.factors[0].count for s in shards] == [1, 0, 0]


def test_one_process_is_the_whole_plan():
    plan = make_plan([(n, tuple(x.shape), x.dtype) for n, x in mixed_params().items()], 8, "adamw")
    shard = make_shard(plan, 0, 1, None)
    assert shard.local == plan and shard.bounds(0) == (0, plan.groups[0].count)


def test_bad_world_size_and_rank_raise():
    plan = make_plan([("w", (12, 10), torch.float32)], 8, "adamw")
    with pytest.raises(ValueError, match="world_size"):
        ownership(plan, 0)
    with pytest.raises(ValueError, match="rank"):
        make_shard(plan, 2, 2, "group")


def test_process_group_must_be_a_process_group():
    with pytest.raises(TypeError, match="ProcessGroup"):
        dash_fn.init(mixed_params(), dash_fn.DashConfig(block_size=8), process_group="world")


def test_a_ranks_checkpoint_loads_only_on_that_rank(tmp_path):
    """A shard's file records its rank and world size; one process cannot load it as a whole."""
    from dash_fn.state import make_state

    params = mixed_params()
    specs = [(n, tuple(x.shape), x.dtype) for n, x in params.items()]
    config = dash_fn.DashConfig(block_size=8, solver="eigh")
    shard = make_state(specs, config, torch.device("cpu"), rank=1, world_size=2, group_name="group")
    dash_fn.save_state(tmp_path / "rank1.pt", shard)
    with pytest.raises(ValueError, match="rank 1 of 2 but is loaded on one process"):
        dash_fn.load_state(tmp_path / "rank1.pt", params=params)
    dash_fn.save_state(tmp_path / "whole.pt", dash_fn.init(params, config))
    blob = torch.load(tmp_path / "whole.pt", weights_only=True)
    assert "shard" not in blob  # one-process files are as before


# The workers count syncs under the simulated strategy in either pass.
@pytest.fixture(scope="module", params=[pytest.param(DISTRIBUTED_WORLD_SIZE, marks=pytest.mark.accelerator)])
def ranks(request, tmp_path_factory):
    """Every rank's results of tests/distributed_worker.py run in ``world_size`` processes (the
    scenarios the selected tests read)."""
    world_size = request.param
    out = tmp_path_factory.mktemp(f"w{world_size}")
    env = root_on_path({**os.environ, "OMP_NUM_THREADS": "1"})
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                WORKER,
                str(rank),
                str(world_size),
                str(out / "init"),
                str(out),
                *selected_scenarios(request),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    errors = [proc.communicate(timeout=600)[1] for proc in procs]
    for proc, error in zip(procs, errors):
        assert proc.returncode == 0, error[-3000:]
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)]


# make compat: the eager sharded step (its all-gather is named differently across releases)
SCENARIOS = [
    pytest.param("eigh", marks=pytest.mark.compat),
    "ndb",
    "one_dim_shampoo",
    "owns_nothing",
    "vectors_only",
    "uniform",
    "moe",
    "skips",
    "compiled",
    "staggered",
    "warmup",
    "storage",
    "update_rules",
    "eigenvalue_corrected",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rank_equals_one_process_bitwise(ranks, scenario):
    for rank, results in enumerate(ranks):
        single, sharded = results[scenario]["single"], results[scenario]["sharded"]
        for name in single:
            assert torch.equal(sharded[name], single[name]), (rank, name)


def test_every_rank_skips_a_step_that_overflows_on_one_rank(ranks):
    """The "skips" scenario inserts a step whose only overflowing factor product is one block's;
    the sharded run (every rank skipping it) equals the clean one-process run, bitwise."""
    assert [results["skips"]["skipped"] for results in ranks] == [1] * len(ranks)


def test_sharded_steps_do_not_sync_under_the_accelerator_strategy(ranks):
    """Functional and adapter steps of every rank, eager, NDB with momentum and the guard, the
    accelerator strategy simulated on the CPU: no op that reads a device value on the host."""
    assert [results["syncs"] for results in ranks] == [[]] * len(ranks)


def test_adapter_with_process_group_and_checkpoint_equals_one_process(ranks):
    for results in ranks:
        for got, want in zip(results["adapter"]["sharded"], results["adapter"]["single"]):
            assert torch.equal(got, want)


def test_state_splits_across_ranks(ranks):
    world_size = len(ranks)
    uniform = [results["uniform"] for results in ranks]  # 36 equal blocks: an exact split
    assert all(r["sharded_bytes"] * world_size == r["single_bytes"] for r in uniform)
    for scenario in ("eigh", "ndb"):  # uneven blocks: within one 24x24 block's state of 1/W
        per_rank = [results[scenario]["sharded_bytes"] for results in ranks]
        single = ranks[0][scenario]["single_bytes"]
        assert sum(per_rank) >= single  # AdamW vectors and counters exist on every rank
        assert max(per_rank) <= single / world_size + 6 * 4 * 24 * 24 * 2


def test_bfloat16_communication_stays_close(ranks):
    """bf16 directions (8 bits of mantissa) over 10 steps at lr 1e-2/t: within 1e-3 relative."""
    for results in ranks:
        want, got = results["ndb"]["single"], results["bf16"]["sharded"]
        for name in want:
            scale = want[name].abs().max().clamp_min(1e-30)
            assert ((got[name] - want[name]).abs().max() / scale) < 1e-3, name
        assert any(not torch.equal(got[n], want[n]) for n in want)  # it did round
