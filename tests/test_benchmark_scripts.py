"""The benchmark scripts run (tiny sizes, CPU): they must never rot."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import gpu_check  # noqa: E402
import step_bench  # noqa: E402


def test_gpu_check_dry_run(capsys):
    gpu_check.main(["--dry-run", "--solver", "ndb"])
    out = capsys.readouterr().out
    assert "| dash_fn compiled (aot_eager) | tiny | 16 | ndb |" in out
    assert "sequential per-block" in out and "torch AdamW (foreach)" in out


def test_step_bench_quick(capsys):
    step_bench.main(["--quick", "--solver", "eigh", "--no-compile"])
    out = capsys.readouterr().out
    assert "| dash_fn eager | 32 | 16 | eigh |" in out
    assert "faster with dash_fn eager than sequential" in out


def test_flop_count_matches_hand_count():
    """One (2B, B) parameter at block B: 2 blocks, each 4 (B^2 B + B B^2) = 8 B^3 FLOPs."""
    import dash_fn

    plan = dash_fn.init({"w": __import__("torch").empty(32, 16, device="meta")}, dash_fn.DashConfig(block_size=16, solver="ndb"))["plan"]
    assert step_bench.plain_flops(plan) == 2 * 8 * 16**3
    # NDB, T = 10: 2 (3T - 2) = 56 products of 2 b^3 per factor, 4 factors of size 16
    assert step_bench.solver_flops(plan, dash_fn.DashConfig(block_size=16, solver="ndb")) == 4 * 56 * 2 * 16**3
