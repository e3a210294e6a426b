"""benchmarks/defaults_bench.py runs (tiny model, CPU) and prints one row per configuration."""

from benchmarks import defaults_bench


def test_defaults_bench_quick(capsys):
    rows = defaults_bench.main(["--quick"])
    out = capsys.readouterr().out
    assert "| configuration | solver | block | inv_root_freq | ms / step (median) | min - max | x AdamW |" in out
    table = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 7 and cells[0] != "configuration" and not cells[0].startswith("---"):
            table[cells[0]] = cells
    assert list(table) == [
        label for key, (label, _) in defaults_bench.configurations().items() if key not in ("tuned", "previous")
    ]
    assert table["DASH(params) new defaults"][1:4] == ["auto (eigh)", "256", "10"]
    assert table['old defaults: solver="ndb", inv_root_freq=1'][1:4] == ["ndb", "1024", "1"]
    assert table["DashConfig.paper()"][1:4] == ["ndb", "1024", "1"]
    assert table["main job: block_size=128, inv_root_freq=10"][1:4] == ["auto (eigh)", "128", "10"]
    assert table["torch AdamW (foreach)"][1:4] == ["-", "-", "-"]
    assert table["torch AdamW (foreach)"][6] == "1.0"
    assert all(row["ms"] > 0 and row["min"] <= row["ms"] <= row["max"] for row in rows)
    assert "Machine:" in out and "windows of 10 steps" in out


def test_defaults_bench_times_peers_model(capsys):
    defaults_bench.main(["--quick", "--peers-model", "16", "--only", "defaults", "tuned"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["configuration", "DASH(params) new defaults", "DashConfig.tuned()", "torch AdamW (foreach)"]
    tuned = next(line for line in out.splitlines() if line.startswith("| DashConfig.tuned()"))
    assert [c.strip() for c in tuned.split("|")[2:5]] == ["auto (eigh)", "256", "3"]
    assert "windows of 30 steps" in out  # the least common multiple of the periods 10 and 3
    assert "3 x Linear(16, 16) with bias; 816 parameters" in out  # 3 x (16 x 16 + 16)
