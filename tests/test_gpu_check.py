"""benchmarks/gpu_check.py on the CPU (its dry run: tiny shapes, aot_eager, the accelerator
strategy simulated): every row runs, and a failed, wrong or CUDA-graph-skipped row fails the run.
Apart from tests/test_benchmark_scripts.py so that pytest's workers run the two files side by side."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import gpu_check  # noqa: E402


def test_gpu_check_dry_run(tmp_path):
    """Every section and row of the GPU check, each with its seconds: the shipped defaults, each
    precision's table against its own peak, the syncs, accuracy, every solver's table and a
    whole training step of AdamW, Muon and DASH. A dry run has no budget: every row runs,
    however slow the machine. A tool test that stays: a GPU run is rare and short, and a script
    that breaks on it wastes the run. (Not marked compat: `make compat` runs the same dry run
    on torch 2.11, the GPU image's release, through gpu_day.sh.)"""
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--out", str(report)]) == 0
    out = report.read_text()
    for block in (8, 16):
        for mode, precision in MODES:
            assert f"| shipped: {mode}, block {block}, precision {precision}, tiny | compiled " in out
    for precision in gpu_check.PRECISIONS:
        assert f"| precision {precision}: coupled Newton step times, tiny | " in out
        assert f"{precision}: peak of its products " in out
    for solver in ("cn", "ndb", "eigh"):
        assert f"| dash_fn compiled (aot_eager) | tiny | 16 | {solver} |" in out
        assert f"| {solver}: float32 on cpu vs float64 on CPU" in out
    assert "sequential per-block" in out and "torch AdamW (foreach)" in out
    assert "| adapter, eager | no sync in 5 steps (" in out  # counted under the simulated accelerator strategy
    assert "| functional step, compiled | ran 5 steps" in out and "from eager (limit 1e-04) (" in out
    assert "| dash-defaults@0.001 | 1 |" in out and "| muon@0.003 | 1 |" in out  # train_lm's summary
    # Meta's Distributed Shampoo is not on PyPI: timed where its wheel is installed, else said so
    assert "| distributed shampoo, cn roots, tiny | plain " in out or "distributed_shampoo is not installed" in out
    assert all(line.endswith(" s) |") for line in out.splitlines() if line.startswith(("| shipped", "| precision")))
    assert out.splitlines()[-1].startswith("every check that ran passed; total wall time ")
    assert "of the budget left" not in out and out.splitlines()[-1].endswith(", no budget")


# The failure-mode tests below check the script's own logic (a failed row, a wrong number, a
# skipped CUDA graph): one small parameter serves them as well as the whole tiny layer.
ONE_PARAMETER = {"o": (32, 32)}
# the syncs section's compiled rows, each checked against eager and for CUDA-graph skips
COMPILED_SYNC_ROWS = (
    "adapter, compiled",
    "functional step, compiled",
    "functional step, spectral rule + eps_rel + nesterov_G, compiled",
    "functional step, the defaults (auto: coupled Newton, cube roots), compiled",
    "functional step, eigenvalue-corrected (auto: qr bases), compiled",
)


def test_gpu_check_sections_are_chosen(tmp_path):
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--only", "accuracy", "syncs", "--skip", "syncs", "--out", str(report)]) == 0
    checks = [line.split(" | ")[0][2:] for line in report.read_text().splitlines()[4:] if line.startswith("| ")]
    assert checks == [
        f"{s}: float32 on cpu vs float64 on CPU, 12 steps, max relative difference" for s in ("cn", "ndb", "eigh")
    ]


def test_gpu_check_keeps_going_after_a_failed_row_and_fails_the_run(tmp_path, monkeypatch):
    """A row that raises is reported with its error and innermost frames, the rows before it are
    already in the file, the rows after it still run, and the run's status says it failed."""
    report = tmp_path / "gpu.md"
    later, failed_before = [], []

    def planted(*args):
        failed_before.append(report.read_text().count("RuntimeError: planted"))  # rows written as they completed
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu_check, "accuracy", planted)
    monkeypatch.setattr(gpu_check, "timing_rows", lambda *args: later.append(True))
    assert gpu_check.main(["--dry-run", "--only", "accuracy", "solvers", "--out", str(report)]) == 1
    out = report.read_text()
    assert failed_before == [0, 1, 2]  # cn's, ndb's and eigh's rows, each failed and written before the next
    assert "| cn: float32 on cpu vs float64 on CPU, 12 steps, max relative difference | RuntimeError: planted" in out
    assert "test_gpu_check.py:" in out and "planted) (" in out and " s) **FAILED** |" in out
    assert later == [True]
    assert out.splitlines()[-1].startswith("FAILED: cn: float32 on cpu vs float64 on CPU")


def test_gpu_check_fails_on_wrong_numbers(tmp_path, monkeypatch):
    """Compiled results off eager by more than the tolerance, and a device far from float64
    where the CPU's float32 is close, fail their rows (a run that only crashes can't catch them)."""
    monkeypatch.setattr(gpu_check, "TINY_LAYER", ONE_PARAMETER)

    def off_when_compiled(make):
        def run(device, width, block, compile, **options):
            steps, params = make(device, width, block, compile, **options)
            if compile in (None, False):
                return steps, params
            return steps, lambda: {k: v * (1 + 1e-3) for k, v in params().items()}

        return run

    monkeypatch.setattr(gpu_check, "adapter_run", off_when_compiled(gpu_check.adapter_run))
    monkeypatch.setattr(gpu_check, "functional_run", off_when_compiled(gpu_check.functional_run))
    monkeypatch.setattr(gpu_check, "accuracy", lambda device, shapes, block, solver: (1e-2, 1e-5))
    monkeypatch.setattr(gpu_check, "timing_rows", lambda *args: None)
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--only", "syncs", "accuracy", "solvers", "--out", str(report)]) == 1
    failed = [line.split(" | ")[0][2:] for line in report.read_text().splitlines() if line.endswith("**FAILED** |")]
    assert failed == [
        *COMPILED_SYNC_ROWS,
        "cn: float32 on cpu vs float64 on CPU, 12 steps, max relative difference",
        "ndb: float32 on cpu vs float64 on CPU, 12 steps, max relative difference",
        "eigh: float32 on cpu vs float64 on CPU, 12 steps, max relative difference",
    ]
    assert "1.0e-03 from eager (limit 1e-04)" in report.read_text()
    # the other way round (the device closer to float64 than the CPU's float32) passes
    monkeypatch.setattr(gpu_check, "accuracy", lambda device, shapes, block, solver: (1e-5, 1e-2))
    monkeypatch.setattr(gpu_check, "sync_and_graph_rows", lambda *args: None)
    assert gpu_check.main(["--dry-run", "--only", "syncs", "accuracy", "--out", str(report)]) == 0


MODES = (("DashConfig()", "auto"), ("DashConfig(precision='float32')", "float32"), ("eigenvalue-corrected", "auto"))


def test_gpu_check_fails_a_row_that_cuda_graphs_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "TINY_LAYER", ONE_PARAMETER)
    skips = iter(range(100))
    monkeypatch.setattr(gpu_check, "cudagraph_skips", lambda: next(skips))
    monkeypatch.setattr(gpu_check, "accuracy", lambda *args: (0.0, 0.0))
    report = tmp_path / "gpu.md"
    only = ["--only", "shipped", "syncs", "solvers"]
    assert gpu_check.main(["--dry-run", *only, "--solver", "ndb", "--out", str(report)]) == 1
    failed = [line.split(" | ")[0][2:] for line in report.read_text().splitlines() if line.endswith("**FAILED** |")]
    assert failed == [
        *(f"shipped: {mode}, block {b}, precision {precision}, tiny" for b in (8, 16) for mode, precision in MODES),
        *COMPILED_SYNC_ROWS,
        "ndb: step times, tiny",
    ]


def test_gpu_check_times_eigh_without_cuda_graphs():
    """eigh syncs (cuSOLVER's error flags), which stream capture rejects: never under CUDA graphs."""
    assert [kw.get("mode") for kw in gpu_check.compiled_variants(False, "ndb").values()] == ["reduce-overhead", None]
    assert [kw.get("mode") for kw in gpu_check.compiled_variants(False, "eigh").values()] == [None]


def test_gpu_check_starts_no_row_past_its_budget(tmp_path):
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--budget", "0", "--out", str(report)]) == 0
    out = report.read_text()
    assert "| adapter, eager | not run: 0 s of the budget left" in out
    assert "| ndb: step times, tiny | not run:" in out and "| dash_fn eager |" not in out
    assert "every check that ran passed; 29 not run (budget)" in out.splitlines()[-1]
