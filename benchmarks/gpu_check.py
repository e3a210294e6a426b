"""The GPU check: no host syncs, no CUDA-graph skips, results against eager and float64, step times.

    python benchmarks/gpu_check.py --out gpu.md           # on a CUDA machine (benchmarks/gpu_day.sh runs it)
    python benchmarks/gpu_check.py --dry-run --out dry.md # on CPU: tiny shapes, aot_eager, the accelerator
                                                          # strategy simulated (checks the script, in CI)
    python benchmarks/gpu_check.py --skip syncs accuracy  # leave out sections already proven

Sections, in the order they run (``--only`` / ``--skip`` pick them; every row gives the seconds
it took): ``shipped`` (the defaults as a GPU runs them), ``precision`` (plain and refresh steps
at each ``DashConfig.precision`` against each dtype's own peak), ``syncs``, ``accuracy``,
``solvers`` (the per-solver tables), ``training`` (a whole training step of
``examples/train_lm.py`` for AdamW, Muon and DASH).

Fail-safe by construction, since a GPU run is rare and short: every row is appended to the
report file (``--out``) as soon as it is known; each row runs in its own ``try``, and a failure
keeps the exception and the innermost frames of its traceback; a deadline (``--budget``
seconds from the start; on a GPU 420 unless given, none in a dry run unless given) stops
starting new rows in time to write the report; the exit status is
1 when any row failed or was wrong, so a wrong number fails the script, not only a crash.

1. Syncs and CUDA graphs: steady-state steps (after warm-up calls that include CUDA graphs'
   recording call) of the eager adapter, the compiled adapter and the functional step compiled
   with ``mode="reduce-overhead"``, NDB with momentum and the non-finite guard; then the same
   functional step with the update-rule options, with the defaults as a GPU runs them
   (coupled Newton's cube roots), and in the eigenvalue-corrected mode (orthogonal-iteration
   bases); all under
   ``torch.cuda.set_sync_debug_mode("error")`` (the dry run counts the same ops with a dispatch
   mode, tests/syncs.py). Per row, Inductor's ``cudagraph_skips`` counter (must not move) and
   the parameters against the same steps run eagerly (within ``COMPILED_TOLERANCE``). The
   functional step's replays read fixed input buffers: its outputs are copied into the
   parameters before the next replay, which overwrites them (CUDA-graph trees reuse the pool).
2. Accuracy: 12 steps of the functional step in float32 on the device (NDB, CN, eigh) against the
   same steps in float64 on the CPU, within ``FLOAT32_FACTOR`` times the CPU's own float32 run.
3. Step times of the DASH paper's Llama-953M layer at block 1024 (benchmarks/step_bench.py):
   dash_fn with CUDA graphs, compiled, eager, the sequential per-block baseline (the same math
   and root order, one block at a time) and AdamW, plain and refresh steps apart, in float32
   (torch's TF32 flag as the machine has it: the header says which). eigh is never timed under
   CUDA graphs: ``torch.linalg.eigh`` reads its error flags on the host (cuSOLVER's ``info``),
   which stream capture rejects, so its rows are compiled without them (the report says so).

The shipped configuration (``DashConfig()``: staggered refresh, ``solver="auto"``, which is
coupled Newton's cube roots on a GPU, and ``precision="auto"``, its float16 products) is timed
as a user runs it, one compiled step per call under CUDA graphs, at blocks of 256 and 1024,
beside the same with ``precision="float32"``, and in the eigenvalue-corrected mode. The
precision rows time plain and refresh steps at float32, TF32, bfloat16 and float16, each
against the peak of a large product of its own operands. The
training rows run ``examples/train_lm.py --size l`` with a realistic batch for AdamW, Muon and
DASH at its default precision: ms per step, final loss and the fraction of AdamW's steps and
seconds to AdamW's final loss.

A watchdog inside the budget dumps every thread's traceback to the log ``WATCHDOG_AFTER``
seconds past the budget and every 30 s after, so that a hang shows where it hangs before the
command's own time limit kills it.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import dash_fn  # noqa: E402
from dash_fn.roots.matmul import products_for  # noqa: E402
from dash_fn.strategy import simulated_accelerator  # noqa: E402
from step_bench import bench, markdown, median_seconds, speedups  # noqa: E402
from syncs import SyncCounter  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SECTIONS = ("shipped", "precision", "peers", "syncs", "accuracy", "solvers", "training")
PRECISIONS = ("float32", "tf32", "bfloat16", "float16")
GPU_BUDGET = 420.0  # seconds of rows on a GPU: an 8-minute command less the report's and watchdog's margin
WATCHDOG_AFTER = 40  # seconds past the budget: inside gpu_day.sh's 8-minute command at the default budget

# One transformer layer of Llama 953M (docs/ALGORITHM.md 3.2): fused qkv, o, gate, up, down.
LLAMA_953M_LAYER = {
    "qkv": (6144, 2048),
    "o": (2048, 2048),
    "gate": (5632, 2048),
    "up": (5632, 2048),
    "down": (2048, 5632),
}
TINY_LAYER = {"qkv": (96, 32), "o": (32, 32), "gate": (88, 32), "up": (88, 32), "down": (32, 88)}
# NDB (Shampoo's 4th roots) with momentum and the defaults' floor and look-ahead (the guard,
# skip_nonfinite, is on by default); eps 1e-6 so that a difference
# between compiled and eager measures the compiler: at 1e-10 the near-null eigenvalues of these
# rank-deficient factors (batches of 32) amplify rounding noise by eps^(-1/4) in any two programs
EPS = 1e-6
CHECK_CONFIG = dict(solver="ndb", inv_root_freq=2, mu=0.5, eps=EPS, eps_graft=1e-8)  # (eps_graft: says eps is damping)
# the update-rule options (docs/ALGORITHM.md 4 c-e) on the same step: the spectral rule's power
# iteration, the relative floor and Nesterov's look-ahead are the parts a CUDA graph has not seen
UPDATE_RULES_CONFIG = CHECK_CONFIG | dict(grafting="spectral", eps_rel=1e-5, nesterov_G=True)
# the defaults off the CPU: solver "auto" takes coupled Newton for their cube roots
DEFAULTS_CONFIG = {k: v for k, v in CHECK_CONFIG.items() if k != "solver"}
# Adam in the factors' eigenbases; "auto" takes orthogonal iteration (a product and a batched QR)
CORRECTED_CONFIG = DEFAULTS_CONFIG | dict(preconditioner="eigenvalue_corrected")
# ||W_compiled - W_eager|| / ||W_eager|| after the steps: fused kernels round differently, no more
COMPILED_TOLERANCE = 1e-4
# ||W_float32 - W_float64|| / ||W_float64|| after 12 steps is float32 rounding amplified by the
# factors' conditioning, which differs by solver (eigh's small eigenvalues carry an absolute error
# of about 1e-7 of the largest); the device's must be within this factor of the CPU's float32,
# plus a floor for runs that agree to rounding. A wrong kernel is off by far more.
FLOAT32_FACTOR, FLOAT32_FLOOR = 10.0, 1e-6
TRACEBACK_FRAMES = 4  # innermost frames kept in the report of a failed row


class Report:
    """Rows of ``| check | result |``, each printed and appended to ``path`` (flushed) as it
    comes, so that a run cut short still leaves everything it learned."""

    def __init__(self, path: str | None):
        self.file = open(path, "w") if path else None  # noqa: SIM115 (held for the run's rows)
        self.failures: list[str] = []
        self.not_run: list[str] = []

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        if self.file:
            self.file.write(text + "\n")
            self.file.flush()

    def row(self, check: str, result: str, ok: bool = True) -> None:
        if not ok:
            self.failures.append(check)
        self.line(f"| {check} | {result}{'' if ok else ' **FAILED**'} |")

    def close(self) -> None:
        if self.file:
            self.file.close()


class Deadline:
    """The budget: a row starts only while at least its ``need`` seconds are left; ``None`` is
    no budget (a dry run checks the script: every row runs, however slow the machine)."""

    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.end = self.start + (math.inf if seconds is None else seconds)

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def guarded(report: Report, deadline: Deadline, check: str, need: float, fn: Callable[[], tuple[str, bool]]) -> None:
    """Run one row: ``fn`` returns (result, ok); an exception fails the row with its type,
    message and innermost frames; too little budget left skips it (not a failure)."""
    if deadline.left() < need:
        report.not_run.append(check)
        report.row(check, f"not run: {max(0.0, deadline.left()):.0f} s of the budget left, about {need:.0f} s needed")
        return
    start = time.monotonic()
    try:
        result, ok = fn()
    except Exception as error:  # a row's failure must not take the report with it
        traceback.print_exc()  # the whole chain, into the log (gpu_day.sh keeps it)
        result, ok = describe(error), False
    report.row(check, f"{result.replace('|', '/')} ({time.monotonic() - start:.1f} s)", ok)


def describe(error: BaseException) -> str:
    """The innermost error of a chain (Dynamo and Inductor wrap the real one) with its message
    and innermost frames, and the outermost error's type when it differs."""
    root = error
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    frames = traceback.extract_tb(root.__traceback__)[-TRACEBACK_FRAMES:]
    where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames)
    message = " ".join(str(root).split())[:400]
    wrapped = f" (raised as {type(error).__name__})" if root is not error else ""
    return f"{type(root).__name__}: {message}{wrapped} (at {where})"


@contextlib.contextmanager
def no_syncs_allowed(device: torch.device):
    """Raise on any op that waits on the device (CUDA); on the dry run, count those ops."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return
    with SyncCounter() as counter:
        yield
    if counter.syncs:
        raise RuntimeError(f"host syncs: {sorted(set(counter.syncs))}")


def cudagraph_skips() -> int:
    return torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


def model_and_data(device: torch.device, width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width), torch.nn.Tanh(), torch.nn.Linear(2 * width, width)
    ).to(device)
    data = [torch.randn(32, width, generator=torch.Generator().manual_seed(t)).to(device) for t in range(8)]
    return model, data


def relative_difference(got: dict, want: dict) -> float:
    """max over names of ``||got - want|| / ||want||``, in float64 on the CPU."""
    return max(
        float((got[k].cpu().double() - want[k].cpu().double()).norm() / want[k].cpu().double().norm()) for k in want
    )


def adapter_run(device: torch.device, width: int, block: int, compile) -> Callable[[], dict]:
    """A function returning the steps (closures) of the adapter on the check model, and its params."""
    model, data = model_and_data(device, width)
    opt = dash_fn.DASH(model.parameters(), lr=1e-2, block_size=block, compile=compile, **CHECK_CONFIG)

    def one(x):
        model.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    return [lambda x=x: one(x) for x in data], lambda: {k: v.detach().clone() for k, v in model.named_parameters()}


def step_in_place(params: dict, config: dash_fn.DashConfig, compile, lr: torch.Tensor):
    """``one(grads, t)``: step t of ``config``'s functional step (compiled with ``compile``
    options, or eager when None) as a training loop calls it on fixed input buffers. Under CUDA
    graphs a replay overwrites the previous replay's outputs, so each call's new params are
    copied into ``params`` (static addresses, as the state's) before the next call."""
    for x in params.values():
        torch._dynamo.mark_static_address(x, guard=False)
    state = dash_fn.init(params, config)
    step = dash_fn.step if compile is None else torch.compile(dash_fn.step, fullgraph=True, **compile)
    graphs = compile is not None and compile.get("mode") == "reduce-overhead"

    def one(grads: dict, t: int) -> None:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        new, _ = step(params, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))
        for k in params:
            params[k].copy_(new[k])

    return one


def functional_run(device: torch.device, width: int, block: int, compile, options: dict = CHECK_CONFIG):
    """The functional step (:func:`step_in_place`; ``options`` the DashConfig's) on the same
    model's parameters and fixed gradients."""
    model, _ = model_and_data(device, width)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    grads = [{k: torch.randn(v.shape, generator=gen).to(device) for k, v in params.items()} for _ in range(8)]
    config = dash_fn.DashConfig(block_size=block, **options)
    one = step_in_place(params, config, compile, torch.tensor(1e-2, device=device))
    return [lambda t=t: one(grads[t - 1], t) for t in range(1, 9)], lambda: {k: v.clone() for k, v in params.items()}


WARMUP = 3  # a refresh and a plain step (periodic NDB: two graphs), and CUDA graphs' recording call


def checked_steps(device: torch.device, steps, watch: bool) -> str:
    """WARMUP steps, then the rest under :func:`no_syncs_allowed` (``watch``) or simply run: a
    dispatch mode cannot watch compiled code on the CPU, whose graphs
    tests/test_accelerator_path.py inspects instead."""
    for step in steps[:WARMUP]:
        step()
    # past the warm-up a recompile (or a CUDA graph recorded again) is an error of its own,
    # not a sync that the sync check would report without its cause
    with torch.compiler.set_stance("fail_on_recompile"):
        if not watch:
            for step in steps[WARMUP:]:
                step()
            return f"ran {len(steps) - WARMUP} steps (graphs: tests/test_accelerator_path.py)"
        with no_syncs_allowed(device):
            for step in steps[WARMUP:]:
                step()
    return f"no sync in {len(steps) - WARMUP} steps"


def partial_run(options: dict):
    """:func:`functional_run` with another DashConfig (read at call time, so a test's patch
    of ``functional_run`` reaches these rows too)."""
    return lambda device, width, block, compile: functional_run(device, width, block, compile, options=options)


def sync_and_graph_rows(report: Report, deadline: Deadline, device: torch.device, width: int, block: int, cuda_graphs):
    """Eager references first, then each compiled form: no sync, no CUDA-graph skip, eager's numbers."""
    cuda = device.type == "cuda"
    graphs = " + CUDA graphs" if cuda else ""
    references: dict[str, dict] = {}
    for kind, make in (
        ("adapter", adapter_run),
        ("functional step", functional_run),
        ("functional step, spectral rule + eps_rel + nesterov_G", partial_run(UPDATE_RULES_CONFIG)),
        ("functional step, the defaults (auto: coupled Newton, cube roots)", partial_run(DEFAULTS_CONFIG)),
        ("functional step, eigenvalue-corrected (auto: qr bases)", partial_run(CORRECTED_CONFIG)),
    ):

        def eager(kind=kind, make=make) -> tuple[str, bool]:
            steps, params = make(device, width, block, False if kind == "adapter" else None)
            result = checked_steps(device, steps, watch=True)
            references[kind] = params()
            return result, True

        def compiled(kind=kind, make=make) -> tuple[str, bool]:
            before = cudagraph_skips()
            steps, params = make(device, width, block, cuda_graphs)
            result = checked_steps(device, steps, watch=cuda)
            skips = cudagraph_skips() - before
            difference = relative_difference(params(), references[kind]) if kind in references else None
            ok = skips == 0 and difference is not None and difference <= COMPILED_TOLERANCE
            against = "no eager reference" if difference is None else f"{difference:.1e} from eager"
            return f"{result}; CUDA-graph skips {skips}; {against} (limit {COMPILED_TOLERANCE:.0e})", ok

        guarded(report, deadline, f"{kind}, eager", 30, eager)
        guarded(report, deadline, f"{kind}, compiled{graphs}", 90, compiled)


def accuracy(device: torch.device, shapes: dict, block: int, solver: str, steps: int = 12) -> tuple[float, float]:
    """``||W - W_cpu64|| / ||W_cpu64||`` (largest over the parameters) after ``steps`` steps, of
    float32 on ``device`` and of float32 on the CPU: the same arithmetic, so a device that
    computes right is about as far from float64 as the CPU is."""
    config = dash_fn.DashConfig(block_size=block, solver=solver, inv_root_freq=3, eps=EPS, refresh_schedule="periodic")
    gen = torch.Generator().manual_seed(0)
    start = {k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()}
    grads = [{k: torch.randn(s, generator=gen, dtype=torch.float64) for k, s in shapes.items()} for _ in range(steps)]
    results = []
    cpu = torch.device("cpu")
    for where, dtype in ((device, torch.float32), (cpu, torch.float32), (cpu, torch.float64)):
        # the CPU runs take the CPU strategy, also in the dry run (whose "device" is the simulated one)
        with simulated_accelerator(False) if len(results) else contextlib.nullcontext():
            params = {k: v.to(where, dtype) for k, v in start.items()}
            state = dash_fn.init(params, config)
            for t, g in enumerate(grads, 1):
                params, state = dash_fn.step(
                    params,
                    {k: v.to(where, dtype) for k, v in g.items()},
                    state,
                    lr=1e-2,
                    refresh=dash_fn.is_refresh_step(config, t),
                )
        results.append(params)
    on_device, on_cpu, exact = results
    return relative_difference(on_device, exact), relative_difference(on_cpu, exact)


EIGH_NOT_GRAPHED = "torch.linalg.eigh reads cuSOLVER's error flags on the host, which stream capture rejects"


def compiled_variants(dry_run: bool, solver: str) -> dict[str, dict]:
    """The compiled rows of a solver's table: name -> torch.compile options; never eigh under
    CUDA graphs (``EIGH_NOT_GRAPHED``)."""
    if dry_run:
        return {"dash_fn compiled (aot_eager)": {"backend": "aot_eager"}}
    variants = {
        "dash_fn compiled + CUDA graphs": {"backend": "inductor", "mode": "reduce-overhead"},
        "dash_fn compiled, no CUDA graphs": {"backend": "inductor"},
    }
    return {name: kw for name, kw in variants.items() if not (solver == "eigh" and kw.get("mode"))}


def peak_flops(device: torch.device, precision: str) -> float:
    """FLOP/s of a large batched product with ``precision``'s operands on ``device``, measured now
    (float32 accumulation: the kernel the step's products run)."""
    n, k = (4096, 8) if device.type == "cuda" else (256, 4)
    a, b = torch.randn(k, n, n, device=device), torch.randn(k, n, n, device=device)
    product = products_for(precision, device)
    product(a, b)
    return 2 * k * n**3 / median_seconds(lambda: product(a, b), 5, device)


def timing_rows(report: Report, deadline: Deadline, args, device, shapes, block: int, label: str) -> None:
    """One step_bench table per solver, each in its own guarded row, its rows written to the
    report as each implementation finishes; the sequential baseline takes the same root order."""
    peaks: list[float] = []

    def measure_peak() -> tuple[str, bool]:
        peaks.append(peak_flops(device, "float32"))
        return f"{peaks[0] / 1e12:.2f} TFLOP/s", True

    guarded(report, deadline, "float32 matmul peak", 10, measure_peak)
    rows: list[dict] = []
    for solver in args.solver:
        variants = compiled_variants(args.dry_run, solver)
        if not args.dry_run and solver == "eigh":
            report.row("eigh: CUDA-graph rows", f"not timed: {EIGH_NOT_GRAPHED}")

        def table(solver=solver, variants=variants) -> tuple[str, bool]:
            new, skips = timed_table(report, device, shapes, label, block, solver, args.reps, peaks, variants)
            rows.extend(new)
            return f"{len(new)} rows (above); CUDA-graph skips {skips}", skips == 0

        guarded(report, deadline, f"{solver}: step times, {label}", 60 if args.dry_run else 120, table)
    if rows:
        report.line(speedups(rows))


def timed_table(report, device, shapes, label, block, solver, reps, peaks, variants, **options):
    """A step_bench table written to the report row by row; returns (rows, CUDA-graph skips)."""
    before = cudagraph_skips()
    report.line()
    report.line("\n".join(markdown([]).splitlines()[:2]))  # the table's header; rows follow as they come
    try:
        rows = bench(
            shapes,
            label,
            block,
            solver,
            device,
            reps,
            peaks[0] if peaks else float("nan"),
            variants,
            warmup=WARMUP,
            on_row=lambda row: report.line(markdown([row]).splitlines()[2]),
            **options,
        )
    finally:
        torch._dynamo.reset()  # frees the graphs and CUDA-graph pools before the next table
        report.line()
    return rows, cudagraph_skips() - before


def shipped_step(device: torch.device, shapes: dict, config: dash_fn.DashConfig, compile, reps: int) -> float:
    """Median seconds of the functional step of ``config`` as a training loop calls it (no
    refresh flag under the staggered schedule: every step the same program), compiled with
    ``compile`` options (None: eager); fixed input buffers, as under CUDA graphs they must be."""
    gen = torch.Generator().manual_seed(0)
    params = {k: torch.randn(s, generator=gen).to(device) for k, s in shapes.items()}
    grads = {k: torch.randn(s, generator=gen).to(device) for k, s in shapes.items()}
    for x in grads.values():
        torch._dynamo.mark_static_address(x, guard=False)
    one = step_in_place(params, config, compile, torch.tensor(1e-3, device=device))
    for _ in range(WARMUP):
        one(grads, 1)
    return median_seconds(lambda: one(grads, 1), reps, device)


def adamw_step(device: torch.device, shapes: dict, reps: int) -> float:
    """Median seconds of torch.optim.AdamW's (foreach) step on the same parameters."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device).requires_grad_(True) for s in shapes.values()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    opt.step()
    return median_seconds(opt.step, reps, device)


def shipped_rows(report: Report, deadline: Deadline, args, device, shapes, blocks, label, cuda_graphs) -> None:
    """The defaults as a user's GPU runs them (staggered, coupled Newton's cube roots, the
    default precision), compiled (with CUDA graphs on a GPU) and eager, at each block size and
    in the eigenvalue-corrected mode; each beside AdamW's step on the same layer."""
    adamw: list[float] = []

    def adamw_row() -> tuple[str, bool]:
        adamw.append(adamw_step(device, shapes, args.reps))
        return f"{1e3 * adamw[0]:.2f} ms", True

    guarded(report, deadline, f"shipped: torch AdamW (foreach), {label}", 10, adamw_row)
    modes = (
        ("DashConfig()", {}),  # precision "auto": float16 tensor-core products on a GPU
        ("DashConfig(precision='float32')", {"precision": "float32"}),
        ("eigenvalue-corrected", {"preconditioner": "eigenvalue_corrected"}),
    )
    for block in blocks:
        for mode, options in modes:
            config = dash_fn.DashConfig(block_size=block, **options)

            def row(config=config) -> tuple[str, bool]:
                before = cudagraph_skips()
                try:
                    graphed = shipped_step(device, shapes, config, cuda_graphs, args.reps)
                finally:
                    torch._dynamo.reset()
                skips = cudagraph_skips() - before
                eager = shipped_step(device, shapes, config, None, args.reps)
                ratio = f"; {graphed / adamw[0]:.1f}x AdamW's step" if adamw else ""
                return (
                    f"compiled{' + CUDA graphs' if device.type == 'cuda' else ''} {1e3 * graphed:.2f} ms, eager "
                    f"{1e3 * eager:.2f} ms per step{ratio}; CUDA-graph skips {skips}",
                    skips == 0,
                )

            name = f"shipped: {mode}, block {block}, precision {config.precision}, {label}"
            guarded(report, deadline, name, 30 if args.dry_run else 60, row)


def precision_rows(report: Report, deadline: Deadline, args, device, shapes, block, label, cuda_graphs) -> None:
    """Plain and refresh steps of coupled Newton (the GPU's solver for the default cube roots)
    at each precision, with % of that precision's own peak; the sequential baseline and AdamW
    once, in float32."""
    variants = {"dash_fn compiled" + (" + CUDA graphs" if device.type == "cuda" else ""): cuda_graphs}
    for precision in PRECISIONS:

        def row(precision=precision) -> tuple[str, bool]:
            peak = peak_flops(device, precision)
            report.line(f"\n{precision}: peak of its products {peak / 1e12:.2f} TFLOP/s")
            options = {"options": {"precision": precision}, "baselines": precision == "float32"}
            with warnings.catch_warnings():  # the dry run emulates the 16-bit products, as init says
                warnings.filterwarnings("ignore", "precision=")
                rows, skips = timed_table(
                    report, device, shapes, label, block, "cn", args.reps, [peak], variants, **options
                )
            return f"{len(rows)} rows (above); peak {peak / 1e12:.2f} TFLOP/s; CUDA-graph skips {skips}", skips == 0

        name = f"precision {precision}: coupled Newton step times, {label}"
        guarded(report, deadline, name, 30 if args.dry_run else 60, row)


def distributed_shampoo_times(device: torch.device, shapes: dict, block: int, root: str, reps: int):
    """(plain, refresh) seconds of Meta's Distributed Shampoo on the layer, as close to dash_fn's
    periodic coupled-Newton step as it goes: blocks of ``block`` (max_preconditioner_dim),
    inverse cube roots (``inverse_exponent_override={2: 1/3}``) by ``root`` ("eigh":
    EigenConfig; "cn": CoupledNewtonConfig with 10 iterations, as dash_fn's), refreshed every 10
    steps, Adam grafting, float32 (its only precision). It refreshes at steps divisible by its
    frequency and preconditions from its start step: steps 11-19 are its plain steps, step 20 a
    refresh (one sample: a refresh of the 953M layer takes seconds)."""
    import distributed_shampoo as ds

    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device).requires_grad_(True) for s in shapes.values()]
    for p in params:
        p.grad = torch.randn_like(p)
    amortized = ds.EigenConfig() if root == "eigh" else ds.CoupledNewtonConfig(max_iterations=10)
    opt = ds.DistributedShampoo(
        params,
        lr=1e-3,
        betas=(0.9, 0.95),
        epsilon=1e-10,
        max_preconditioner_dim=block,
        precondition_frequency=10,
        start_preconditioning_step=10,
        grafting_config=ds.AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8),
        preconditioner_config=ds.RootInvShampooPreconditionerConfig(
            amortized_computation_config=amortized, inverse_exponent_override={2: 1 / 3}
        ),
    )
    for _ in range(10):  # grafting only, then the first refresh
        opt.step()
    plain = median_seconds(opt.step, min(reps, 9), device)
    for _ in range(19 - 10 - min(reps, 9)):
        opt.step()
    return plain, median_seconds(opt.step, 1, device)


def peer_rows(report: Report, deadline: Deadline, args, device, shapes, block, label, cuda_graphs) -> None:
    """Meta's Distributed Shampoo (eigh and coupled-Newton roots) on the layer, beside dash_fn's
    periodic coupled-Newton step at its default precision on the same layer (the refresh ratio
    is the issue's target); a missing package is reported, not failed (it is not on PyPI:
    gpu_day.sh fetch builds its wheel from a checkout)."""
    try:
        import distributed_shampoo  # noqa: F401
    except ImportError:
        report.row("distributed shampoo", "not run: distributed_shampoo is not installed (benchmarks/gpu_day.sh fetch)")
        return
    ours: list[dict] = []

    def dash_row() -> tuple[str, bool]:
        variants = {"dash_fn compiled" + (" + CUDA graphs" if device.type == "cuda" else ""): cuda_graphs}
        rows, skips = timed_table(report, device, shapes, label, block, "cn", args.reps, [], variants, baselines=False)
        ours.extend(rows)
        return f"plain {rows[0]['plain_ms']:.1f} ms, refresh {rows[0]['refresh_ms']:.1f} ms", skips == 0

    guarded(report, deadline, f"dash_fn, coupled Newton, periodic, default precision, {label}", 60, dash_row)
    for root in ("cn", "eigh"):

        def row(root=root) -> tuple[str, bool]:
            plain, refresh = distributed_shampoo_times(device, shapes, block, root, args.reps)
            ratio = ""
            if ours:
                times = 1e3 * refresh / ours[0]["refresh_ms"]
                faster = f"{times:.1f}x faster" if times >= 1 else f"{1 / times:.1f}x slower"
                ratio = f"; dash_fn's refresh {faster}"
            return f"plain {1e3 * plain:.1f} ms, refresh {1e3 * refresh:.1f} ms{ratio}", True

        guarded(report, deadline, f"distributed shampoo, {root} roots, {label}", 30 if args.dry_run else 90, row)


def training_rows(report: Report, deadline: Deadline, args, device) -> None:
    """A whole training step: examples/train_lm.py for AdamW, Muon and DASH (its defaults, so its
    default precision), its summary table (ms per step, final loss, AdamW's steps and seconds
    to its final loss) in the report."""
    if args.dry_run:
        size = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--steps", "4", "--batch", "2"]
        size += ["--eval-every", "2", "--eval-batches", "1", "--backend", "aot_eager", "--corpus-bytes", "200000"]
    else:  # size l with 32x the scaling study's batch (32,768 tokens a step)
        size = ["--size", "l", "--steps", "300", "--batch", "512", "--eval-every", "50"]
    runs = ["adamw@0.001", "muon@0.003", "dash-defaults@0.001"]

    def row() -> tuple[str, bool]:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, os.path.join(ROOT, "examples", "train_lm.py"), *size, "--runs", *runs]
            command += ["--device", device.type, "--out", out, "--no-progress", "--seeds", "0"]
            env = {**os.environ, "DASH_FN_SIMULATE_ACCELERATOR": "1" if args.dry_run else ""}
            left = max(30.0, deadline.left() + WATCHDOG_AFTER - 10)  # inf without a budget
            limit = None if math.isinf(left) else left
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
            summary = os.path.join(out, "summary.md")
            if done.returncode or not os.path.exists(summary):
                return f"train_lm failed ({done.returncode}): {' '.join(done.stderr.split()[-60:])}", False
            report.line()
            with open(summary) as f:
                report.line(f.read().strip())
            report.line()
        return f"{' '.join(runs)} (summary above)", True

    guarded(report, deadline, "training: examples/train_lm.py, AdamW, Muon and DASH", 60 if args.dry_run else 150, row)


def accuracy_rows(report: Report, deadline: Deadline, args, device, small, block) -> None:
    """Each solver's float32 steps on the device against float64 on the CPU."""
    for solver in ("cn", "ndb", "eigh"):

        def agreement(solver=solver) -> tuple[str, bool]:
            on_device, on_cpu = accuracy(device, small, block, solver)
            limit = FLOAT32_FACTOR * on_cpu + FLOAT32_FLOOR
            return f"{on_device:.1e} (float32 on the CPU: {on_cpu:.1e}; limit {limit:.1e})", on_device <= limit

        check = f"{solver}: float32 on {device.type} vs float64 on CPU, 12 steps, max relative difference"
        guarded(report, deadline, check, 20 if args.dry_run else 60, agreement)


def run(args, report: Report) -> None:
    deadline = Deadline(args.budget)
    if args.dry_run:
        device, shapes, block, width, small, label = torch.device("cpu"), TINY_LAYER, 16, 16, TINY_LAYER, "tiny"
        cuda_graphs = {"backend": "aot_eager"}
        blocks = (8, 16)
        name = "CPU (dry run, accelerator strategy simulated)"
        tf32 = "n/a"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check.py needs CUDA; use --dry-run to check the script on CPU")
        device, shapes, block, width, label = torch.device("cuda"), LLAMA_953M_LAYER, 1024, 512, "953M layer"
        small = {k: (r // 8, c // 8) for k, (r, c) in shapes.items()}  # the CPU's float64 run stays short
        cuda_graphs = {"backend": "inductor", "mode": "reduce-overhead"}
        blocks = (256, 1024)
        # a graph that CUDA graphs would skip raises, with Inductor's reason, instead of running uncaptured
        torch._inductor.config.triton.cudagraph_or_error = True
        name = torch.cuda.get_device_name()
        tf32 = torch.backends.cuda.matmul.fp32_precision
    import tensordict

    sections = [s for s in SECTIONS if s in (args.only or SECTIONS) and s not in args.skip]
    report.line(
        f"{name}, torch {torch.__version__}, tensordict {tensordict.__version__}, float32 products: torch's "
        f"fp32_precision {tf32!r}, {budget_text(args.budget)}, sections {', '.join(sections)}"
    )
    report.line()
    report.line("| check | result |")
    report.line("|---|---|")
    torch._dynamo.utils.counters.clear()
    for section in sections:
        if section == "shipped":
            shipped_rows(report, deadline, args, device, shapes, blocks, label, cuda_graphs)
        elif section == "precision":
            precision_rows(report, deadline, args, device, shapes, block, label, cuda_graphs)
        elif section == "peers":
            peer_rows(report, deadline, args, device, shapes, block, label, cuda_graphs)
        elif section == "syncs":
            sync_and_graph_rows(report, deadline, device, width, min(block, 256), cuda_graphs)
        elif section == "accuracy":
            accuracy_rows(report, deadline, args, device, small, min(block, 256))
        elif section == "solvers":
            timing_rows(report, deadline, args, device, shapes, block, label)
        elif section == "training":
            training_rows(report, deadline, args, device)
        try:
            torch._dynamo.reset()
        except Exception as error:  # a sticky device error: the rows after it fail on their own
            report.row(f"reset after {section}", describe(error), False)
    report.line()
    verdict = f"FAILED: {', '.join(report.failures)}" if report.failures else "every check that ran passed"
    not_run = f"; {len(report.not_run)} not run (budget)" if report.not_run else ""
    report.line(f"{verdict}{not_run}; total wall time {deadline.elapsed():.0f} s, {budget_text(args.budget)}")


def budget_text(budget: float | None) -> str:
    return "no budget" if budget is None else f"budget {budget:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes, aot_eager, the accelerator strategy simulated"
    )
    parser.add_argument(
        "--solver", nargs="+", default=["cn", "ndb", "eigh"], help="root solvers of the solvers section's tables"
    )
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=[], help="run only these sections")
    parser.add_argument("--skip", nargs="+", choices=SECTIONS, default=[], help="leave these sections out")
    parser.add_argument("--reps", type=int, default=10, help="timed steps per row (median)")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds after which no new row starts (the report is written by then); when not given, "
        f"{GPU_BUDGET:.0f} on a GPU and none in a dry run",
    )
    parser.add_argument("--out", help="append each row to this markdown file as it completes")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.reps = 1
    elif args.budget is None:
        args.budget = GPU_BUDGET
    report = Report(args.out)
    # should a row hang past the budget, the log shows where before the command is killed (a
    # killed run writes no traceback), and again every 30 s; a dry run without a budget has the
    # test's own timeout as its hang guard
    repeat = None
    if args.budget is not None:
        faulthandler.dump_traceback_later(args.budget + WATCHDOG_AFTER, repeat=False, exit=False)
        repeat = threading.Timer(args.budget + WATCHDOG_AFTER + 1, faulthandler.dump_traceback_later, (30, True))
        repeat.daemon = True
        repeat.start()
    try:
        with simulated_accelerator() if args.dry_run else contextlib.nullcontext():
            run(args, report)
    finally:
        if repeat is not None:
            repeat.cancel()
        faulthandler.cancel_dump_traceback_later()
        report.close()
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
