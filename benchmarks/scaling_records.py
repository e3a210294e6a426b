"""The scaling study's records (benchmarks/results/scaling/*.json): one file per study, the runs
``python -m benchmarks.scaling`` trains and ``python -m benchmarks.scaling_report`` reads. Both
import this module, and neither imports the other's caller: the runner imports the report, the
report only the records."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "scaling"
SIZES = ["s", "m", "l"]


def params_of(model: dict) -> int:
    """Parameters of train_lm's Llama (byte vocabulary, tied nothing): embedding, head, and per
    layer four attention matrices, three feed-forward matrices and two norm vectors, plus the final norm."""
    d, hidden, vocab = model["d_model"], (8 * model["d_model"]) // 3, 256
    return 2 * vocab * d + model["n_layers"] * (4 * d * d + 3 * d * hidden + 2 * d) + d


def longer_studies() -> list[str]:
    """The results files of runs longer (or shorter) than their size's preset, e.g. ``l-1200``."""
    return sorted(p.stem for p in RESULTS.glob("*-*.json") if "-tpp" not in p.stem)


def data_studies() -> list[str]:
    """The results files of the data axis, by size and budget (``s-tpp1-b128``, ``s-tpp5-b128``, ...)."""

    def budget(name: str) -> tuple:
        size, tokens, batch = name.split("-")
        return SIZES.index(size), float(tokens[3:]), int(batch[1:])

    return sorted((p.stem for p in RESULTS.glob("*-tpp*-b*.json")), key=budget)


def load(name: str) -> list[dict]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text())["runs"] if path.exists() else []


def record(name: str, runs: list[dict]) -> None:
    """Add finished runs to a results file (a run with the same optimizer, rate and seed is replaced)."""
    key = lambda r: (r["optimizer"], r["lr"], r["seed"])
    kept = {key(r): r for r in load(name)}
    kept.update({key(r): r for r in runs})
    RESULTS.mkdir(parents=True, exist_ok=True)
    ordered = sorted(kept.values(), key=lambda r: (r["optimizer"], r["seed"], r["lr"]))
    (RESULTS / f"{name}.json").write_text(json.dumps({"size": name, "runs": ordered}, indent=1) + "\n")


def best_rate(size: str, label: str, seed: int = 0) -> float | None:
    runs = [r for r in load(size) if r["optimizer"] == label and r["seed"] == seed]
    return min(runs, key=lambda r: r["val_loss"][-1])["lr"] if runs else None
