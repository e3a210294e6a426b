"""The benchmark scripts run (tiny sizes, CPU): they must never rot.

Tool tests, not library tests: each stays because a figure in the README or RESULTS.md comes
from its script, and a script that breaks silently leaves that figure without a command that
reproduces it. They run the smallest sizes that still reach every table; the library's math is
tested elsewhere. The GPU check has a file of its own (tests/test_gpu_check.py)."""

import os
import re
import sys

import pytest

from benchmarks import basis_gpu, stagger_bench, step_bench
from conftest import root_on_path


def test_step_bench_quick(capsys):
    step_bench.main(["--quick", "--solver", "eigh", "--no-compile"])
    out = capsys.readouterr().out
    assert "| dash_fn eager | 32 | 16 | eigh |" in out
    assert "faster with dash_fn eager than sequential" in out


def test_stagger_bench_quick(capsys, tmp_path):
    stagger_bench.main(
        ["--quick", "--modes", "eager", "--no-ddp", "--reps", "1", "--steps", "10", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert "| eager | periodic |" in out and "| eager | staggered |" in out
    assert (tmp_path / "stagger_steps.png").exists() and (tmp_path / "stagger_steps.json").exists()


def test_flop_count_matches_hand_count():
    """One (2B, B) parameter at block B: 2 blocks, each 4 (B^2 B + B B^2) = 8 B^3 FLOPs."""
    import dash_fn

    plan = dash_fn.init(
        {"w": __import__("torch").empty(32, 16, device="meta")}, dash_fn.DashConfig(block_size=16, solver="ndb")
    )["plan"]
    assert step_bench.plain_flops(plan) == 2 * 8 * 16**3


def test_solver_flops_equal_the_products_the_solvers_run():
    """The FLOP model against a count of the batched products each solver dispatches, for the
    root orders a step uses (p = 4 two-sided, p = 2 one-sided segments)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import dash_fn
    from dash_fn.roots import SOLVERS

    class CountFlops(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default):
                a, b = args[0], args[1]
                self.flops += 2 * a.numel() * b.shape[-1]
            return func(*args, **(kwargs or {}))

    params = {
        "w": torch.randn(32, 16),
        "v": torch.randn(48),
    }  # factors of 16 (p = 4), segments of 16 (p = 2): no 64-byte padding
    for solver in ("ndb", "cn", "chebyshev"):
        config = dash_fn.DashConfig(block_size=16, solver=solver, scaling="fro", one_dim="shampoo", cheb_degree=12)
        state = dash_fn.init(params, config)
        counter = CountFlops()
        with counter:
            for stack in state["plan"].factors:
                X = torch.eye(stack.size).expand(stack.count, -1, -1).contiguous()
                SOLVERS[solver](X, stack.order, config, None)
        assert counter.flops == step_bench.solver_flops(state["plan"], config), solver


def _table_rows(out: str, first: str) -> dict[tuple[str, ...], list[str]]:
    """Markdown rows of ``out`` starting with cell ``first``, keyed by their first three cells."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first:
            rows[tuple(cells[:3])] = cells
    return rows


def test_fsdp_bench_planner(capsys):
    """Llama 953M at block 1024: exact moves less than an all-to-all of every gradient, local 0.
    (It stays at the real model's shapes: the README's and the distributed guide's bytes-moved
    figures are these tables' cells; the planner on small shapes is tests/test_fsdp.py's.)"""
    from benchmarks import fsdp_bench

    fsdp_bench.main(["--planner-only"])
    out = capsys.readouterr().out
    assert "model size 3,812,622,336 bytes" in out  # 953,155,584 float32 parameters
    assert "| d_model |" not in out  # no processes
    for world in ("8", "64"):
        rows = {cells[1]: cells for cells in _table_rows(out, world).values()}
        assert set(rows) == {
            "dash_fn exact",
            "dash_fn local",
            "whole-parameter owner",
            "all-to-all of every gradient: 2 (W-1)/W x model bytes",
        }
        every = int(rows["all-to-all of every gradient: 2 (W-1)/W x model bytes"][2].replace(",", ""))
        assert every == 2 * (int(world) - 1) * 3_812_622_336 // int(world)
        exact = int(rows["dash_fn exact"][2].replace(",", ""))
        assert 0 < exact < every
        assert rows["dash_fn local"][2] == "0"
        assert int(rows["whole-parameter owner"][2].replace(",", "")) == every  # shards split every dim 0 evenly
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in out.splitlines()]
    tp = {tuple(cells[:2]): cells for cells in rows if len(cells) == 8 and re.fullmatch(r"\d+ x \d+", cells[1])}
    # block 256: Llama 953M's tensor-parallel edges inside blocks are only the embeddings' (16,000
    # rows a rank) at tp 2, and the feed-forward's (704 a rank) as well at tp 8
    assert [tp["256", f"{dp} x {n}"][2] for dp, n in ((8, 1), (4, 2), (1, 8))] == ["0", "2", "302"]
    for cells in (tp["256", "8 x 1"], tp["1024", "1 x 8"]):
        assert 0 < float(cells[5]) < 1  # less than an all-to-all of every gradient
    moved = {key: (int(cells[3].replace(",", "")), int(cells[7].replace(",", ""))) for key, cells in tp.items()}
    assert moved["256", "1 x 8"][1] == 0 < moved["256", "1 x 8"][0]  # aligned: no FSDP2 edge, nothing moves
    assert moved["256", "8 x 1"][1] == moved["256", "8 x 1"][0]  # no tensor parallel: aligned is exact
    assert 0 < moved["256", "2 x 4"][1] < moved["256", "2 x 4"][0]  # FSDP2's edges only


def test_fsdp_bench_tiny_run():
    """W = 1 and 2 gloo processes at d_model 48, block 32: the 32-row bands of the 48-row
    matrices straddle the 24-row shards at W = 2, so exact moves their rows 24..32: 4 x 8 x 48
    + 8 x 192 = 3072 elements each way, 2 x 3072 x 4 = 24,576 bytes per step; local moves 0."""
    import subprocess

    args = [
        "--d-model",
        "48",
        "--block-size",
        "32",
        "--world-sizes",
        "1",
        "2",
        "--reps",
        "1",
        "--planner-world-sizes",
        "2",
    ]
    env = root_on_path({**os.environ, "OMP_NUM_THREADS": "1"})
    command = [sys.executable, "-m", "benchmarks.fsdp_bench", *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = _table_rows(run.stdout, "48")
    assert set(rows) == {("48", w, mode) for w in ("1", "2") for mode in ("exact", "local")}
    moved = {key: int(cells[-1].replace(",", "")) for key, cells in rows.items()}
    assert moved[("48", "2", "exact")] == 24_576
    assert int(rows[("48", "2", "exact")][3]) == 5  # straddling bands: wq, wk, wv, wo, down
    assert moved[("48", "1", "exact")] == moved[("48", "1", "local")] == moved[("48", "2", "local")] == 0
    assert rows[("48", "2", "local")][3] == "0"


def test_refresh_memory_quick(capsys):
    """Chunked refreshes hold at most two stacks where whole-stack calls of the matmul solvers
    hold five to ten. (The CPU eigh op's temporaries live in its threads, a few blocks
    each, out of the counter's sight: with every block finite its whole-stack call shows about
    one stack, its output; the chunks are for the fallback's extra stacks.)"""
    from benchmarks import refresh_memory

    rows = refresh_memory.main(["--quick"])
    assert [r["solver"] for r in rows] == ["eigh", "ndb", "cn", "chebyshev"]
    for row in rows:
        assert row["chunk"] < 96 and row["chunked"] <= 2 * row["stack"], row
        if row["solver"] != "eigh":
            assert row["whole"] >= 4 * row["stack"], row
    assert "| ndb | 96 x 32 x 32 |" in capsys.readouterr().out


def test_plain_step_quick(capsys):
    from benchmarks import plain_step

    ms = plain_step.main(["--quick", "--backend", "aot_eager"])
    assert set(ms) == {"batched products", "compiled step", "eager step"} and all(v > 0 for v in ms.values())
    out = capsys.readouterr().out
    assert "| what | ms | x products | page faults per call |" in out and "| compiled step |" in out


def test_eigh_floor_quick(capsys):
    """The floor's worker processes time their shares of the blocks and report back."""
    from benchmarks import eigh_floor

    ms = eigh_floor.main(["--quick"])
    assert set(ms) == {"floor", "solver", "refresh"} and all(v > 0 for v in ms.values())
    assert "| refresh |" in capsys.readouterr().out


def test_basis_gpu_dry_run(tmp_path):
    """Its rows come out, and they say what RESULTS reads from them: one QR step reduces the
    off-diagonal energy of a basis in decreasing order and ruins one in increasing order."""
    report = tmp_path / "basis.md"
    assert basis_gpu.main(["--dry-run", "--reps", "1", "--out", str(report)]) == 0
    rows = [line.split(" | ") for line in report.read_text().splitlines() if line.startswith("| 4 x 16^2")]
    assert len(rows) == 1
    old, after, increasing = (float(x.strip(" |")) for x in rows[0][-3:])
    assert after < old < increasing


@pytest.mark.inductor
def test_cpu_compiled_profile_quick(capsys):
    """The eager and compiled adapter steps on the main job's model, timed and profiled. (It
    stays: RESULTS' figures on compile=True on a CPU come from this script.)"""
    from benchmarks import cpu_compiled_profile

    cpu_compiled_profile.main(["--quick"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| eager |", "| compiled |"))]
    assert len(rows) == 2 and all(float(row.split("|")[2]) > 0 for row in rows)
    assert "eager, 2 steps:" in out and "compiled, 2 steps:" in out and "Self CPU time total" in out
