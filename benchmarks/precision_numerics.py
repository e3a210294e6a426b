"""Error of each product kind and of each root iteration at every ``DashConfig.precision``,
against float64: the evidence for which parts of the step keep float32 operands.

    python -m benchmarks.precision_numerics              # b = 256, 8 blocks (~2 min on 2 cores)
    python -m benchmarks.precision_numerics --quick      # b = 64, 4 blocks (CI's dry run)

Products (relative Frobenius error of ``a @ b`` against the float64 product of the float32
operands): the factor product ``G G^T`` of gradients at two scales (1e-2 and 1e-6, below
float16's normal range), the preconditioning product ``L^{-1/3} G`` and the eigenvalue-corrected
rotation ``Q^T G``. Each precision runs in every kernel this machine has for it: "emulated"
(rounded operands, float32 product: the tensor cores' arithmetic) and, on a CPU with bf16
matrix instructions, "native_cpu".

Iterations: coupled Newton (p = 3), Chebyshev (p = 3) and NDB (p = 4) at the defaults (10
iterations, pim scaling), each with its products in the precision itself (what
:data:`dash_fn.roots.matmul.STAYS_FLOAT32` overrides), on Wishart factors of condition 1e2, 1e4
and 1e6 (:func:`solver_accuracy.wishart`). The float32 column gives the relative Frobenius
error of the float32 iteration against float64 ``eigh`` of the same regularized block (what ten
iterations reach); the others, how far the precision moves the iteration's result from the
float32 one (relative Frobenius distance): the precision's own cost. Medians over the blocks,
with the blocks the solver flags as diverged.
"""

from __future__ import annotations

import argparse

import torch

import dash_fn
from benchmarks.machine import machine_line
from benchmarks.solver_accuracy import wishart
from dash_fn.roots import SOLVERS, start_vectors
from dash_fn.roots.matmul import PLAIN, Products, cpu_has_bf16_units

f64 = torch.float64
PRECISIONS = ("float32", "tf32", "bfloat16", "float16")
CONDITIONS = (1e2, 1e4, 1e6)
ITERATIONS = (("cn", 3), ("chebyshev", 3), ("ndb", 4))


def kernels(precision: str) -> list[Products]:
    """The products of ``precision`` in every kernel this machine has for it."""
    if precision == "float32":
        return [PLAIN]
    found = [Products(precision, "emulated")]
    if precision == "bfloat16" and cpu_has_bf16_units():
        found.append(Products(precision, "native_cpu"))
    return found


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.to(f64) - ref) / torch.linalg.vector_norm(ref))


def root64(X: torch.Tensor, p: int, eps: float) -> torch.Tensor:
    """``(X + eps I)^{-1/p}`` per block in float64 by eigh."""
    w, V = torch.linalg.eigh(X.to(f64) + eps * torch.eye(X.shape[-1], dtype=f64))
    return (V * w.clamp_min(eps)[..., None, :] ** (-1 / p)) @ V.mT


def product_cases(K: int, b: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(a, b) operands of each product kind, float32."""
    gen = torch.Generator().manual_seed(0)
    G = torch.randn(K, b, b, generator=gen)
    L = wishart(K, b, 1e4)
    Q = torch.linalg.qr(torch.randn(K, b, b, generator=gen, dtype=f64)).Q.float()
    return {
        "factor G G^T, |G| ~ 1e-2": (1e-2 * G, 1e-2 * G.mT),
        "factor G G^T, |G| ~ 1e-6": (1e-6 * G, 1e-6 * G.mT),
        "precondition L^-1/3 G": (root64(L, 3, 1e-10).float(), G),
        "rotate Q^T G": (Q.mT, G),
    }


def product_table(K: int, b: int) -> list[str]:
    rows = ["| product | " + " | ".join(PRECISIONS) + " |", "|---|" + "---|" * len(PRECISIONS)]
    for name, (a, c) in product_cases(K, b).items():
        ref = a.to(f64) @ c.to(f64)
        cells = []
        for precision in PRECISIONS:
            cells.append(" / ".join(f"{rel_err(kernel(a, c), ref):.1e}" for kernel in kernels(precision)))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return rows


def iteration_table(K: int, b: int) -> list[str]:
    rows = [
        "| iteration | cond | " + " | ".join(PRECISIONS) + " |",
        "|---|---|" + "---|" * len(PRECISIONS),
    ]
    for solver, p in ITERATIONS:
        config = dash_fn.DashConfig(solver=solver, eps_rel=0.0, root_order=p)
        start = start_vectors(b, config)
        for cond in CONDITIONS:
            X = wishart(K, b, cond)
            exact = root64(X, p, config.eps)
            in_float32 = SOLVERS[solver](X, p, config, start, PLAIN).to(f64)
            cells = []
            for precision in PRECISIONS:
                ref = exact if precision == "float32" else in_float32
                found = []
                for kernel in kernels(precision):
                    out = SOLVERS[solver](X, p, config, start, kernel)
                    ok = torch.isfinite(out).all(dim=(-2, -1))
                    errors = sorted(rel_err(out[k], ref[k]) for k in range(K) if ok[k])
                    median = f"{errors[len(errors) // 2]:.1e}" if errors else "-"
                    found.append(median + (f" ({int((~ok).sum())} div.)" if not ok.all() else ""))
                cells.append(" / ".join(found))
            rows.append(f"| {solver} p={p} | {cond:.0e} | " + " | ".join(cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="b = 64, 4 blocks")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 keeps torch's own count")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    K, b = (4, 64) if args.quick else (8, 256)
    print(f"# Precision numerics: {K} blocks of {b}; {machine_line()}")
    print("(cells: error of the emulated kernel / of the native CPU kernel where this CPU has one)\n")
    for line in product_table(K, b) + [""] + iteration_table(K, b):
        print(line)


if __name__ == "__main__":
    main()
