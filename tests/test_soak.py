"""benchmarks/soak.py at 300 steps (aot_eager): faults injected as data never recompile, the
guard skips exactly the NaN, Inf and 1e30-scaled steps, and the parameters stay finite."""

from benchmarks import soak


def test_fault_schedule_is_deterministic_and_cycles():
    a = soak.fault_schedule(1000, 100, seed=3, n_params=9)
    assert a == soak.fault_schedule(1000, 100, seed=3, n_params=9)
    assert len(a) == 9 and min(a) > 100  # the first window is the warm-up
    assert [f["kind"] for _, f in sorted(a.items())] == list(soak.KINDS) + list(soak.KINDS[:4])
    assert all(j * 100 < t <= (j + 1) * 100 for j, t in enumerate(sorted(a), start=1))


def test_soak_300_steps(capsys):
    r = soak.main(["--steps", "300", "--every", "30", "--backend", "aot_eager", "--no-progress"])
    out = capsys.readouterr().out
    assert r["faults"] == {"nan": 2, "inf": 2, "zero": 2, "scale": 2, "lr_spike": 1}
    assert r["params_finite"]
    assert r["expected_skips"] == 6 and r["skipped"] == 6 and r["skips_at_fault_steps"]
    assert r["bitwise_unchanged_on_skips"] and r["bitwise_checked"] == 6
    assert r["recompiles_after_warmup"] == 0 and r["compile_events_after_warmup"] == 0 and r["graph_breaks"] == 0
    assert r["clean_skipped"] == 0 and r["clean_params_finite"]
    assert r["ok"] and not r["failures"]
    assert "All invariants hold." in out and "| faults injected | 9:" in out
