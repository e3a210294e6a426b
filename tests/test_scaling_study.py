"""The scaling study's machinery (benchmarks/scaling.py, scaling_report.py, train_lm --size):
its grid, the sweep's widening until the best rate is inside, and the report's arithmetic, on
synthetic runs whose answers are known in closed form."""

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

import dash_fn
from benchmarks import defaults_bench, scaling, scaling_records, scaling_report
from examples import train_lm
from examples.llama import Llama, LlamaConfig


def test_grid_is_one_and_three_per_decade():
    rates = [scaling.grid_rate(i) for i in range(-2, 10)]
    ratios = [b / a for a, b in zip(rates, rates[1:])]
    assert all(r == pytest.approx(3) or r == pytest.approx(10 / 3) for r in ratios)
    assert scaling.grid_rate(0) == 1e-4 and scaling.grid_rate(5) == 3e-2
    assert all(scaling.grid_index(r) == i for i, r in zip(range(-2, 10), rates))
    assert scaling.grid_index(2.9e-3) == scaling.grid_index(3e-3)


def fake_trainer(best_lr: float, trained: list):
    """Stands in for train_lm: a run's final loss is a parabola in log10(lr) around ``best_lr``."""

    def train(study, label, rates, seeds, progress):
        runs = []
        for lr in rates:
            for seed in seeds:
                if (label, lr, seed) in trained:
                    continue
                trained.append((label, lr, seed))
                loss = 1.0 + (math.log10(lr) - math.log10(best_lr)) ** 2
                runs.append({"optimizer": label, "lr": lr, "seed": seed, "val_loss": [loss]})
        scaling.record(study.name, runs)

    return train


@pytest.mark.parametrize("best", [3e-2, 3e-5, 1e-3])
def test_sweep_widens_until_the_best_rate_is_inside(monkeypatch, tmp_path, best):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    trained = []
    monkeypatch.setattr(scaling, "train", fake_trainer(best, trained))
    assert scaling.sweep(scaling.Study("s"), "adamw", progress=False) == pytest.approx(best)
    tried = sorted(lr for _, lr, _ in trained)
    assert tried[0] < best < tried[-1]  # inside the grid, not on its edge
    assert len(tried) == len(set(tried)) == 3 + abs(scaling.grid_index(best) - scaling.grid_index(1e-3))
    # the next size starts around this size's best rate
    trained.clear()
    scaling.sweep(scaling.Study("m"), "adamw", progress=False)
    low, center, high = sorted(lr for _, lr, _ in trained)
    assert center == best and 3 <= best / low <= 3.34 and 3 <= high / best <= 3.34


def test_sweep_gives_up_widening_at_the_grid_limit(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    trained = []
    monkeypatch.setattr(scaling, "train", fake_trainer(1e3, trained))  # the best rate is far off the grid
    scaling.sweep(scaling.Study("s"), "adamw", progress=False)
    assert len(trained) == scaling.MAX_GRID


def curve(final_steps, losses, ms_per_step, optimizer_ms):
    steps = list(range(10, 10 * len(losses) + 1, 10))
    return {
        "val_step": steps,
        "val_loss": losses,
        "val_wall": [s * ms_per_step / 1e3 for s in steps],
        "wall": final_steps * ms_per_step / 1e3,
        "timed_steps": final_steps,
        "optimizer_s": final_steps * optimizer_ms / 1e3,
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "steps": final_steps, "batch": 4, "context": 256},
        "machine": "the test's machine",
    }


def test_report_fractions_against_adamw_and_muon(monkeypatch, tmp_path):
    """AdamW ends at 2.0 after 50 steps at 10 ms; DASH passes 2.0 at step 20 (of 50) at 20 ms a step:
    0.4 of AdamW's steps and 20 * 20 / (50 * 10) = 0.8 of its seconds; it ends 0.25 below Muon."""
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    runs = [
        {"optimizer": "adamw", "lr": 1e-3, "seed": 0, **curve(50, [3.0, 2.6, 2.3, 2.1, 2.0], 10, 1)},
        {"optimizer": "adamw", "lr": 3e-3, "seed": 0, **curve(50, [3.0, 2.7, 2.4, 2.2, 2.1], 10, 1)},
        {"optimizer": "dash-defaults", "lr": 3e-3, "seed": 0, **curve(50, [2.5, 2.0, 1.9, 1.8, 1.7], 20, 8)},
        {"optimizer": "muon", "lr": 1e-2, "seed": 0, **curve(50, [2.8, 2.4, 2.2, 2.0, 1.95], 12, 3)},
    ]
    scaling.record("s", runs)
    rows = {row.split("|")[2].strip(): [c.strip() for c in row.split("|")] for row in scaling_report.size_rows("s")}
    dash = rows["dash-defaults"]
    assert dash[3] == "0.003" and dash[6] == "-0.2500" and dash[7] == "0.40" and dash[8] == "0.80 (seed 0)"
    assert dash[9] == "20" and dash[10] == "8.0 (40%)"
    assert rows["adamw"][3] == "0.001" and rows["adamw"][7] == "1.00"  # AdamW's best rate, not its last
    assert rows["muon"][7] == "0.80"  # 1.95 <= 2.0 first at step 40
    # at 524,288 tokens (512 x the runs' 1,024) forward+backward costs 12 ms x 512 = 6,144 ms against DASH's 8
    share = next(r for r in scaling_report.extrapolation("s") if "dash-defaults" in r).split("|")[-2]
    assert share.strip().endswith(f"= {8 / (8 + 12 * 512):.2%}")


def test_report_marks_an_optimizer_that_never_reaches_adamw(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    runs = [{"optimizer": "adamw", "lr": 1e-3, "seed": s, **curve(20, [2.5, 2.0], 10, 1)} for s in (0, 1)] + [
        {"optimizer": "muon", "lr": 1e-2, "seed": s, **curve(20, [2.5, 2.0 + 0.1 * s], 10, 1)} for s in (0, 1)
    ]
    scaling.record("s", runs)
    muon = next(r for r in scaling_report.size_rows("s") if "| muon |" in r)
    assert "not reached (1 of 2 seeds)" in muon
    adamw = next(r for r in scaling_report.size_rows("s") if "| adamw |" in r)
    assert "| -0.0500 ± 0.0500 |" in adamw  # paired differences 0 and -0.1: mean -0.05, s.e. 0.1 / sqrt(2) / sqrt(2)


def test_report_pairs_with_muon_only_on_one_machine(monkeypatch, tmp_path):
    """Seed 0's DASH and Muon ran on one machine (difference -0.2), seed 1's on two (-0.5 would
    come from the machines as much as the optimizers): only seed 0 counts, and the cell says so."""
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    runs = [
        {"optimizer": "muon", "lr": 1e-2, "seed": s, **curve(20, [2.5, 2.0], 10, 1), "machine": "A"} for s in (0, 1)
    ] + [
        {"optimizer": "dash-combo", "lr": 3e-3, "seed": s, **curve(20, [2.5, 1.8 - 0.3 * s], 10, 1), "machine": m}
        for s, m in ((0, "A"), (1, "B"))
    ]
    scaling.record("s", runs)
    combo = next(r for r in scaling_report.size_rows("s") if "| dash-combo |" in r).split("|")
    assert combo[6].strip() == "-0.2000 (1 of 2 seeds on another machine left out)"
    scaling.record("s", [{**runs[2], "machine": "B"}])
    combo = next(r for r in scaling_report.size_rows("s") if "| dash-combo |" in r).split("|")
    assert combo[6].strip() == "- (2 seeds, none on Muon's machine)"


def test_report_pairs_each_precision_with_float32_by_seed_on_one_machine(monkeypatch, tmp_path):
    """precision-cn-float16 against precision-cn-float32: seed 0 +0.003, seed 1 -0.002 (within
    0.005 both); bfloat16's seed 1 ran on another machine and drops out, its seed 0 is +0.008."""
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)

    def run(label, seed, final, machine="A"):
        return {"optimizer": label, "lr": 1e-3, "seed": seed, **curve(20, [2.5, final], 10, 1), "machine": machine}

    scaling.record(
        "m",
        [
            run("precision-cn-float32", 0, 2.000),
            run("precision-cn-float32", 1, 2.100),
            run("precision-cn-float16", 0, 2.003),
            run("precision-cn-float16", 1, 2.098),
            run("precision-cn-bfloat16", 0, 2.008),
            run("precision-cn-bfloat16", 1, 2.100, machine="B"),
        ],
    )
    rows = {
        row.split("|")[2].strip(): [c.strip() for c in row.split("|")] for row in scaling_report.precision_rows("m")
    }
    assert set(rows) == {"precision-cn-float16", "precision-cn-bfloat16"}
    assert rows["precision-cn-float16"][5:8] == ["+0.0005 ± 0.0025", "0: +0.0030, 1: -0.0020", "yes"]
    assert rows["precision-cn-bfloat16"][5:8] == ["+0.0080", "0: +0.0080", "no"]


@pytest.mark.parametrize("size", ["s", "m", "l"])
def test_params_of_counts_train_lms_model(size):
    args = train_lm.parse_args(["--size", size])
    config = LlamaConfig(
        d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, mlp_hidden=(8 * args.d_model) // 3
    )
    with torch.device("meta"):
        model = Llama(config)
    assert scaling_report.params_of(vars(args)) == sum(p.numel() for p in model.parameters())


def test_size_presets_keep_the_main_job_and_yield_to_explicit_options():
    default, small = train_lm.parse_args([]), train_lm.parse_args(["--size", "s"])
    assert vars(small) == {**vars(default), "size": "s"}  # s is the main job
    m = train_lm.parse_args(["--size", "m", "--steps", "7", "--d-model", "64"])
    assert (m.steps, m.d_model, m.n_layers) == (7, 64, 4)  # given options win, the rest from the preset
    assert scaling_report.params_of(vars(train_lm.parse_args(["--size", "m"]))) == 3_277_056  # the 3.3M


def fake_train_lm(monkeypatch, calls: list):
    """Replaces train_lm's process with a stand-in that writes its log of every run asked for."""

    def fake_run(command, **kwargs):
        calls.append(command)
        seeds = [int(x) for x in command[command.index("--seeds") + 1 : command.index("--runs")]]
        runs = [x for x in command[command.index("--runs") + 1 :] if "@" in x]
        logged = [
            {
                "lr": float(r.split("@")[1]),
                "seed": s,
                "val_step": [2],
                "val_loss": [1.0],
                "val_wall": [0.1],
                "timed_steps": 1,
                "optimizer_s": 0.01,
                "compile_s": 0.0,
                "wall": [0.1],
            }
            for s in seeds
            for r in runs
        ]
        model = {k: 1 for k in ["d_model", "n_layers", "n_heads", "steps", "batch", "context", "warmup"]}
        (Path(command[command.index("--out") + 1]) / "log.json").write_text(json.dumps({"args": model, "runs": logged}))
        return subprocess.CompletedProcess(command, 0)

    # subprocess.run is module-wide: machine_line (it runs uname) is replaced as well
    monkeypatch.setattr(scaling.subprocess, "run", fake_run)
    monkeypatch.setattr(scaling, "machine_line", lambda: "the test's machine")


def test_train_runs_what_is_missing_in_one_process_per_set_of_rates(monkeypatch, tmp_path):
    """train_lm is called once for the seeds that miss the same rates, with the optimizer's own
    arguments, and every run it logs is recorded (here a stand-in writes train_lm's log)."""
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    calls = []
    fake_train_lm(monkeypatch, calls)
    scaling.record("s", [{"optimizer": "dash-ndb", "lr": 1e-3, "seed": 2, "val_loss": [1.0]}])
    scaling.train(scaling.Study("s"), "dash-ndb", [1e-3, 3e-3], [0, 1, 2], progress=False)
    assert len(calls) == 2  # seeds 0 and 1 miss both rates, seed 2 only 3e-3
    assert all(x.startswith("dash-ndb@") for c in calls for x in c[c.index("--runs") + 1 :] if "@" in x)
    assert all(c[c.index("--block-size") + 1] == "128" and c[c.index("--eps") + 1] == "1e-6" for c in calls)
    recorded = {(r["lr"], r["seed"]) for r in scaling.load("s")}
    assert recorded == {(lr, s) for lr in (1e-3, 3e-3) for s in (0, 1, 2)}
    scaling.train(scaling.Study("s"), "dash-ndb", [1e-3, 3e-3], [0, 1, 2], progress=False)
    assert len(calls) == 2  # nothing left to train


def test_longer_runs_train_at_the_sweeps_rate_and_are_recorded_apart(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    calls = []
    fake_train_lm(monkeypatch, calls)
    sweep = [{"optimizer": "muon", "lr": lr, "seed": 0, "val_loss": [v]} for lr, v in ((3e-3, 1.5), (1e-2, 1.2))]
    scaling.record("l", sweep)
    scaling.main(["seeds", "--size", "l", "--seeds", "0", "1", "--steps", "1200", "--optimizers", "muon"])
    (command,) = calls
    assert command[command.index("--steps") + 1] == "1200" and command[command.index("--size") + 1] == "l"
    assert "muon@0.01" in command  # the best rate of the 600-step sweep
    assert scaling.load("l") == sweep  # the preset's file is untouched
    assert {(r["lr"], r["seed"]) for r in scaling.load("l-1200")} == {(1e-2, 0), (1e-2, 1)}
    assert scaling_records.longer_studies() == ["l-1200"]
    assert any(row.startswith("| l-1200 (") for row in scaling_report.size_rows("l-1200"))
    with pytest.raises(SystemExit):
        scaling.main(["sweep", "--size", "l", "--steps", "1200"])  # a sweep tunes at the preset's steps


def test_the_combination_the_study_ran_is_the_tuned_preset():
    """The study's dash-combo rows are DashConfig.tuned(): its figures stand for the preset."""
    name, extra = scaling.OPTIMIZERS["dash-combo"]
    assert name == "dash-defaults" and extra[0] == "--dash"
    changes = dict(train_lm.dash_field(text) for text in extra[1:])
    assert dash_fn.DashConfig().replace(**changes) == dash_fn.DashConfig.tuned() != dash_fn.DashConfig()


def label_config(label: str) -> dash_fn.DashConfig:
    """The DashConfig a dash-defaults-based study label trains (its --dash fields, later ones win)."""
    name, extra = scaling.OPTIMIZERS[label]
    assert name == "dash-defaults"
    fields = extra[extra.index("--dash") + 1 :] if "--dash" in extra else []
    return dash_fn.DashConfig().replace(**dict(train_lm.dash_field(text) for text in fields))


def test_the_labels_measured_before_the_defaults_changed_keep_their_config():
    """dash-previous is the defaults before the study (inverse 4th roots, no floor, the EMA), the
    one-option labels differ from it in their field alone, dash-defaults is DashConfig() now (the
    precision labels are today's defaults with a precision, solver or mode)."""
    previous = label_config("dash-previous")
    assert (previous.resolved_root_order, previous.eps_rel, previous.nesterov_G) == (4, 0.0, False)
    assert dash_fn.DashConfig(**defaults_bench.PREVIOUS) == previous  # the cost bench's previous defaults
    assert label_config("dash-defaults") == dash_fn.DashConfig() != previous
    for label, (name, extra) in scaling.OPTIMIZERS.items():  # every label measured before the change
        if name.startswith("dash") and not label.startswith(("dash-defaults", "dash-combo", "dash-ec", "precision-")):
            assert extra[extra.index("--dash") + 1 :][:3] == scaling.PREVIOUS, label
    options = {"dash-floor": "eps_rel", "dash-nesterov": "nesterov_G", "dash-order3": "root_order"}
    options |= {"dash-betaG95": "beta_G", "dash-freq3": "inv_root_freq", "dash-betaLR9": "beta_LR"}
    options |= {"dash-rms": "grafting", "dash-spectral": "grafting", "dash-block512": "block_size"}
    for label, field in options.items():
        config = label_config(label)
        changed = [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(previous, f.name)]
        assert changed == [field], label


def test_rate_table_divides_each_best_rate_by_the_bases(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    finals = {("muon", 3e-3): 2.1, ("muon", 1e-2): 2.0, ("dash-combo", 6e-3): 1.8, ("dash-combo", 1.2e-2): 1.9}
    runs = [{"optimizer": k, "lr": lr, "seed": 0, **curve(20, [2.5, v], 10, 1)} for (k, lr), v in finals.items()]
    scaling.record("s", runs)
    table = scaling_report.rate_table(["s"], "muon").splitlines()
    assert table[0] == "| size | dash-defaults | dash-previous | dash-ndb | dash-combo |"
    assert table[2] == "| s | - | - | - | 0.6 |"  # 6e-3 / 1e-2, the best rates


def test_the_precision_labels_are_todays_defaults_with_a_precision():
    """precision-P, precision-cn-P and precision-ec-P: DashConfig() with precision P, and coupled
    Newton or the eigenvalue-corrected mode with orthogonal-iteration bases, nothing else."""
    for precision in scaling.PRECISIONS:
        assert label_config(f"precision-{precision}") == dash_fn.DashConfig(precision=precision)
        assert label_config(f"precision-cn-{precision}") == dash_fn.DashConfig(precision=precision, solver="cn")
        corrected = dash_fn.DashConfig(precision=precision, preconditioner="eigenvalue_corrected", solver="qr")
        assert label_config(f"precision-ec-{precision}") == corrected


def meta_params(args) -> int:
    """train_lm's model's parameter count, built on the meta device (independent of params_of)."""
    config = LlamaConfig(
        d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, mlp_hidden=(8 * args.d_model) // 3
    )
    with torch.device("meta"):
        return sum(p.numel() for p in Llama(config).parameters())


@pytest.mark.parametrize("size", ["s", "m"])
@pytest.mark.parametrize(("budget", "batch"), [(1, 128), (5, 128), (20, 128), (40, 128), (20, 512)])
def test_a_data_budget_trains_its_tokens_per_parameter_at_its_batch(size, budget, batch):
    study = scaling.Study(size, tokens_per_param=budget, batch=batch)
    assert study.name == f"{size}-tpp{budget}-b{batch}" and study.factor == 2
    assert scaling.Study(size, tokens_per_param=budget).batch == 128  # 8x the presets' 16 sequences
    args = train_lm.parse_args(["--size", size, *study.arguments()])
    preset = train_lm.parse_args(["--size", size])
    params, per_step = meta_params(args), args.batch * args.context
    assert args.batch == batch and preset.batch == 16 and args.context == preset.context
    assert abs(args.steps * per_step - budget * params) <= per_step / 2  # the nearest whole step
    # the warm-up keeps the preset's share of the steps, to within a step's rounding
    assert abs(args.warmup / args.steps - preset.warmup / preset.steps) <= 1 / args.steps
    assert 15 <= args.steps // args.eval_every <= 40 or args.eval_every == 1
    train, _ = train_lm.stdlib_corpus(args.corpus_bytes)
    assert len(train) > 12_000_000  # the whole standard library, not the presets' 4 MB


def test_the_data_axis_grid_doubles():
    rates = [scaling.grid_rate(i, 2) for i in range(-5, 6)]
    assert scaling.grid_rate(0, 2) == 1e-3
    assert all(b / a == pytest.approx(2, rel=1e-2) for a, b in zip(rates, rates[1:]))
    assert all(scaling.grid_index(r, 2) == i for i, r in zip(range(-5, 6), rates))


def test_a_data_budget_sweeps_from_its_sizes_best_rate_and_is_recorded_apart(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    preset = [{"optimizer": "adamw", "lr": lr, "seed": 0, "val_loss": [v]} for lr, v in ((1e-3, 1.4), (3e-3, 1.2))]
    scaling.record("s", preset)
    trained = []
    monkeypatch.setattr(scaling, "train", fake_trainer(1e-2, trained))
    best = scaling.sweep(scaling.Study("s", tokens_per_param=20), "adamw", progress=False)
    assert best == pytest.approx(1e-2, rel=0.3)  # the factor-2 rate nearest 1e-2 (8e-3)
    tried = sorted(lr for _, lr, _ in trained)
    assert all(b / a == pytest.approx(2, rel=1e-2) for a, b in zip(tried, tried[1:]))
    assert tried[0] == pytest.approx(2e-3)  # it starts around the preset's 3e-3: 2e-3, 4e-3, 8e-3
    assert tried[0] < best < tried[-1]
    assert scaling.load("s") == preset and scaling_records.data_studies() == ["s-tpp20-b128"]
    assert scaling_records.longer_studies() == []


def test_the_seeds_of_a_data_budget_train_at_its_own_best_rate(monkeypatch, tmp_path):
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    calls = []
    fake_train_lm(monkeypatch, calls)
    scaling.record("s", [{"optimizer": "muon", "lr": 1e-2, "seed": 0, "val_loss": [1.0]}])
    sweep = [{"optimizer": "muon", "lr": lr, "seed": 0, "val_loss": [v]} for lr, v in ((4e-3, 1.1), (8e-3, 1.3))]
    scaling.record("s-tpp5-b256", sweep)
    scaling.main(
        ["seeds", "--size", "s", "--tokens-per-param", "5", "--batch", "256", "--seeds", "1", "--optimizers", "muon"]
    )
    (command,) = calls
    assert "muon@0.004" in command and command[command.index("--batch") + 1] == "256"
    assert {(r["lr"], r["seed"]) for r in scaling.load("s-tpp5-b256")} == {(4e-3, 0), (8e-3, 0), (4e-3, 1)}
    with pytest.raises(SystemExit):
        scaling.main(["seeds", "--size", "s", "--tokens-per-param", "5", "--steps", "100"])


def test_report_gives_the_data_axis_against_muon_and_adamw(monkeypatch, tmp_path):
    """At a budget, DASH ends 0.02 and 0.04 below Muon on seeds 0 and 1 (paired: -0.03 ± 0.01)
    and passes AdamW's final 2.0 at step 20 of 50 at twice and three times its step time: 0.4 of
    its steps, 0.8 and 1.2 of its seconds. The size's preset study is a point of the same plot."""
    monkeypatch.setattr(scaling_records, "RESULTS", tmp_path)
    runs = []
    for seed, gap in ((0, 0.02), (1, 0.04)):
        runs += [
            {"optimizer": "adamw", "lr": 1e-3, "seed": seed, **curve(50, [3.0, 2.6, 2.3, 2.1, 2.0], 10, 1)},
            {"optimizer": "muon", "lr": 1e-2, "seed": seed, **curve(50, [2.8, 2.4, 2.2, 2.0, 1.9], 12, 3)},
            {
                "optimizer": "dash-defaults",
                "lr": 3e-3,
                "seed": seed,
                **curve(50, [2.5, 2.0, 1.95, 1.9, 1.9 - gap], 20 + 10 * seed, 8),
            },
        ]
    scaling.record("s-tpp20-b128", runs)
    scaling.record(
        "s",
        [
            {**r, "val_loss": [*r["val_loss"][:-1], r["val_loss"][-1] + 0.1 * (r["optimizer"] == "dash-defaults")]}
            for r in runs
        ],
    )
    (row,) = scaling_report.data_rows(["s-tpp20-b128"])
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # curve's model: 50 steps of 4 x 256 tokens over params_of(d 32, 1 layer)
    model = runs[0]["model"]
    assert cells[1] == f"{50 * 4 * 256 / scaling.params_of(model):.2f}" and cells[2] == "1,024" and cells[3] == "50"
    assert cells[4] == "-0.0300 ± 0.0100" and cells[5] == "0.40" and cells[6] == "1.00 (seeds 0: 0.80, 1: 1.20)"
    (preset,) = scaling_report.data_rows(["s"])
    assert "| +0.0700 ± 0.0100 |" in preset
    scaling.record("m-tpp2-b128", [r for r in runs if r["optimizer"] != "adamw"])
    (without_adamw,) = scaling_report.data_rows(["m-tpp2-b128"])
    assert without_adamw.endswith("| -0.0300 ± 0.0100 | no AdamW run | no AdamW run |")
    # AdamW's seed 1 trained on another machine: its steps still count, its seconds do not compare
    adamw = [{**r, "machine": "B"} if r["seed"] else r for r in runs if r["optimizer"] == "adamw"]
    scaling.record("m-tpp2-b128", adamw)
    (seed_apart,) = scaling_report.data_rows(["m-tpp2-b128"])
    assert seed_apart.endswith("| -0.0300 ± 0.0100 | 0.40 | 0.80 (seed 0) |")
    scaling.record("m-tpp2-b128", [{**r, "machine": "B"} for r in runs if r["optimizer"] == "adamw"])
    (elsewhere,) = scaling_report.data_rows(["m-tpp2-b128"])
    assert elsewhere.endswith("| -0.0300 ± 0.0100 | 0.40 | AdamW on another machine |")
    dash = next(r for r in scaling_report.size_rows("m-tpp2-b128") if "| dash-defaults |" in r).split("|")
    assert dash[7].strip() == "0.40" and dash[8].strip() == "AdamW on another machine"
    path = scaling_report.plot_data_axis(["s", "s-tpp20-b128"], tmp_path)
    assert path.exists() and path.stat().st_size > 0
