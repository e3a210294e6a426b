"""Accuracy against cost of every inverse-root solver, on random and on real Shampoo factors.

    python -m benchmarks.solver_accuracy              # b = 256, 8 blocks per stack (~5 min on 2 cores)
    python -m benchmarks.solver_accuracy --quick      # b = 128, 4 blocks, short training (~1 min)
    python -m benchmarks.solver_accuracy --threads 1 --block-size 512 --device cuda

For each data set and each solver setting (solver, iteration count or degree, scaling,
matmul_dtype) it prints the time of one batched ``dash_fn.inverse_root`` call on the stack
(median of --repeats after a warm-up), per block, and the relative Frobenius error of the
inverse 4th root against float64 ``torch.linalg.eigh`` of ``X + eps I`` (eps = 1e-10), the
common target; Chebyshev also against its own target ``(X + cheb_eps s I)^{-1/4}`` (s = ||X||_F).
Blocks a solver flags as diverged (NaN, which the optimizer answers by keeping the old root)
are counted and left out of the error.

Data sets: Wishart factors ``C^{1/2} Z Z^T C^{1/2} / n`` (n = 4b) whose covariance C has
condition 1e2, 1e4, 1e6; and the factors ``state["factors", k, "F"]`` of the largest b x b stack
after a short training run of a byte-level Llama (examples/llama.py, d_model = b) with dash_fn
on the Python standard library's sources (nonzero factors only).

The plot (matplotlib, Agg) goes to benchmarks/results/solver_accuracy.png: median error over
the blocks against time per block, one panel per data set. On CPU, 16-bit matmul_dtype is emulated in float32
(dash_fn.roots.matmul): its errors are those of 16-bit operands, its times are not 16-bit times,
and the plot draws those points hollow.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from pathlib import Path

import torch

import dash_fn
from examples.llama import Llama, LlamaConfig, next_byte_loss
from examples.train_lm import batch_at, stdlib_corpus

HERE = Path(__file__).resolve().parent

f64 = torch.float64


def settings(quick: bool) -> list[tuple[str, dict]]:
    """(label, DashConfig fields) for every solver setting measured."""
    steps = (10, 15) if quick else (10, 15, 20)
    rows = [("eigh", dict(solver="eigh"))]
    for solver in ("ndb", "cn"):
        for T in steps:
            rows.append((f"{solver} T={T} pim", dict(solver=solver, newton_steps=T)))
        rows.append((f"{solver} T=10 fro", dict(solver=solver, scaling="fro")))
    for d in (20, 60) if quick else (20, 40, 60):
        rows.append((f"chebyshev d={d} fro", dict(solver="chebyshev", scaling="fro", cheb_degree=d)))
    for dtype in ("bfloat16", "float16"):
        rows.append((f"ndb T=10 pim {dtype}", dict(solver="ndb", matmul_dtype=dtype)))
        rows.append((f"cn T=10 fro {dtype}", dict(solver="cn", scaling="fro", matmul_dtype=dtype)))
    return rows


def wishart(K: int, b: int, cond: float, seed: int = 0) -> torch.Tensor:
    """K factors C^{1/2} Z Z^T C^{1/2} / n, n = 4b, C with eigenvalues log-spaced from 1 to 1/cond."""
    gen = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(K, b, b, generator=gen, dtype=f64))
    root = (Q * torch.logspace(0, -math.log10(cond) / 2, b, dtype=f64)) @ Q.mT
    G = root @ torch.randn(K, b, 4 * b, generator=gen, dtype=f64)
    return (G @ G.mT / (4 * b)).float()


def trained_factors(b: int, steps: int, K: int) -> torch.Tensor:
    """The first K nonzero factors of size b after ``steps`` dash_fn steps of a byte-level Llama
    (the embedding's rows of bytes absent from the corpus have all-zero factors, whose roots
    are conventions, not approximations)."""
    config = LlamaConfig(d_model=b, n_layers=2, n_heads=4, mlp_hidden=8 * b // 3, context=128)
    torch.manual_seed(0)
    model = Llama(config)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    train, _ = stdlib_corpus(2_000_000)
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=b, solver="eigh", refresh_schedule="periodic"))
    grad_fn = torch.func.grad(lambda p, tokens: next_byte_loss(model, p, tokens))
    for t in range(1, steps + 1):
        grads = grad_fn(params, batch_at(train, t, 16, config.context, 0))
        params, state = dash_fn.step(params, grads, state, lr=1e-3, refresh=True)
    plan = state["plan"]
    k = max(range(len(plan.factors)), key=lambda i: (plan.factors[i].size == b, plan.factors[i].count))
    F = state["factors", str(k), "F"]
    return F[F.abs().amax(dim=(-2, -1)) > 0][:K].clone()


def eigh_root(X: torch.Tensor, shift: torch.Tensor | float) -> torch.Tensor:
    """float64 ``(X + shift I)^{-1/4}``, shift a float or a (K,) tensor."""
    mu, Q = torch.linalg.eigh(X.double())
    shift = torch.as_tensor(shift, dtype=f64).reshape(-1, 1)
    return (Q * (mu + shift).clamp_min(1e-300).pow(-0.25).unsqueeze(-2)) @ Q.mT


def block_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (out.double() - ref).norm(dim=(-2, -1)) / ref.norm(dim=(-2, -1))


def timed(fn, repeats: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(X: torch.Tensor, label: str, fields: dict, repeats: int, device: torch.device) -> dict:
    config = dash_fn.DashConfig(**{"eps_rel": 0.0, **fields})  # the solvers' own roots, no floor
    X = X.to(device)
    start = dash_fn.utils.start_vectors(X.shape[-1], config, device=device)
    out = dash_fn.inverse_root(X, 4, config, start)
    seconds = timed(lambda: dash_fn.inverse_root(X, 4, config, start), repeats, device)
    ok = torch.isfinite(out).all(dim=(-2, -1)).cpu()
    out = out.cpu()
    errors = block_errors(out[ok], eigh_root(X.cpu()[ok], config.eps)) if ok.any() else torch.full((1,), math.nan)
    row = dict(
        label=label,
        solver=config.solver,
        matmul_dtype=config.matmul_dtype,
        seconds=seconds,
        per_block_ms=1e3 * seconds / X.shape[0],
    )
    row.update(
        err_median=float(errors.median()), err_max=float(errors.max()), flagged=int((~ok).sum()), blocks=X.shape[0]
    )
    if config.solver == "chebyshev" and ok.any():
        shift = config.cheb_eps * X.cpu()[ok].double().norm(dim=(-2, -1))
        row["err_own"] = float(block_errors(out[ok], eigh_root(X.cpu()[ok], shift)).max())
    return row


def print_table(name: str, X: torch.Tensor, rows: list[dict], device: torch.device) -> None:
    lam = torch.linalg.eigvalsh(X.double())
    cond = float((lam[:, -1] / lam[:, 0].clamp_min(1e-30)).median())
    print(
        f"\n### {name}: {X.shape[0]} blocks of {X.shape[-1]} x {X.shape[-1]}, median condition {cond:.2g} ({device})\n"
    )
    print(
        "| solver setting | matmul dtype | ms / stack | ms / block | rel. error median | max | own target | flagged |"
    )
    print("|---|---|---|---|---|---|---|---|")
    emulated = device.type != "cuda"
    for r in rows:
        dtype = r["matmul_dtype"] + (" (emulated)" if emulated and r["matmul_dtype"] != "float32" else "")
        own = f"{r['err_own']:.1e}" if "err_own" in r else ""
        print(
            f"| {r['label']} | {dtype} | {1e3 * r['seconds']:.1f} | {r['per_block_ms']:.2f} | {r['err_median']:.1e} | "
            f"{r['err_max']:.1e} | {own} | {r['flagged']}/{r['blocks']} |"
        )


def plot(results: dict[str, list[dict]], path: Path, device: torch.device) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"eigh": "black", "ndb": "tab:blue", "cn": "tab:orange", "chebyshev": "tab:green"}
    cols = 2
    rows = math.ceil(len(results) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    for ax, (name, measured) in zip(axes.flat, results.items()):
        for r in measured:
            if math.isnan(r["err_median"]):
                continue
            low = r["matmul_dtype"] != "float32"
            hollow = low and device.type != "cuda"
            color = colors[r["solver"]]
            error = max(r["err_median"], 1e-16)
            ax.scatter(
                r["per_block_ms"],
                error,
                s=40,
                marker="s" if low else "o",
                facecolors="none" if hollow else color,
                edgecolors=color,
            )
            ax.annotate(
                r["label"].replace(" pim", "").replace(" fro", "*"),
                (r["per_block_ms"], error),
                fontsize=6,
                xytext=(3, 2),
                textcoords="offset points",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(f"ms per block ({device.type})")
        ax.set_ylabel("median rel. Frobenius error of (X + eps I)^{-1/4}")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    fig.suptitle(
        "dash_fn inverse-root solvers: accuracy vs cost (* = fro scaling, squares = 16-bit operands, "
        "hollow = emulated)",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    print(f"\nplot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="b = 128, 4 blocks, 10 training steps, fewer settings")
    parser.add_argument("--block-size", type=int, help="block size b; when not given 256, or 128 with --quick")
    parser.add_argument("--stack", type=int, help="blocks per stack; when not given 8, or 4 with --quick")
    parser.add_argument(
        "--train-steps",
        type=int,
        help="dash_fn steps of the Llama whose factors are measured; when not given 60, or 10 with --quick",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per setting (median, after a warm-up)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU); when not given torch's own")
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="device of the solver calls"
    )
    parser.add_argument(
        "--plot", type=Path, default=HERE / "results" / "solver_accuracy.png", help="where the plot goes"
    )
    args = parser.parse_args()
    b = args.block_size or (128 if args.quick else 256)
    K = args.stack or (4 if args.quick else 8)
    steps = args.train_steps or (10 if args.quick else 60)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    warnings.simplefilter("ignore")  # the 16-bit-on-CPU warning: this script labels those rows instead
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, b = {b}, {K} blocks per stack")
    data = {f"Wishart, covariance condition {c:.0e}": wishart(K, b, c) for c in (1e2, 1e4, 1e6)}
    data[f"Llama factors after {steps} dash_fn steps"] = trained_factors(b, steps, K)
    results = {}
    for name, X in data.items():
        results[name] = [measure(X, label, fields, args.repeats, device) for label, fields in settings(args.quick)]
        print_table(name, X, results[name], device)
    plot(results, args.plot, device)


if __name__ == "__main__":
    main()
