"""Tables and plots of the scaling study from ``benchmarks/results/scaling/*.json`` (``python
-m benchmarks.scaling report``): the sweeps, each optimizer at its best rate per size, the
learning-rate ratios to AdamW, the optimizer's share of a train step extrapolated to larger
batches, and the data axis (DASH against Muon and AdamW at budgets of tokens per parameter)."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

from benchmarks.scaling_records import SIZES, best_rate, data_studies, load, longer_studies, params_of

COLORS = {
    "adamw": "C0",
    "muon": "C3",
    "dash-defaults": "C1",
    "dash-ndb": "C2",
    "dash-combo": "C4",
    "dash-previous": "C5",
}
# the optimizers of the rate table and the plots: Muon and the candidates for DASH's defaults
HEADLINE = ("muon", "dash-defaults", "dash-previous", "dash-ndb", "dash-combo")
# tokens per step of the extrapolation: a large-batch language-model step (e.g. 256 sequences of 2,048)
LARGE_BATCH = 524_288
# the head of size_rows' table; its first column names the results file
ROWS_HEAD = (
    "| {} | optimizer | lr | seeds | final val loss (mean ± std) | minus Muon's (paired: mean ± s.e.) | "
    "fraction of AdamW's steps to its final loss | fraction of AdamW's seconds | ms / step | "
    "optimizer ms / step (share) |\n|---|---|---|---|---|---|---|---|---|---|"
)


def mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {spread:.4f}"


def standard_error(differences: list[float]) -> float:
    """The standard error of the mean of per-seed differences (0 for one seed)."""
    return statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0


def paired(differences: list[float]) -> str:
    """Mean ± standard error of per-seed differences (a seed fixes data order and initial weights)."""
    if len(differences) < 2:
        return f"{statistics.mean(differences):+.4f}"
    return f"{statistics.mean(differences):+.4f} ± {standard_error(differences):.4f}"


def muon_gaps(runs: list[dict], muon: dict[int, dict]) -> tuple[list[float], int]:
    """Each run's final loss minus Muon's run of the same seed, over the seeds whose two runs
    were made on one machine (final losses differ between machines by more than some gaps
    measured), and how many seeds were left out for that. One machine is one ``machine`` line:
    CPU, torch release, threads and Python alike; a run without the line pairs with nothing."""
    pairs = [(r, muon[r["seed"]]) for r in runs if r["seed"] in muon]
    same = [r["val_loss"][-1] - m["val_loss"][-1] for r, m in pairs if on_one_machine(r, m)]
    return same, len(pairs) - len(same)


def on_one_machine(run: dict, other: dict) -> bool:
    """Whether two runs share one ``machine`` line (a run without the line shares none)."""
    return "machine" in run and run["machine"] == other.get("machine")


def versus_muon(runs: list[dict], muon: dict[int, dict]) -> str:
    """The paired difference to Muon's run of the same seed (:func:`muon_gaps`)."""
    same, apart = muon_gaps(runs, muon)
    pairs = len(same) + apart
    if not same:
        return f"- ({apart} seeds, none on Muon's machine)" if apart else "-"
    return paired(same) + (f" ({apart} of {pairs} seeds on another machine left out)" if apart else "")


def first_reach(run: dict, target: float) -> tuple[int, float] | None:
    """(step, train-step seconds) of the run's first evaluation at or below ``target``."""
    return next(((s, w) for s, w, v in zip(run["val_step"], run["val_wall"], run["val_loss"]) if v <= target), None)


def step_fractions(at_best: dict[str, list[dict]], label: str) -> list[tuple[dict, tuple[int, float] | None]]:
    """(run, its first reach of AdamW's final loss) for each of ``label``'s runs whose seed AdamW ran."""
    adamw = {r["seed"]: r for r in at_best.get("adamw", [])}
    return [(r, first_reach(r, adamw[r["seed"]]["val_loss"][-1])) for r in at_best.get(label, []) if r["seed"] in adamw]


# the seconds cell where AdamW's runs and the row's were made on different machines
OTHER_MACHINE = "AdamW on another machine"


def reach_fractions(at_best: dict[str, list[dict]], with_adamw: list) -> tuple[float, dict[int, float]] | None:
    """The mean fraction of AdamW's steps that the runs of ``with_adamw`` (:func:`step_fractions`)
    take to reach AdamW's final loss, and each seed's fraction of AdamW's train-step seconds;
    None where there are none or one never reaches it. Seconds compare only runs made on
    AdamW's machine (one ``machine`` line): a step's time differs between machines by more than
    between optimizers, so a seed whose two runs ran apart has no seconds fraction."""
    adamw = {r["seed"]: r for r in at_best.get("adamw", [])}
    if not with_adamw or any(hit is None for _, hit in with_adamw):
        return None
    steps = statistics.mean(hit[0] / r["model"]["steps"] for r, hit in with_adamw)
    seconds = {
        r["seed"]: hit[1] / adamw[r["seed"]]["wall"] for r, hit in with_adamw if on_one_machine(r, adamw[r["seed"]])
    }
    return steps, seconds


def seconds_cell(per_seed: dict[int, float]) -> str:
    """A fraction of AdamW's seconds as the tables print it: the mean, with each seed's (a run
    that shared its cores shows as the outlier: seconds are noisier than steps)."""
    if not per_seed:
        return OTHER_MACHINE
    mean = statistics.mean(per_seed.values())
    if len(per_seed) == 1:
        ((seed, _),) = per_seed.items()
        return f"{mean:.2f} (seed {seed})"
    return f"{mean:.2f} (seeds " + ", ".join(f"{seed}: {x:.2f}" for seed, x in sorted(per_seed.items())) + ")"


def tuned(size: str) -> dict[str, list[dict]]:
    """Each optimizer's runs at its best rate (seed 0's sweep; the variants at the rate they ran), by seed."""
    runs = load(size)
    out: dict[str, list[dict]] = {}
    for label in dict.fromkeys(r["optimizer"] for r in runs):
        rate = best_rate(size, label)
        rates = {r["lr"] for r in runs if r["optimizer"] == label}
        if rate is None and len(rates) == 1:
            rate = rates.pop()
        out[label] = sorted((r for r in runs if r["optimizer"] == label and r["lr"] == rate), key=lambda r: r["seed"])
    return out


def sweep_table(size: str) -> list[str]:
    runs = [r for r in load(size) if r["seed"] == 0]
    rates = sorted({r["lr"] for r in runs})
    lines = [f"| size {size}, seed 0 | " + " | ".join(f"{lr:g}" for lr in rates) + " |"]
    lines.append("|---|" + "---|" * len(rates))
    for label in dict.fromkeys(r["optimizer"] for r in runs):
        losses = {r["lr"]: r["val_loss"][-1] for r in runs if r["optimizer"] == label}
        if len(losses) < 2:
            continue
        best = min(losses, key=losses.get)
        cells = [("**%.4f**" if lr == best else "%.4f") % losses[lr] if lr in losses else "" for lr in rates]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def size_rows(size: str) -> list[str]:
    """One row per optimizer at its best rate; fractions against AdamW's best run of the same seed."""
    at_best = tuned(size)
    muon = {r["seed"]: r for r in at_best.get("muon", [])}
    rows = []
    for label, runs in at_best.items():
        model = runs[0]["model"]
        with_adamw = step_fractions(at_best, label)
        missed = sum(hit is None for _, hit in with_adamw)
        fractions = reach_fractions(at_best, with_adamw)
        if not with_adamw:
            steps_frac = wall_frac = "-"
        elif fractions is None:
            steps_frac = wall_frac = f"not reached ({missed} of {len(with_adamw)} seeds)"
        else:
            steps_frac, wall_frac = f"{fractions[0]:.2f}", seconds_cell(fractions[1])
        vs_muon = versus_muon(runs, muon)
        step_ms = statistics.mean(1e3 * r["wall"] / r["timed_steps"] for r in runs)
        opt_ms = statistics.mean(1e3 * r["optimizer_s"] / r["timed_steps"] for r in runs)
        rows.append(
            f"| {size} ({params_of(model) / 1e6:.2f}M, {model['steps']} steps) | {label} | {runs[0]['lr']:g} | "
            f"{len(runs)} | {mean_std([r['val_loss'][-1] for r in runs])} | "
            f"{vs_muon if label != 'muon' else '-'} | {steps_frac} | "
            f"{wall_frac} | {step_ms:.0f} | {opt_ms:.1f} ({opt_ms / step_ms:.0%}) |"
        )
    return rows


def extrapolation(size: str) -> list[str]:
    """The optimizer's share of a step at LARGE_BATCH tokens, from this size's measured costs:
    forward and backward scale with tokens (f ms at the run's tokens), the optimizer does not (o ms)."""
    lines = []
    for label, runs in tuned(size).items():
        model = runs[0]["model"]
        tokens = model["batch"] * model["context"]
        o = statistics.mean(1e3 * r["optimizer_s"] / r["timed_steps"] for r in runs)
        f = statistics.mean(1e3 * (r["wall"] - r["optimizer_s"]) / r["timed_steps"] for r in runs)
        large = f * LARGE_BATCH / tokens
        lines.append(
            f"| {size} | {label} | {o:.1f} | {f:.0f} | {1e6 * o / params_of(model):.2f} | "
            f"{o:.1f} / ({o:.1f} + {f:.0f} x {LARGE_BATCH // tokens}) = {o / (o + large):.2%} |"
        )
    return lines


def rate_table(sizes: list[str], base: str) -> str:
    """Each HEADLINE optimizer's best rate (seed 0) over ``base``'s, per size: a porting rule
    holds where a column stays within a factor of 2 of one value."""
    labels = [k for k in HEADLINE if k != base]
    lines = ["| size | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for size in sizes:
        rate = best_rate(size, base)
        cells = [f"{best_rate(size, k) / rate:.2g}" if rate and best_rate(size, k) else "-" for k in labels]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")  # e.g. 1e-3 / 3e-4: 3.3
    return "\n".join(lines)


def precision_rows(size: str) -> list[str]:
    """Each ``precision-...-P`` label paired by seed with its float32 partner (the same label
    with ``float32``) at the same rate, over seeds whose two runs were made on one machine: the
    issue-53 criterion is a paired difference within 0.005."""
    runs = [r for r in load(size) if r["optimizer"].startswith("precision-")]
    by_key = {(r["optimizer"], r["lr"], r["seed"]): r for r in runs}
    lines = []
    for label in sorted({r["optimizer"] for r in runs}):
        stem, precision = label.rsplit("-", 1)
        if precision == "float32":
            continue
        for lr in sorted({r["lr"] for r in runs if r["optimizer"] == label}):
            pairs = [
                (r, by_key.get((f"{stem}-float32", lr, r["seed"])))
                for r in runs
                if r["optimizer"] == label and r["lr"] == lr
            ]
            pairs = [(r, f) for r, f in pairs if f is not None and r.get("machine") == f.get("machine")]
            if not pairs:
                continue
            differences = [r["val_loss"][-1] - f["val_loss"][-1] for r, f in pairs]
            per_seed = ", ".join(f"{r['seed']}: {d:+.4f}" for (r, _), d in zip(pairs, differences))
            worst = max(abs(d) for d in differences)
            losses = mean_std([r["val_loss"][-1] for r, _ in pairs])
            lines.append(
                f"| {size} | {label} | {lr:g} | {losses} | {paired(differences)} | {per_seed} | "
                f"{'yes' if worst <= 0.005 else 'no'} |"
            )
    return lines


def tokens_per_param(model: dict) -> float:
    """The tokens a run trained on per parameter of its model."""
    return model["steps"] * model["batch"] * model["context"] / params_of(model)


def data_point(name: str, label: str = "dash-defaults") -> dict | None:
    """``label`` against Muon and AdamW in one study, each at its best rate: tokens per parameter,
    tokens a step, the paired gap to Muon's final loss (seeds on one machine), the mean fraction
    of AdamW's steps and each seed's fraction of its seconds to reach AdamW's final loss (None
    where not reached, or where AdamW did not run: ``adamw_ran``); None without runs of ``label``."""
    at_best = tuned(name)
    if label not in at_best:
        return None
    model = at_best[label][0]["model"]
    muon = {r["seed"]: r for r in at_best.get("muon", [])}
    gaps, _ = muon_gaps(at_best[label], muon)
    fractions = reach_fractions(at_best, step_fractions(at_best, label))
    return {
        "study": name,
        "tokens_per_param": tokens_per_param(model),
        "tokens_per_step": model["batch"] * model["context"],
        "steps": model["steps"],
        "gaps": gaps,
        "adamw_ran": "adamw" in at_best,
        "steps_fraction": None if fractions is None else fractions[0],
        "wall_fraction": {} if fractions is None else fractions[1],
    }


def reach_cell(point: dict, key: str) -> str:
    """A fraction of AdamW's steps or seconds of :func:`data_point` as the table prints it."""
    if not point["adamw_ran"]:
        return "no AdamW run"
    if point["steps_fraction"] is None:
        return "not reached"
    return seconds_cell(point[key]) if key == "wall_fraction" else f"{point[key]:.2f}"


def data_rows(names: list[str]) -> list[str]:
    """One row per study: DASH's defaults against tuned Muon and AdamW (issue 54's targets: at
    least 0.01 below Muon, AdamW's final loss in at most 0.7 of its steps and in fewer seconds)."""
    rows = []
    for name in names:
        point = data_point(name)
        if point is None:
            continue
        gap = paired(point["gaps"]) if point["gaps"] else "-"
        rows.append(
            f"| {name} | {point['tokens_per_param']:.2f} | {point['tokens_per_step']:,} | {point['steps']} | {gap} | "
            f"{reach_cell(point, 'steps_fraction')} | {reach_cell(point, 'wall_fraction')} |"
        )
    return rows


DATA_HEAD = (
    "| study | tokens / parameter | tokens / step | steps | dash-defaults minus Muon (paired: mean ± s.e.) | "
    "fraction of AdamW's steps to its final loss | fraction of AdamW's seconds |\n|---|---|---|---|---|---|---|"
)
PRECISION_HEAD = (
    "| size | run | lr | final val loss (mean ± std) | minus float32's (paired: mean ± s.e.) | per seed | "
    "every seed within 0.005 |\n|---|---|---|---|---|---|---|"
)


def report(plots: str) -> None:
    sizes = [s for s in SIZES if load(s)]
    machines = sorted({r.get("machine", "not recorded") for s in sizes for r in load(s)})
    print("Runs made on: " + "; ".join(machines) + "\n")
    print("### Learning-rate sweeps (final validation loss, seed 0; best in bold)\n")
    for size in sizes:
        print("\n".join(sweep_table(size)) + "\n")
    print("### Each optimizer at its best rate\n")
    print(ROWS_HEAD.format("size"))
    for size in sizes:
        print("\n".join(size_rows(size)))
    longer = longer_studies()
    if longer:
        print("\n### Trained longer, at the rates of the size's sweep\n")
        print(ROWS_HEAD.format("study"))
        for name in longer:
            print("\n".join(size_rows(name)))
    for base, name in (("adamw", "AdamW"), ("muon", "Muon")):
        print(f"\n### Best rate over {name}'s best rate\n")
        print(rate_table(sizes, base))
    data = data_studies()
    if data:
        print("\n### The data axis: budgets of tokens per parameter (issue 54)\n")
        print(DATA_HEAD)
        print("\n".join(data_rows([*sizes, *data])))
        print("\n" + ROWS_HEAD.format("study"))
        for name in data:
            print("\n".join(size_rows(name)))
    precision = [line for size in sizes for line in precision_rows(size)]
    if precision:
        print("\n### Each precision paired with float32 (issue 53)\n")
        print(PRECISION_HEAD)
        print("\n".join(precision))
    print(f"\n### Optimizer share at {LARGE_BATCH:,} tokens a step, from the measured costs\n")
    print(
        "| size | optimizer | optimizer ms (o) | forward+backward ms at the runs' 1,024 tokens (f) | "
        "optimizer ms per million parameters | o / (o + f x the batch's multiple) |"
    )
    print("|---|---|---|---|---|---|")
    for size in sizes:
        print("\n".join(extrapolation(size)))
    plot(sizes, Path(plots))
    if data:
        print(f"wrote {plot_data_axis([*sizes, *data], Path(plots))}")


# the candidate of issue 54's item 4 drawn beside the defaults: every root on each of the first
# 100 steps (inv_root_warmup=100)
WARMUP = "dash-defaults-warmup100"


def plot_data_axis(names: list[str], folder: Path) -> Path:
    """scaling_data.png: dash-defaults' final loss minus tuned Muon's (paired, mean and standard
    error) against tokens per parameter, one line per size and tokens a step: the size presets'
    studies and the data axis's budgets on the same axes; dashed, the warm-up candidate where
    it ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}
    for name in names:
        for label in ("dash-defaults", WARMUP):
            point = data_point(name, label)
            if point is None or not point["gaps"]:
                continue
            gaps = point["gaps"]
            key = (label, name.split("-")[0], point["tokens_per_step"])
            lines.setdefault(key, []).append((point["tokens_per_param"], statistics.mean(gaps), standard_error(gaps)))
    fig, ax = plt.subplots(figsize=(9.6, 4.4))
    for (label, size, tokens), points in sorted(lines.items()):
        xs, ys, errors = zip(*sorted(points))
        style = dict(ls="--", marker="s") if label == WARMUP else dict(marker="o")
        name = "inv_root_warmup=100" if label == WARMUP else "defaults"
        ax.errorbar(xs, ys, yerr=errors, capsize=3, label=f"{name}: size {size}, {tokens:,} tokens a step", **style)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.axhline(-0.01, color="grey", ls="--", lw=1, label="target: 0.01 below Muon")
    ax.set(
        xscale="log",
        xlabel="tokens per parameter",
        ylabel="final loss minus Muon's",
        title="DASH against tuned Muon",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1))  # beside the axes: the points fill them
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scaling_data.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(sizes: list[str], folder: Path) -> None:
    """scaling_steps.png: the fraction of AdamW's steps each optimizer needs to reach AdamW's final
    loss, against model size; scaling_sweeps.png: final loss against learning rate, per size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    folder.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for label in HEADLINE:
        xs, ys = [], []
        for size in sizes:
            at_best = tuned(size)
            # 1.05: not reached
            fracs = [hit[0] / r["model"]["steps"] if hit else 1.05 for r, hit in step_fractions(at_best, label)]
            if fracs:
                xs.append(params_of(at_best[label][0]["model"]))
                ys.append(statistics.mean(fracs))
        ax.plot(xs, ys, marker="o", label=label, color=COLORS[label])
    ax.axhline(0.7, color="grey", ls="--", lw=1, label="target 0.7")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(
        xscale="log",
        xlabel="parameters",
        ylabel="fraction of AdamW's steps",
        title="steps to AdamW's final validation loss (1.05: never)",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "scaling_steps.png", dpi=120)
    plt.close(fig)

    # every swept label keeps one color in every panel, and one legend serves them all
    seed0 = {size: [r for r in load(size) if r["seed"] == 0] for size in sizes}
    curves = {
        (size, label): sorted((r["lr"], r["val_loss"][-1]) for r in runs if r["optimizer"] == label)
        for size, runs in seed0.items()
        for label in dict.fromkeys(r["optimizer"] for r in runs)
    }
    curves = {key: points for key, points in curves.items() if len(points) > 1}
    # the fixed colors' tab10 shades left out of tab20, and a dashed line once the rest run out
    fixed = {to_rgb(c) for c in COLORS.values()}
    palette = [c for c in plt.get_cmap("tab20").colors if to_rgb(c) not in fixed]
    others = ((color, style) for style in itertools.cycle(("-", "--", ":")) for color in palette)
    styles = {
        label: (COLORS[label], "-") if label in COLORS else next(others)
        for label in sorted({label for _, label in curves})
    }
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.5 * len(sizes), 5.5), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for (at, label), points in curves.items():
            if at == size:
                color, style = styles[label]
                ax.plot(*zip(*points), marker="o", label=label, color=color, linestyle=style)
        ax.set(xscale="log", xlabel="peak learning rate", ylabel="final validation loss", title=f"size {size}")
        ax.grid(alpha=0.3)
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend([handles[k] for k in sorted(handles)], sorted(handles), loc="lower center", ncol=6, fontsize="small")
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(folder / "scaling_sweeps.png", dpi=120)
    plt.close(fig)
    written = [folder / "scaling_steps.png", folder / "scaling_sweeps.png"]
    logged = [size for size in sizes if any("update_rms" in r for r in load(size))]
    if logged:
        written.append(plot_update_sizes(logged, folder, plt))
    print("\nwrote " + ", ".join(map(str, written)))


# the update-size plot's lines: the defaults, the fixed-norm rules, Nesterov and Muon
UPDATE_SIZE_LABELS = [
    "dash-previous",
    "dash-defaults",
    "dash-rms",
    "dash-spectral",
    "dash-nesterov",
    "dash-combo",
    "muon",
    "muon-fp32",
]


def plot_update_sizes(sizes: list[str], folder: Path, plt) -> Path:
    """scaling_update_rms.png: each optimizer's per-entry update size (lr x the RMS of its
    direction, averaged over the hidden matrices) against the step, at its best rate, seed 0."""
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        shown = [label for label in UPDATE_SIZE_LABELS if label in tuned(size)]
        for i, label in enumerate(shown):
            run = next((r for r in tuned(size)[label] if r["seed"] == 0 and "update_rms" in r), None)
            if run is not None:
                ax.plot(run["val_step"], run["update_rms"], label=f"{label} @ {run['lr']:g}", color=f"C{i}")
        ax.set(yscale="log", xlabel="step", ylabel="lr x RMS of the update", title=f"size {size}: update size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "scaling_update_rms.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
