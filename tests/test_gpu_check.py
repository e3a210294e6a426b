"""benchmarks/gpu_check.py on the CPU (its dry run: tiny shapes, aot_eager, the accelerator
strategy simulated): every row runs, and a failed, wrong or CUDA-graph-skipped row fails the run.
Apart from tests/test_benchmark_scripts.py so that pytest's workers run the two files side by side."""

import time

from benchmarks import gpu_check


def test_gpu_check_dry_run(tmp_path):
    """Every section and row of the GPU check in its order, each with its seconds: (a) the
    shipped DashConfig() through the tensor-core stand-in ("auto" resolved as on a GPU, the
    stand-in called) and (b) its float32 twin against float64, (c) Distributed Shampoo where
    installed, (d) AdamW and Muon, (e) a whole training step, then the syncs, accuracy, the
    solvers' table, each precision against a raw torch.bmm's peak, the bits across stack
    lengths and the variants. A dry run has no budget: every row runs, however slow the
    machine. A tool test that stays: a GPU run is rare and short, and a script that breaks on
    it wastes the run. (Not marked compat: `make compat` runs the same dry run on torch 2.11,
    the GPU image's release, through gpu_day.sh.)"""
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--solver", "ndb", "--out", str(report)]) == 0
    out = report.read_text()
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert "DashConfig(): float16 products (tensor_core)" in out.splitlines()[0]
    shipped = next(
        line for line in rows if line.startswith("| (a) DashConfig(), block 16, compiled (aot_eager), tiny |")
    )
    assert "| float16 products (tensor_core); " in shipped and "finite; " in shipped and "(limit 2e-04)" in shipped
    assert int(shipped.split(" tensor-core calls (the stand-in)")[0].split("; ")[-1]) > 0
    assert (
        "| (b) DashConfig(precision='float32'), block 16, compiled (aot_eager), tiny | float32 products (plain); "
        in out
    )
    # Meta's Distributed Shampoo is not on PyPI: timed where its wheel is installed, else said so
    assert "| (c) distributed shampoo, cn roots, block 16, bfloat16, tiny | " in out or "is not installed" in out
    assert "| (d) torch AdamW (foreach), tiny | float32 (torch); " in out and "| (d) torch Muon, tiny | " in out
    assert "| dash-defaults@0.001 | 1 |" in out and "| muon@0.003 | 1 |" in out  # train_lm's summary
    assert "DASH's default: float16 products (tensor_core)" in out
    # the solvers section's table for NDB (its code is the same at cn, which the precision
    # section times at each precision, and eigh, whose rule has its own test below)
    assert "| dash_fn compiled (aot_eager) | tiny | 16 | ndb |" in out
    for solver in ("cn", "ndb", "eigh"):
        assert f"| {solver}: float32 on cpu vs float64 on CPU" in out
    assert "sequential per-block" in out and "torch AdamW (foreach)" in out
    assert "| adapter, eager | float32 products (plain); no sync in 5 steps (" in out  # the simulated strategy
    assert "| functional step, compiled | float32 products (plain); ran 5 steps" in out
    assert "| functional step, the defaults (auto: coupled Newton, cube roots), compiled | float16 products (" in out
    for precision in gpu_check.PRECISIONS:
        assert f"| precision {precision}: coupled Newton step times, tiny | {precision} products (" in out
        assert f"{precision}: peak of a raw torch.bmm of its operands " in out
    for precision in ("float32", "float16"):
        assert f"| bits across stack lengths, {precision}, block 16, tiny | {precision} products (" in out
    assert out.count("the same bits in stacks of 8, 5, 3, 1; the layer's parameters stepped apart end 0.0e+00") == 2
    assert "| variant: DashConfig(block_size=32), tiny | float16 products (tensor_core); compiled " in out
    assert "| variant: eigenvalue-corrected, tiny | float32 products (plain); compiled " in out
    order = [row.split(" | ")[0][2:].split(":")[0].split(",")[0] for row in rows]
    firsts = [order.index(name) for name in ("(a) DashConfig()", "(d) torch AdamW (foreach)", "(e) training")]
    assert firsts == sorted(firsts) and firsts[-1] < order.index("adapter")  # (a)-(e) before the rest
    timed = [row for row in rows if row.startswith(("| (", "| precision", "| bits", "| variant"))]
    assert all(row.endswith(" s) |") for row in timed if "is not installed" not in row)
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
            return steps, lambda: {k: v * (1 + 1e-2) for k, v in params().items()}

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
    assert "1.0e-02 from eager (limit 1e-04)" in report.read_text()
    assert "1.0e-02 from eager (limit 3e-03)" in report.read_text()  # the defaults' float16 products
    # the other way round (the device closer to float64 than the CPU's float32) passes
    monkeypatch.setattr(gpu_check, "accuracy", lambda device, shapes, block, solver: (1e-5, 1e-2))
    monkeypatch.setattr(gpu_check, "sync_and_graph_rows", lambda *args: None)
    assert gpu_check.main(["--dry-run", "--only", "syncs", "accuracy", "--out", str(report)]) == 0


def test_gpu_check_fails_a_row_that_cuda_graphs_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "TINY_LAYER", ONE_PARAMETER)
    skips = iter(range(100))
    monkeypatch.setattr(gpu_check, "cudagraph_skips", lambda: next(skips))
    monkeypatch.setattr(gpu_check, "accuracy", lambda *args: (0.0, 0.0))
    report = tmp_path / "gpu.md"
    only = ["--only", "shipped", "syncs", "solvers", "variants"]
    assert gpu_check.main(["--dry-run", *only, "--solver", "ndb", "--out", str(report)]) == 1
    failed = [line.split(" | ")[0][2:] for line in report.read_text().splitlines() if line.endswith("**FAILED** |")]
    assert failed == [
        "(a) DashConfig(), block 16, compiled (aot_eager), tiny",
        "(b) DashConfig(precision='float32'), block 16, compiled (aot_eager), tiny",
        *COMPILED_SYNC_ROWS,
        "ndb: step times, tiny",
        "variant: DashConfig(block_size=32), tiny",
        "variant: eigenvalue-corrected, tiny",
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
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert all("| not run: 0 s of the budget left, about " in row for row in rows if "distributed_shampoo" not in row)
    assert f"every check that ran passed; {len(rows) - ('is not installed' in out)} not run (budget)" in out


def test_gpu_check_cuts_a_row_that_runs_past_the_deadline(tmp_path, monkeypatch, capfd):
    """A row still running when the budget ends is cut there: its row says where it was (the
    log has the traceback), the rows after it do not start, and the report is written."""

    slept = []

    def slow(*args):
        time.sleep(60)
        slept.append(True)

    monkeypatch.setattr(gpu_check, "accuracy", slow)
    monkeypatch.setitem(gpu_check.NEED, "accuracy", 0)
    report = tmp_path / "gpu.md"
    assert gpu_check.main(["--dry-run", "--only", "accuracy", "--budget", "2", "--out", str(report)]) == 0
    assert slept == []  # cut inside the sleep, not after it
    out = report.read_text()
    cut = "| cn: float32 on cpu vs float64 on CPU, 12 steps, max relative difference | cut at the deadline after "
    assert cut in out
    assert "RowCut: the deadline passed inside this row" in out and "test_gpu_check.py:" in out and " slow) |" in out
    assert "| ndb: float32 on cpu vs float64 on CPU, 12 steps, max relative difference | not run: 0 s" in out
    assert out.splitlines()[-1].startswith("every check that ran passed; 3 not run (budget)")
    assert "in slow" in capfd.readouterr().err  # the traceback where it was cut, in the log


def test_gpu_check_answers_a_to_e_inside_one_gpu_command():
    """The plan of a GPU run: the rows (a)-(e) (two shipped, two Distributed Shampoo, AdamW,
    Muon and the training step) start inside the budget by their estimated needs, and the
    budget and the watchdog fit gpu_day.sh's 8-minute command."""
    need = gpu_check.NEED
    first = 2 * need["shipped"] + 2 * need["distributed shampoo"] + 2 * need["torch step"] + need["training"]
    assert first <= gpu_check.GPU_BUDGET
    assert gpu_check.GPU_BUDGET + gpu_check.WATCHDOG_AFTER + 30 <= 8 * 60  # gpu_day.sh's start: about 30 s
    assert gpu_check.SECTIONS[:3] == ("shipped", "peers", "training")


def test_gpu_check_fails_a_shipped_row_off_its_limits(tmp_path, monkeypatch):
    """(a) and (b) fail when the parameters are not finite or further from float64 than their
    precision's limit, and (a), whose products are float16, also when it ends as close to
    float64 as float32 would (its products were not 16-bit)."""
    found = {}
    monkeypatch.setattr(gpu_check, "shipped_check", lambda *args: (found, 1e-3))
    report = tmp_path / "gpu.md"

    def failed(**result) -> list[str]:
        found.clear()
        found.update(result)
        gpu_check.main(["--dry-run", "--only", "shipped", "--out", str(report)])
        return [line.split(" | ")[0][2:6] for line in report.read_text().splitlines() if line.endswith("**FAILED** |")]

    assert failed(finite=True, error=1e-7) == ["(a) "]  # closer than float32's limit: not float16
    assert "(closer than float32's limit 1e-06)" in report.read_text()
    assert failed(finite=True, error=5e-5) == ["(b) "]  # float16's rounding; beyond float32's limit
    assert failed(finite=True, error=1.0) == ["(a) ", "(b) "]
    assert failed(finite=False, error=1e-7) == ["(a) ", "(b) "]
    assert "NOT FINITE" in report.read_text()
