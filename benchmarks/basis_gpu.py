"""What an eigenbasis refresh costs on the device, and whether each form syncs (issue 40).

    python -m benchmarks.basis_gpu --out basis.md          # on a CUDA machine
    python -m benchmarks.basis_gpu --dry-run --out dry.md  # on the CPU: tiny stacks (checks the script)

The eigenvalue-corrected preconditioner needs each factor's eigenbasis. Two ways to refresh a
stack of them: ``torch.linalg.eigh`` (exact; on CUDA it reads cuSOLVER's error flags on the
host, a sync that CUDA graphs cannot capture), or orthogonal iteration warm-started from the
previous basis, ``Q <- qr(F Q)`` (SOAP's; matrix products and a batched QR). Per stack shape:
the median time of each, whether each raises under ``torch.cuda.set_sync_debug_mode("error")``,
whether a CUDA graph captures it, and how far one QR step moves a basis that eigh found for a
slightly older factor (the drift a refresh corrects), its columns ordered by decreasing eigenvalue
as orthogonal iteration orders them (in eigh's increasing order one step makes it far worse:
each column is orthogonalized against those of smaller eigenvalues first). Every row is written as it completes.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch


def median_seconds(fn, reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times[2:])[len(times[2:]) // 2]


def factors(count: int, size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """PSD stacks like the optimizer's: EMAs of G G^T of 32-row gradients, plus a decaying spectrum."""
    gen = torch.Generator(device).manual_seed(seed)
    G = torch.randn(count, size, 4 * size, generator=gen, device=device) / size
    G = G * torch.logspace(0, -3, size, device=device).view(1, size, 1)
    return G @ G.mT


def qr_step(F: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(F @ Q).Q


def syncs(fn, device: torch.device) -> str:
    if device.type != "cuda":
        return "n/a (CPU)"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return "no sync"
    except RuntimeError as error:
        return "syncs: " + " ".join(str(error).split())[:120]
    finally:
        torch.cuda.set_sync_debug_mode(0)


def captured(fn, device: torch.device) -> str:
    if device.type != "cuda":
        return "n/a (CPU)"
    fn()  # warm: workspaces and handles exist before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        return "captured and replayed"
    except Exception as error:  # capture errors are the finding, not a crash
        torch.cuda.synchronize()
        return f"not captured: {type(error).__name__}: " + " ".join(str(error).split())[:120]


def drift(F_old: torch.Tensor, F_new: torch.Tensor) -> tuple[float, float, float]:
    """Off-diagonal energy ``||offdiag(Q^T F Q)||_F / ||F||_F`` of the new factor in the old
    factor's eigenbasis, after one QR step from it, and after one QR step from the same basis in
    eigh's increasing order (0 for an exact eigenbasis)."""
    Q = torch.linalg.eigh(F_old.double())[1].flip(-1)  # largest eigenvalue first, as orthogonal iteration orders
    F = F_new.double()

    def off(Q):
        M = Q.mT @ F @ Q
        return float((M - torch.diag_embed(torch.diagonal(M, dim1=-2, dim2=-1))).norm() / F.norm())

    return off(Q), off(qr_step(F, Q)), off(qr_step(F, Q.flip(-1)))


def row(count: int, size: int, device: torch.device, reps: int) -> str:
    F = factors(count, size, device)
    F_new = 0.95 * F + 0.05 * factors(count, size, device, seed=1)
    Q = torch.linalg.eigh(F)[1].flip(-1)

    def eigh():
        return torch.linalg.eigh(F)

    def qr():
        return qr_step(F_new, Q)

    eigh_ms, qr_ms = (1e3 * median_seconds(fn, reps, device) for fn in (eigh, qr))
    before, after, increasing = drift(F, F_new)
    return (
        f"| {count} x {size}^2 | {eigh_ms:.1f} | {qr_ms:.1f} | {syncs(eigh, device)} | {syncs(qr, device)} "
        f"| {captured(qr, device)} | {before:.1e} | {after:.1e} | {increasing:.1e} |"
    )


def compiled_qr(device: torch.device) -> str:
    """The QR step under torch.compile's CUDA graphs: Inductor's count of graphs it skipped."""
    torch._inductor.config.triton.cudagraph_or_error = False
    step = torch.compile(qr_step, mode="reduce-overhead", fullgraph=True)
    F = factors(16, 256, device)
    Q = torch.linalg.eigh(F)[1].flip(-1)
    for _ in range(4):
        torch.compiler.cudagraph_mark_step_begin()
        Q = step(F, Q).clone()
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
    return f"compiled QR step (inductor, reduce-overhead, 16 x 256^2): CUDA-graph skips {skips}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny stacks (checks the script)")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per form (median)")
    parser.add_argument("--out", help="also write the rows to this markdown file as they come")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    shapes = [(4, 16), (2, 32)] if args.dry_run else [(64, 256), (16, 1024), (64, 1024)]
    torch.backends.cuda.matmul.allow_tf32 = False
    out = open(args.out, "w") if args.out else None  # noqa: SIM115 (rows written as they come)

    def line(text: str) -> None:
        print(text, flush=True)
        if out:
            out.write(text + "\n")
            out.flush()

    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (dry run)"
    line(f"{name}, torch {torch.__version__}, float32, TF32 off, median of {args.reps}")
    line("")
    line(
        "| stack | eigh ms | one QR step ms | eigh syncs | QR step syncs | QR in a CUDA graph "
        "| off-diagonal, old basis | after one QR step | after one QR step from increasing order |"
    )
    line("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for count, size in shapes:
        try:
            line(row(count, size, device, args.reps))
        except Exception as error:
            traceback.print_exc()
            failed = True
            line(f"| {count} x {size}^2 | failed: {type(error).__name__}: {' '.join(str(error).split())[:200]} |")
    if device.type == "cuda":
        try:
            line("")
            line(compiled_qr(device))
            # last: a failed capture leaves cuSOLVER's handle unusable for the rest of the process
            F = factors(16, 256, device)
            line(f"eigh of 16 x 256^2 in a CUDA graph: {captured(lambda: torch.linalg.eigh(F), device)}")
        except Exception as error:
            traceback.print_exc()
            failed = True
            line(f"compiled QR step: failed: {type(error).__name__}: {' '.join(str(error).split())[:200]}")
    if out:
        out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
