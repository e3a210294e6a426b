"""Each example runs for a few steps at tiny size, so that none of them rots."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import root_on_path
from examples import train_lm

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.compat
def test_train_lm_tiny(tmp_path):
    out = tmp_path / "run"
    train_lm.main(
        [
            "--runs",
            "adamw@3e-3",
            "dash-eigh@3e-3",
            "--steps",
            "4",
            "--eval-every",
            "2",
            "--eval-batches",
            "1",
            "--d-model",
            "32",
            "--n-layers",
            "1",
            "--n-heads",
            "2",
            "--context",
            "16",
            "--batch",
            "2",
            "--block-size",
            "32",
            "--corpus-bytes",
            "200000",
            "--backend",
            "aot_eager",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    log = json.loads((out / "log.json").read_text())
    assert [r["optimizer"] for r in log["runs"]] == ["adamw", "dash-eigh"]
    for run in log["runs"]:
        assert len(run["train_loss"]) == 4 and run["val_step"] == [2, 4]
        assert all(loss > 0 for loss in run["train_loss"] + run["val_loss"])
    assert (out / "loss.png").stat().st_size > 10_000
    assert "| dash-eigh@0.003 | 1 |" in (out / "summary.md").read_text()


TINY = [
    "--steps",
    "4",
    "--eval-every",
    "2",
    "--eval-batches",
    "1",
    "--d-model",
    "32",
    "--n-layers",
    "1",
    "--n-heads",
    "2",
    "--context",
    "16",
    "--batch",
    "2",
    "--corpus-bytes",
    "200000",
    "--backend",
    "aot_eager",
    "--no-progress",
]


def test_train_lm_peers_and_wall_clock_columns(tmp_path):
    """Muon beside AdamW (SOAP and PSGDKron too where HeavyBall, the bench extra, is installed);
    the summary gives steps and seconds to AdamW's final loss and the loss at AdamW's time."""
    import importlib.util

    runs = ["adamw@3e-3", "muon@3e-3"] + (["soap@3e-3", "psgd@3e-3"] if importlib.util.find_spec("heavyball") else [])
    out = tmp_path / "run"
    train_lm.main(["--runs", *runs, *TINY, "--out", str(out)])
    log = json.loads((out / "log.json").read_text())
    assert [r["optimizer"] for r in log["runs"]] == [r.split("@")[0] for r in runs]
    adamw = log["runs"][0]
    for run in log["runs"][1:]:
        assert run["train_loss"] != adamw["train_loss"]  # another optimizer really ran
        assert all(0 < loss < 10 for loss in run["train_loss"] + run["val_loss"])
    for run in log["runs"]:  # the optimizer's part of the timed steps: neither nothing nor all of it
        assert 0 < run["optimizer_s"] < run["wall"][-1]
    summary = (out / "summary.md").read_text()
    assert "seconds to it (mean) | fraction of AdamW's seconds | val loss at AdamW's seconds" in summary
    assert "| optimizer ms / step (share) |" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| adamw@0.003 |")).split("|")
    assert row[5].strip() == "1.00" and row[7].strip() == "1.00" and float(row[8]) == adamw["val_loss"][-1].__round__(4)


def test_train_lm_dash_hidden_only_gives_adamw_the_rest(tmp_path):
    """--dash-hidden-only (the scaling study's fairness row): after one step, the embedding, the
    head and the vectors of a DASH run are AdamW's bit for bit (same gradients on step 1), its
    hidden matrices are not; every run logs its update size at evaluated steps."""
    one_step = [*TINY, "--steps", "1", "--eval-every", "1", "--backend", "none", "--block-size", "32"]
    path = tmp_path / "final.pt"
    runs = ["adamw@3e-3", "dash-eigh@3e-3"]
    train_lm.main(
        ["--runs", *runs, *one_step, "--dash-hidden-only", "--save-params", str(path), "--out", str(tmp_path)]
    )
    final = torch.load(path)
    adamw, dash = final["adamw@0.003 seed 0"], final["dash-eigh@0.003 seed 0"]
    hidden = [k for k, v in adamw.items() if train_lm.is_hidden(k, v)]
    assert hidden and len(hidden) < len(adamw)
    for k in adamw:
        assert torch.equal(adamw[k], dash[k]) == (k not in hidden), k
    log = json.loads((tmp_path / "log.json").read_text())
    assert all(len(r["update_rms"]) == 1 and r["update_rms"][0] > 0 for r in log["runs"])


def test_muon_float32_is_torchs_iteration_in_float32(monkeypatch, tmp_path):
    """--muon-float32 swaps in train_lm.newton_schulz_float32, which agrees with torch.optim.Muon's
    bfloat16 iteration to bfloat16's precision, for tall and wide matrices."""
    import torch.optim._muon as muon

    torchs = muon._zeropower_via_newtonschulz
    for shape in [(60, 24), (24, 60)]:
        g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        ours, theirs = (
            train_lm.newton_schulz_float32(g, (3.4445, -4.775, 2.0315), 5, 1e-7),
            torchs(g, (3.4445, -4.775, 2.0315), 5, 1e-7),
        )
        assert ours.dtype == torch.float32 and ours.shape == theirs.shape
        assert (ours - theirs.float()).abs().max() < 0.03 * theirs.float().abs().max()
    monkeypatch.setattr(muon, "_zeropower_via_newtonschulz", torchs)  # restored after the test
    train_lm.main(["--runs", "muon@3e-3", *TINY, "--steps", "1", "--muon-float32", "--out", str(tmp_path)])
    assert muon._zeropower_via_newtonschulz is train_lm.newton_schulz_float32


@pytest.mark.parametrize("final", [0.1, 0.0, 0.5])
def test_lr_schedule_warms_up_then_decays_to_its_final_fraction(final):
    from examples import compiled_step

    lr = lambda t: compiled_step.lr_at(t, 100, 2e-3, warmup=10, final=final)
    assert lr(5) == pytest.approx(1e-3) and lr(10) == pytest.approx(2e-3)
    assert lr(55) == pytest.approx(2e-3 * (1 + final) / 2)  # half way through the cosine
    assert lr(100) == pytest.approx(2e-3 * final)
    assert all(lr(t) >= lr(t + 1) for t in range(10, 100))


def test_train_lm_refuses_a_final_lr_outside_0_1():
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--final-lr", "1.5"])


def test_progress_bars_print_plain_lines_off_a_terminal(capfd):
    """Where stderr is not a terminal (a log file, CI) the examples' bars print a plain line at
    each tenth of the run, with the last postfix and no carriage return; disabled, nothing."""
    bar = train_lm.progress_bar(range(1, 201), desc="run")
    for t in bar:
        bar.set_postfix(loss=f"{1 / t:.3f}")
    for _ in train_lm.progress_bar(range(5), desc="silent", enabled=False):
        pass
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == "run: 20/200 loss=0.050" and lines[-1] == "run: 200/200 loss=0.005"
    assert len(lines) == 10 and not any("\r" in line for line in lines)


def test_stdlib_corpus_is_deterministic_and_split():
    a_train, a_val = train_lm.stdlib_corpus(300_000)
    b_train, b_val = train_lm.stdlib_corpus(300_000)
    assert len(a_train) > 200_000 and len(a_val) > 10_000
    assert len(a_train) + len(a_val) >= 300_000
    assert (a_train == b_train).all() and (a_val == b_val).all()


@pytest.mark.compat
def test_quickstart_runs():
    result = subprocess.run(
        [sys.executable, "-W", "error:::__main__", str(ROOT / "examples" / "quickstart.py"), "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "DASH (eigh) loss" in result.stdout


@pytest.mark.compat
def test_cnn_digits_runs(capsys):
    from examples import cnn_digits

    cnn_digits.main(["--steps", "3"])
    out = capsys.readouterr().out
    assert "2.weight     (32, 16, 3, 3)     viewed as (32, 144)" in out
    assert "dash   lr 0.003: test loss" in out


def test_ddp_train_with_torchrun_two_ranks():
    """The DDP example under torchrun on 2 gloo ranks: it trains, halves the state, ranks agree."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--module",
        "examples.ddp_train",
    ]
    tiny = [
        "--steps",
        "3",
        "--d-model",
        "32",
        "--n-layers",
        "1",
        "--batch",
        "2",
        "--context",
        "16",
        "--block-size",
        "16",
        "--corpus-bytes",
        "100000",
        "--no-progress",
    ]
    result = subprocess.run(command + tiny, env=root_on_path(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "parameters bitwise identical on all ranks: True" in result.stdout
    per_rank = result.stdout.split("optimizer state bytes per rank: ")[1].splitlines()[0]
    assert per_rank.count("B/param") == 2
    single = subprocess.run(
        [sys.executable, "-m", "examples.ddp_train", *tiny],
        env=root_on_path(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]
    whole = int(single.stdout.split("optimizer state bytes per rank: ")[1].split()[0])
    halves = [int(part.split()[0]) for part in per_rank.split(", ")]
    assert max(halves) < 0.6 * whole and sum(halves) >= whole


def test_fsdp_train_checkpoints_resume_exactly_and_at_another_world_size(tmp_path):
    """The FSDP2 example under torchrun on 2 gloo ranks saves DCP checkpoints at steps 2 and 4.
    Resumed from step 2 on the same 2 ranks it ends bitwise where the uninterrupted run ended
    (same printed digits); resumed on 1 process (resharded) it ends on the same loss up to the
    summation order of the gradient reduce-scatter. A resume that lost the optimizer state
    lands about 0.04 away at these sizes, so the tolerance is 1e-3, not a loose 1%."""
    module = ["-m", "examples.fsdp_train"]
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *module,
    ]  # a free port
    tiny = [
        "--steps",
        "4",
        "--d-model",
        "32",
        "--n-layers",
        "1",
        "--batch",
        "2",
        "--context",
        "16",
        "--block-size",
        "16",
        "--corpus-bytes",
        "100000",
        "--no-progress",
    ]

    def run(command):
        result = subprocess.run(command, env=root_on_path(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def val_loss(stdout):
        return stdout.split("final validation loss: ")[1].split()[0]

    ckpt = tmp_path / "ckpt"
    whole = run(torchrun + tiny + ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"])
    assert (ckpt / "step_2" / ".metadata").exists() and f"checkpoint written: {ckpt / 'step_4'}" in whole
    assert whole.split("optimizer state bytes per rank: ")[1].splitlines()[0].count("B/param") == 2
    same = run(torchrun + tiny + ["--resume", str(ckpt / "step_2")])
    assert "steps 3-4, resumed from" in same
    assert val_loss(same) == val_loss(whole)
    single = run([sys.executable, *module, *tiny, "--resume", str(ckpt / "step_2")])
    assert "ranks 1," in single
    assert abs(float(val_loss(single)) - float(val_loss(whole))) < 1e-3


def test_train_lm_progress_bar_says_when_a_step_compiles(monkeypatch, tmp_path):
    """While a step's graphs compile the bar says so (its first rates count compile time);
    the later steps' postfix shows the step time and the compile seconds apart."""
    import tqdm

    events = []

    class Bar:
        def __init__(self, iterable, **kwargs):
            self.iterable = iterable

        def __iter__(self):
            for t in self.iterable:
                events.append(("step", t))
                yield t

        def set_postfix_str(self, text):
            events.append(("note", text))

        def set_postfix(self, **fields):
            events.append(("postfix", fields))

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the tqdm bar
    with_bar = [a for a in TINY if a != "--no-progress"]
    train_lm.main(["--runs", "dash-eigh@3e-3", *with_bar, "--block-size", "32", "--out", str(tmp_path)])
    notes, t = {}, None
    for kind, value in events:  # the notes set within each step
        if kind == "step":
            t, notes[value] = value, []
        elif kind == "note":
            notes[t].append(value)
    assert all("compiling" in notes[t][0] for t in (1, 2)) and notes[3] == notes[4] == []
    assert [e[1] for e in events if e[0] == "postfix"][-1]["compile_s"].isdigit()
