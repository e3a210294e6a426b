"""DASH as torchtitan's optimizer (examples/torchtitan_dash.py), on 4 gloo CPU processes.

torchtitan's own Llama 3 debug model, parallelized by torchtitan's own plan on a (dp_shard 2,
tp 2) mesh, trains 6 steps with DASH through ``DashOptimizers`` under torchtitan's LR
scheduler; a second job stops at step 3 (torchtitan's checkpoint manager saves there) and a
third resumes it. The resumed run must equal the uninterrupted one bit for bit, and DASH's
learning rates must be what torchtitan's scheduler gives its own AdamW. These tests need the
``torchtitan`` extra.
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from conftest import root_on_path

# (not in the simulated accelerator pass: the container adds nothing to DASH's step, whose
# accelerator path on these layouts tests/test_tensor_parallel.py covers)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None,
    reason="the torchtitan extra is not installed: pip install -e '.[torchtitan]'",
)

WORKER = os.path.join(os.path.dirname(__file__), "torchtitan_worker.py")
RANKS = 4
JOB = ["--dp-shard", "2", "--tp", "2", "--steps", "6"]


def torchrun(out, *args: str) -> list[dict]:
    """Run the example's main on RANKS processes; what each rank returned."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}", WORKER]
    done = subprocess.run(
        [*command, str(out), *args],
        env=root_on_path({**os.environ, "OMP_NUM_THREADS": "1"}),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [torch.load(f"{out}_rank{rank}.pt", weights_only=False) for rank in range(RANKS)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchtitan")
    checkpoints = str(out / "checkpoints")
    return {
        "whole": torchrun(out / "whole", *JOB),
        "first": torchrun(out / "first", *JOB, "--stop-at", "3", "--checkpoint-dir", checkpoints),
        "resumed": torchrun(out / "resumed", *JOB, "--checkpoint-dir", checkpoints),
    }


def test_torchtitan_lays_the_model_out_with_tensor_parallel_beside_fsdp2(runs):
    placements = runs["whole"][0]["placements"]
    assert placements["layers.0.attention.qkv_linear.wqkv.weight"][0].startswith("_StridedShard(dim=0")  # colwise
    assert placements["layers.0.feed_forward.w2.weight"] == ["Shard(dim=0)", "Shard(dim=1)"]  # rowwise
    assert all(len(p) == 2 for p in placements.values())  # every parameter a DTensor on the 2-D mesh


def test_resuming_torchtitans_checkpoint_equals_the_uninterrupted_run_bitwise(runs):
    for whole, first, resumed in zip(runs["whole"], runs["first"], runs["resumed"]):
        assert sorted(first["losses"]) == [1, 2, 3] and sorted(resumed["losses"]) == [4, 5, 6]
        assert {**first["losses"], **resumed["losses"]} == whole["losses"]
        for name, piece in whole["params"].items():
            assert torch.equal(resumed["params"][name], piece), name


def test_dash_steps_at_the_rates_of_torchtitans_scheduler(runs):
    """The oracle: the debug model's LR scheduler config driving torchtitan's own AdamW."""
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    config = default_adamw(lr=3e-3)  # the example's default rate
    config.implementation = "for-loop"
    adamw = config.build(model_parts=[torch.nn.Linear(2, 2)])
    scheduler = llama3_debugmodel().lr_scheduler.build(optimizers=adamw, training_steps=6)
    expected = {}
    for step in range(1, 7):
        expected[step] = adamw.optimizers[0].param_groups[0]["lr"]
        adamw.step()  # (no gradients: nothing moves)
        scheduler.step()
    assert runs["whole"][0]["lrs"] == expected
    assert len(set(expected.values())) > 2  # warm-up and decay, not a constant


def test_dash_lowers_the_loss(runs):
    losses = runs["whole"][0]["losses"]
    assert losses[6] < losses[1] - 0.5, losses
