"""The GPU check: does DASH's default pay on a GPU, and is every number it gives right?

    python -m benchmarks.gpu_check --out gpu.md           # on a CUDA machine (benchmarks/gpu_day.sh runs it)
    python -m benchmarks.gpu_check --dry-run --out dry.md # on CPU: tiny shapes, aot_eager, the accelerator
                                                          # strategy simulated and the tensor-core stand-in
                                                          # registered (checks the script, in CI)
    python -m benchmarks.gpu_check --skip syncs accuracy  # leave out sections already proven
    python -m benchmarks.gpu_check --limits               # on CPU: the emulated figures the limits come from

One run of at most 8 minutes answers, in this order (``--only`` / ``--skip`` pick sections):

- ``shipped``: (a) ``DashConfig()`` on the Llama-953M layer at block 256 as a GPU runs it
  (float16 tensor-core products, coupled Newton's cube roots, staggered refresh), compiled under
  CUDA graphs: no host sync, finite, its distance to the same steps in float64 within the limit
  of its precision (``SHIPPED_LIMITS``), ms per step; (b) the same with ``precision="float32"``.
- ``peers``: (c) Meta's Distributed Shampoo on the layer with the same blocks, exponent and
  refresh period, coupled-Newton roots, in float32 and in its lowest precision (bfloat16 factor
  matrices and roots); (d) torch's AdamW and Muon steps on the layer. Each beside (a)'s step.
- ``training``: (e) a whole training step, ``examples/train_lm.py --size l`` for AdamW, Muon and
  DASH's default: ms per step and the loss after a fixed number of steps.
- (f) everything else: ``syncs`` (eager and compiled steps of the adapter and the functional
  step under ``torch.cuda.set_sync_debug_mode("error")``, CUDA-graph skips, compiled against
  eager), ``accuracy`` (each solver's float32 steps against float64), ``solvers`` (the per-solver
  step-time tables at block 1024), ``precision`` (coupled Newton's step at each
  ``DashConfig.precision``, against the peak of a raw ``torch.bmm`` of its operands), ``bits``
  (does a block get the same bits from the float32 and tensor-core products in stacks of
  different lengths, and how far apart do the steps of the same blocks in stacks of other
  lengths end: the gap the exact FSDP mode leaves), ``variants`` (the defaults at block 1024,
  the eigenvalue-corrected mode, Distributed Shampoo with eigh roots).

Every row prints the precision and kernel of dash_fn's products it ran (``float16 products
(tensor_core)``) and the seconds it took. The order is the rows' cost on the H200 run
(benchmarks/RESULTS.md, "GPU"): (a)-(e) need about ``sum(NEED[...])`` seconds, compiles
included, inside the 420-second budget; a GPU run that ends early skips only (f).

Fail-safe by construction, since a GPU run is rare and short: every row is appended to the
report file (``--out``) as soon as it is known; each row runs in its own ``try``, and a failure
keeps the exception and the innermost frames of its traceback; a deadline (``--budget``
seconds from the start; on a GPU 420 unless given, none in a dry run unless given) stops
starting new rows whose estimated need no longer fits, and cuts a row that runs past it (the
row says so, with the frames where it was cut; the log has the whole traceback); the exit
status is 1 when any row failed or was wrong, so a wrong number fails the script, not only a
crash. A watchdog dumps every thread's traceback to the log ``WATCHDOG_AFTER`` seconds past the
budget and every 30 s after, for a hang in native code that the cut cannot interrupt.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import torch

import dash_fn
from benchmarks.step_bench import bench, markdown, median_seconds, speedups
from benchmarks.syncs import SyncCounter
from benchmarks.tensor_core_stand_in import process_stand_in, tensor_core_stand_in
from dash_fn.preconditioners import config_products
from dash_fn.roots.matmul import LOW, products_for, tf32_bmm
from dash_fn.strategy import simulated_accelerator

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SECTIONS = ("shipped", "peers", "training", "syncs", "accuracy", "solvers", "precision", "bits", "variants")
PRECISIONS = ("float32", "tf32", "bfloat16", "float16")
GPU_BUDGET = 420.0  # seconds of rows on a GPU: an 8-minute command less the report's and watchdog's margin
# seconds past the budget: inside gpu_day.sh's 8-minute command at the default budget, with
# room for its start (the wheels unpacked, torch imported twice) before the budget's clock starts
WATCHDOG_AFTER = 20

# Seconds a row needs on one H100 or H200, compiles included: a row starts only while its need
# fits in the budget left. Estimated from the H200 run's time for its compiled configurations
# (benchmarks/RESULTS.md, "GPU") with room; every row prints its own seconds, and the next
# run's figures replace these.
NEED = {
    "shipped": 75,  # a compile under CUDA graphs, 12 steps, 12 eager float64 steps, 10 timed steps
    "distributed shampoo": 45,  # 20 steps, two of them refreshes one block at a time
    "torch step": 10,
    "training": 150,  # three runs of train_lm at size l, 200 steps each, one compile each
    "sync row": 45,
    "accuracy": 40,
    "table": 120,
    "precision": 60,
    "bits": 60,
    "variant": 90,
}

# One transformer layer of Llama 953M (docs/ALGORITHM.md 3.2): fused qkv, o, gate, up, down.
LLAMA_953M_LAYER = {
    "qkv": (6144, 2048),
    "o": (2048, 2048),
    "gate": (5632, 2048),
    "up": (5632, 2048),
    "down": (2048, 5632),
}
TINY_LAYER = {"qkv": (96, 32), "o": (32, 32), "gate": (88, 32), "up": (88, 32), "down": (32, 88)}
SHIPPED_BLOCK = {"953M layer": 256, "tiny": 16}  # the default block, and the dry run's
VARIANT_BLOCK = {"953M layer": 1024, "tiny": 32}  # the paper's block, and the dry run's
SHIPPED_STEPS = 12  # a whole staggered cycle (every block's roots refreshed) and two steps more
# ||W - W_float64|| / ||W_float64|| (largest over the parameters) after SHIPPED_STEPS steps of
# the shipped step, per layer and resolved precision of its products, from the same steps with
# the products emulated on the CPU (`python -m benchmarks.gpu_check --limits`, and with
# --dry-run for the tiny layer; the figures in benchmarks/RESULTS.md, "The GPU check's third
# edition and its limits"), rounded up to one digit. float32: FLOAT32_FACTOR (10) times the figure, as the accuracy rows
# allow a device's float32 against the CPU's (a GPU's accumulation order and Inductor's fused
# kernels round otherwise). float16: LIMIT_FACTOR (3) times, since its operands' rounding, the
# same on any device, dominates; bfloat16 operands by mistake land 8x further. A float16 row
# must also end further from float64 than float32's limit: closer, its products were not 16-bit.
SHIPPED_LIMITS = {
    "953M layer": {"float32": 1e-6, "float16": 8e-5},
    "tiny": {"float32": 1e-6, "float16": 2e-4},
}
LIMIT_FACTOR = 3
# NDB (Shampoo's 4th roots) with momentum and the defaults' floor and look-ahead (the guard,
# skip_nonfinite, is on by default), float32 products; eps 1e-6 so that a difference
# between compiled and eager measures the compiler: at 1e-10 the near-null eigenvalues of these
# rank-deficient factors (batches of 32) amplify rounding noise by eps^(-1/4) in any two programs
EPS = 1e-6
CHECK_CONFIG = dict(solver="ndb", inv_root_freq=2, mu=0.5, eps=EPS, eps_graft=1e-8, precision="float32")
# the update-rule options (docs/ALGORITHM.md 4 c-e) on the same step: the spectral rule's power
# iteration, the relative floor and Nesterov's look-ahead are the parts a CUDA graph has not seen
UPDATE_RULES_CONFIG = CHECK_CONFIG | dict(grafting="spectral", eps_rel=1e-5, nesterov_G=True)
# the defaults off the CPU: solver "auto" takes coupled Newton for their cube roots, precision
# "auto" its float16 products
DEFAULTS_CONFIG = {k: v for k, v in CHECK_CONFIG.items() if k not in ("solver", "precision")}
# Adam in the factors' eigenbases; "auto" takes orthogonal iteration (a product and a batched QR)
CORRECTED_CONFIG = DEFAULTS_CONFIG | dict(preconditioner="eigenvalue_corrected")
# ||W_compiled - W_eager|| / ||W_eager|| after the steps, per precision of the products: fused
# kernels round differently in float32 (the H200's rows, RESULTS "GPU", are well inside), and a float32
# difference of one unit in the last place moves a float16 operand by one of its own units now
# and then, which the steps carry (float16: 3x the emulated figure, rounded up, `python
# -m benchmarks.gpu_check --limits`, benchmarks/RESULTS.md, "The GPU check's third edition and its limits").
COMPILED_TOLERANCE = {"float32": 1e-4, "float16": 3e-3}
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
    """The budget: a row starts only while at least its ``need`` seconds are left, and is cut
    when it runs past the end; ``None`` is no budget (a dry run checks the script: every row
    runs, however slow the machine)."""

    def __init__(self, seconds: float | None):
        self.start = time.monotonic()
        self.end = self.start + (math.inf if seconds is None else seconds)

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.start


class RowCut(BaseException):
    """Raised inside a row when the deadline passes (a BaseException: no ``except Exception``
    of the code under the row swallows it)."""


def _cut(signum, frame) -> None:
    traceback.print_stack(frame)  # where the row was, into the log
    # again each second: a cut raised where it is swallowed (a __del__, a callback) is not the last
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    raise RowCut("the deadline passed inside this row")


def was_cut(error: BaseException) -> bool:
    """Whether a :class:`RowCut` is in ``error``'s chain (another error raised while the cut
    unwound, e.g. by a CUDA-graph capture's exit, still means the row was cut)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, RowCut):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def cut_at(deadline: Deadline):
    """Within the block, :class:`RowCut` is raised in the main thread when the deadline passes
    (SIGALRM: it interrupts Python code, and native calls when they return)."""
    left = deadline.left()
    if math.isinf(left) or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _cut)
    timer = signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *timer)


def guarded(report: Report, deadline: Deadline, check: str, need: float, fn: Callable[[], tuple[str, bool]]) -> None:
    """Run one row: ``fn`` returns (result, ok); an exception fails the row with its type,
    message and innermost frames; too little budget left skips it, and the deadline passing
    inside it cuts it (neither is a failure: the report counts them as not run)."""
    if deadline.left() < need:
        report.not_run.append(check)
        report.row(check, f"not run: {max(0.0, deadline.left()):.0f} s of the budget left, about {need:.0f} s needed")
        return
    start = time.monotonic()
    try:
        with cut_at(deadline):
            result, ok = fn()
    except BaseException as error:  # a row's failure must not take the report with it
        if not (isinstance(error, Exception) or was_cut(error)):
            raise  # KeyboardInterrupt, SystemExit
        traceback.print_exc()  # the whole chain, into the log (gpu_day.sh keeps it)
        if was_cut(error):
            report.not_run.append(check)
            report.row(check, f"cut at the deadline after {time.monotonic() - start:.0f} s: {describe(error)}")
            return
        result, ok = describe(error), False
    report.row(check, f"{result.replace('|', '/')} ({time.monotonic() - start:.1f} s)", ok)


def describe(error: BaseException) -> str:
    """The innermost error of a chain (Dynamo and Inductor wrap the real one) with its message
    and innermost frames, and the outermost error's type when it differs."""
    root = error
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    frames = [f for f in traceback.extract_tb(root.__traceback__) if f.name != _cut.__name__][-TRACEBACK_FRAMES:]
    where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames)
    message = " ".join(str(root).split())[:400]
    wrapped = f" (raised as {type(error).__name__})" if root is not error else ""
    return f"{type(root).__name__}: {message}{wrapped} (at {where})"


def products_text(config: dash_fn.DashConfig, device: torch.device) -> str:
    """The precision and kernel of ``config``'s products on ``device`` (float32 parameters)."""
    products = config_products(config, device)
    return f"{products.precision} products ({products.kernel})"


def resolved_precision(config: dash_fn.DashConfig, device: torch.device) -> str:
    return config_products(config, device).precision


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


def layer_tensors(device: torch.device, shapes: dict, seed: int, dtype: torch.dtype = torch.float32) -> dict:
    """Standard normal tensors of ``shapes``, drawn on ``device`` from ``seed``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {k: torch.randn(s, generator=gen, device=device).to(dtype) for k, s in shapes.items()}


def shipped_steps(device: torch.device, shapes: dict, config: dash_fn.DashConfig, compile, steps: int):
    """``config``'s step (compiled with ``compile``, None: eager) from the layer's start
    (:func:`layer_tensors` seed 0) on gradient t from seed t: the steps after WARMUP under
    :func:`no_syncs_allowed` where it can watch (CUDA, or eager). Returns the parameters and
    ``again()``, one more step on the last gradient (for timing)."""
    params = layer_tensors(device, shapes, 0)
    grads = {k: torch.empty_like(v) for k, v in params.items()}
    for x in grads.values():
        torch._dynamo.mark_static_address(x, guard=False)
    one = step_in_place(params, config, compile, torch.tensor(1e-3, device=device))
    watch = device.type == "cuda" or compile is None
    for t in range(1, steps + 1):
        for k, g in layer_tensors(device, shapes, t).items():
            grads[k].copy_(g)
        if t <= WARMUP:
            one(grads, t)
            continue
        with (
            torch.compiler.set_stance("fail_on_recompile"),
            no_syncs_allowed(device) if watch else contextlib.nullcontext(),
        ):
            one(grads, t)
    return params, lambda: one(grads, steps)


def float64_steps(device: torch.device, shapes: dict, config: dash_fn.DashConfig, steps: int) -> dict:
    """The same steps as :func:`shipped_steps`, eager, in float64 (products never rounded)."""
    params = layer_tensors(device, shapes, 0, torch.float64)
    state = dash_fn.init(params, config)
    lr = torch.tensor(1e-3, device=device).double()  # float32's 1e-3, as the checked run's
    for t in range(1, steps + 1):
        grads = layer_tensors(device, shapes, t, torch.float64)
        params, state = dash_fn.step(params, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))
    return params


def shipped_check(device, shapes, config, compile, reps) -> tuple[dict, float]:
    """(a) and (b): the parameters after SHIPPED_STEPS checked steps, their distance to float64,
    and the median ms of one more compiled step."""
    params, again = shipped_steps(device, shapes, config, compile, SHIPPED_STEPS)
    checked = {k: v.clone() for k, v in params.items()}
    seconds = median_seconds(again, reps, device)
    finite = all(bool(torch.isfinite(v).all()) for v in checked.values())
    error = relative_difference(checked, float64_steps(device, shapes, config, SHIPPED_STEPS))
    return {"finite": finite, "error": error}, seconds


def shipped_rows(report: Report, deadline: Deadline, args, device, shapes, label, cuda_graphs, measured: dict) -> None:
    """(a) DashConfig() and (b) DashConfig(precision="float32") as a training loop runs them."""
    block = SHIPPED_BLOCK[label]
    for mode, options in (("DashConfig()", {}), ("DashConfig(precision='float32')", {"precision": "float32"})):
        config = dash_fn.DashConfig(block_size=block, **options)

        def row(mode=mode, config=config) -> tuple[str, bool]:
            stand_in = args.stand_in
            calls = stand_in.calls if stand_in else 0
            before = cudagraph_skips()
            try:
                found, seconds = shipped_check(device, shapes, config, cuda_graphs, args.reps)
            finally:
                torch._dynamo.reset()
            skips = cudagraph_skips() - before
            measured[mode] = seconds
            precision = resolved_precision(config, device)
            limit = SHIPPED_LIMITS[label][precision]
            # 16-bit products leave their rounding: a float16 run as close as float32 was not one
            rounded = precision == "float32" or found["error"] > SHIPPED_LIMITS[label]["float32"]
            watched = (
                f"no sync in {SHIPPED_STEPS - WARMUP} steps"
                if device.type == "cuda"
                else "syncs: test_accelerator_path.py"
            )
            ran = f"; {stand_in.calls - calls} tensor-core calls (the stand-in)" if stand_in else ""
            ok = found["finite"] and found["error"] <= limit and rounded and skips == 0
            closer = "" if rounded else f" (closer than float32's limit {SHIPPED_LIMITS[label]['float32']:.0e})"
            return (
                f"{products_text(config, device)}{ran}; {watched}; {'finite' if found['finite'] else 'NOT FINITE'}; "
                f"{found['error']:.1e} from float64 (limit {limit:.0e}){closer}; {1e3 * seconds:.2f} ms per step; "
                f"CUDA-graph skips {skips}",
                ok,
            )

        graphs = " + CUDA graphs" if device.type == "cuda" else " (aot_eager)"
        guarded(
            report,
            deadline,
            f"({'ab'[bool(options)]}) {mode}, block {block}, compiled{graphs}, {label}",
            NEED["shipped"],
            row,
        )


def distributed_shampoo_times(device: torch.device, shapes: dict, block: int, root: str, dtype: torch.dtype, reps: int):
    """(plain, refresh) seconds of Meta's Distributed Shampoo on the layer, as close to the shipped
    step as it goes: blocks of ``block`` (max_preconditioner_dim), the defaults' exponent
    (inverse cube roots, ``inverse_exponent_override={2: 1/3}``) by ``root`` ("eigh":
    EigenConfig; "cn": CoupledNewtonConfig with the defaults' 10 iterations), refreshed every 10
    steps (``DashConfig().inv_root_freq``, all blocks at once where DASH staggers them), Adam
    grafting, factor matrices and roots in ``dtype``. It refreshes at steps divisible by its
    frequency and preconditions from its start step: steps 11-19 are its plain steps, step 20 a
    refresh (one sample: a refresh of the 953M layer takes seconds)."""
    import distributed_shampoo as ds

    defaults = dash_fn.DashConfig()
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device).requires_grad_(True) for s in shapes.values()]
    for p in params:
        p.grad = torch.randn_like(p)
    amortized = ds.EigenConfig() if root == "eigh" else ds.CoupledNewtonConfig(max_iterations=defaults.newton_steps)
    opt = ds.DistributedShampoo(
        params,
        lr=1e-3,
        betas=(0.9, 0.95),
        epsilon=1e-10,
        max_preconditioner_dim=block,
        precondition_frequency=defaults.inv_root_freq,
        start_preconditioning_step=defaults.inv_root_freq,
        grafting_config=ds.AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8),
        preconditioner_config=ds.RootInvShampooPreconditionerConfig(
            amortized_computation_config=amortized,
            inverse_exponent_override={2: 1 / defaults.resolved_root_order},
            # float32 is its default (and a release without these fields still runs that row)
            **({} if dtype == torch.float32 else {"factor_matrix_dtype": dtype, "inv_factor_matrix_dtype": dtype}),
        ),
    )
    period = defaults.inv_root_freq
    for _ in range(period):  # grafting only, then the first refresh
        opt.step()
    plain = median_seconds(opt.step, min(reps, period - 1), device)
    for _ in range(period - 1 - min(reps, period - 1)):
        opt.step()
    return plain, median_seconds(opt.step, 1, device)


def torch_step(device: torch.device, shapes: dict, make, reps: int) -> float:
    """Median seconds of a torch.optim optimizer's step (``make(params)``) on the layer."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=gen).to(device).requires_grad_(True) for s in shapes.values()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make(params)
    opt.step()
    return median_seconds(opt.step, reps, device)


def beside(seconds: float, ours: float | None) -> str:
    """``seconds`` of a peer's step against ours: "DASH's step 2.1x faster" (or slower)."""
    if not ours:
        return ""
    times = seconds / ours
    return (
        f"; DashConfig()'s step {times:.1f}x faster" if times >= 1 else f"; DashConfig()'s step {1 / times:.1f}x slower"
    )


def peer_rows(report: Report, deadline: Deadline, args, device, shapes, label, measured: dict) -> None:
    """(c) Distributed Shampoo in float32 and its lowest precision, (d) AdamW and Muon, each
    beside (a)'s ms per step (DASH staggers its refresh: every step costs the same, so the
    peer's is amortized over its refresh period). Distributed Shampoo is not on PyPI: without
    its wheel (gpu_day.sh fetch) its rows say so; an error it raises is its row's answer."""
    block = SHIPPED_BLOCK[label]
    ours = measured.get("DashConfig()")
    try:
        import distributed_shampoo  # noqa: F401

        installed = True
    except ImportError:
        installed = False
        report.row(
            "(c) distributed shampoo", "not run: distributed_shampoo is not installed (benchmarks/gpu_day.sh fetch)"
        )
    for dtype in (torch.float32, torch.bfloat16) if installed else ():

        def row(dtype=dtype) -> tuple[str, bool]:
            try:
                plain, refresh = distributed_shampoo_times(device, shapes, block, "cn", dtype, args.reps)
            except (TypeError, AttributeError):  # our call does not fit its release: our failure
                raise
            except Exception as error:  # its limits (a precision it refuses) are its row's answer
                return f"Distributed Shampoo raised {describe(error)}", True
            period = dash_fn.DashConfig().inv_root_freq
            amortized = ((period - 1) * plain + refresh) / period
            return (
                f"{str(dtype)[6:]} factors and roots; plain {1e3 * plain:.1f} ms, refresh {1e3 * refresh:.1f} ms, "
                f"{1e3 * amortized:.1f} ms per step over its period{beside(amortized, ours)}",
                True,
            )

        name = f"(c) distributed shampoo, cn roots, block {block}, {str(dtype)[6:]}, {label}"
        guarded(report, deadline, name, NEED["distributed shampoo"], row)
    peers = (
        ("torch AdamW (foreach)", lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True)),
        ("torch Muon", lambda p: torch.optim.Muon(p, lr=1e-3)),
    )
    for name, make in peers:

        def torch_row(make=make) -> tuple[str, bool]:
            seconds = torch_step(device, shapes, make, args.reps)
            return f"float32 (torch); {1e3 * seconds:.2f} ms per step{beside(seconds, ours)}", True

        guarded(report, deadline, f"(d) {name}, {label}", NEED["torch step"], torch_row)


TRAIN_LM_WITH_STAND_IN = (  # the dry run's train_lm: "auto" resolves as on a GPU, through the stand-in
    # (run_module's alter_sys puts the module's file in sys.argv[0], the "-c", and keeps the rest)
    "import runpy; from benchmarks import tensor_core_stand_in; "
    "tensor_core_stand_in.register_for_the_process(); "
    "runpy.run_module('examples.train_lm', run_name='__main__', alter_sys=True)"
)


def training_rows(report: Report, deadline: Deadline, args, device) -> None:
    """(e) A whole training step: examples/train_lm.py for AdamW, Muon and DASH (its defaults, so
    its default precision), its summary table (ms per step, final loss, AdamW's steps and
    seconds to its final loss) in the report."""
    if args.dry_run:
        size = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--steps", "4", "--batch", "2"]
        size += ["--eval-every", "2", "--eval-batches", "1", "--backend", "aot_eager", "--corpus-bytes", "200000"]
        launch = [sys.executable, "-c", TRAIN_LM_WITH_STAND_IN]
    else:  # size l with 32x the scaling study's batch (32,768 tokens a step)
        size = ["--size", "l", "--steps", "200", "--batch", "512", "--eval-every", "50"]
        launch = [sys.executable, "-m", "examples.train_lm"]
    runs = ["adamw@0.001", "muon@0.003", "dash-defaults@0.001"]

    def row() -> tuple[str, bool]:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the memory this process cached, back for train_lm's
        with tempfile.TemporaryDirectory() as out:
            command = [*launch, *size, "--runs", *runs]  # from ROOT, where the examples package is
            command += ["--device", device.type, "--out", out, "--no-progress", "--seeds", "0"]
            env = {**os.environ, "DASH_FN_SIMULATE_ACCELERATOR": "1" if args.dry_run else ""}
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            summary = os.path.join(out, "summary.md")
            if done.returncode or not os.path.exists(summary):
                return f"train_lm failed ({done.returncode}): {' '.join(done.stderr.split()[-60:])}", False
            report.line()
            with open(summary) as f:
                report.line(f.read().strip())
            report.line()
        precision = products_text(dash_fn.DashConfig(), device)
        return f"{' '.join(runs)} (summary above); DASH's default: {precision}", True

    guarded(report, deadline, "(e) training: examples/train_lm.py, AdamW, Muon and DASH", NEED["training"], row)


def partial_run(options: dict):
    """:func:`functional_run` with another DashConfig (read at call time, so a test's patch
    of ``functional_run`` reaches these rows too)."""
    return lambda device, width, block, compile: functional_run(device, width, block, compile, options=options)


def sync_and_graph_rows(report: Report, deadline: Deadline, device: torch.device, width: int, block: int, cuda_graphs):
    """Eager references first, then each compiled form: no sync, no CUDA-graph skip, eager's
    numbers within the tolerance of its products' precision."""
    cuda = device.type == "cuda"
    graphs = " + CUDA graphs" if cuda else ""
    references: dict[str, dict] = {}
    for kind, make, options in (
        ("adapter", adapter_run, CHECK_CONFIG),
        ("functional step", functional_run, CHECK_CONFIG),
        (
            "functional step, spectral rule + eps_rel + nesterov_G",
            partial_run(UPDATE_RULES_CONFIG),
            UPDATE_RULES_CONFIG,
        ),
        (
            "functional step, the defaults (auto: coupled Newton, cube roots)",
            partial_run(DEFAULTS_CONFIG),
            DEFAULTS_CONFIG,
        ),
        ("functional step, eigenvalue-corrected (auto: qr bases)", partial_run(CORRECTED_CONFIG), CORRECTED_CONFIG),
    ):
        config = dash_fn.DashConfig(block_size=block, **options)
        products = products_text(config, device)
        tolerance = COMPILED_TOLERANCE[resolved_precision(config, device)]

        def eager(kind=kind, make=make, products=products) -> tuple[str, bool]:
            steps, params = make(device, width, block, False if kind == "adapter" else None)
            result = checked_steps(device, steps, watch=True)
            references[kind] = params()
            return f"{products}; {result}", True

        def compiled(kind=kind, make=make, products=products, tolerance=tolerance) -> tuple[str, bool]:
            before = cudagraph_skips()
            steps, params = make(device, width, block, cuda_graphs)
            result = checked_steps(device, steps, watch=cuda)
            skips = cudagraph_skips() - before
            difference = relative_difference(params(), references[kind]) if kind in references else None
            ok = skips == 0 and difference is not None and difference <= tolerance
            against = "no eager reference" if difference is None else f"{difference:.1e} from eager"
            return f"{products}; {result}; CUDA-graph skips {skips}; {against} (limit {tolerance:.0e})", ok

        guarded(report, deadline, f"{kind}, eager", NEED["sync row"] / 3, eager)
        guarded(report, deadline, f"{kind}, compiled{graphs}", NEED["sync row"], compiled)


def accuracy(device: torch.device, shapes: dict, block: int, solver: str, steps: int = 12) -> tuple[float, float]:
    """``||W - W_cpu64|| / ||W_cpu64||`` (largest over the parameters) after ``steps`` steps, of
    float32 on ``device`` and of float32 on the CPU, float32 products: the same arithmetic, so
    a device that computes right is about as far from float64 as the CPU is."""
    config = dash_fn.DashConfig(
        block_size=block, solver=solver, inv_root_freq=3, eps=EPS, refresh_schedule="periodic", precision="float32"
    )
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


def accuracy_rows(report: Report, deadline: Deadline, args, device, small, block) -> None:
    """Each solver's float32 steps on the device against float64 on the CPU."""
    for solver in ("cn", "ndb", "eigh"):

        def agreement(solver=solver) -> tuple[str, bool]:
            on_device, on_cpu = accuracy(device, small, block, solver)
            limit = FLOAT32_FACTOR * on_cpu + FLOAT32_FLOOR
            result = f"float32 products (plain); {on_device:.1e} (float32 on the CPU: {on_cpu:.1e}; limit {limit:.1e})"
            return result, on_device <= limit

        check = f"{solver}: float32 on {device.type} vs float64 on CPU, 12 steps, max relative difference"
        guarded(report, deadline, check, NEED["accuracy"], agreement)


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


def raw_peak_flops(device: torch.device, precision: str) -> float:
    """FLOP/s of a large raw ``torch.bmm`` of ``precision``'s operands on ``device``, measured
    now: float32 (as torch's TF32 flag is), TF32 (allowed for the call), or 16-bit operands with
    float32 accumulation and result (the tensor-core kernel of the step, without its scaling)."""
    n, k = (4096, 8) if device.type == "cuda" else (256, 4)
    a, b = torch.randn(k, n, n, device=device), torch.randn(k, n, n, device=device)
    if precision in LOW:
        a, b = a.to(LOW[precision]), b.to(LOW[precision])
        product = lambda: torch.bmm(a, b, out_dtype=torch.float32)  # noqa: E731
    else:
        product = (lambda: tf32_bmm(a, b)) if precision == "tf32" else (lambda: torch.bmm(a, b))
    product()
    return 2 * k * n**3 / median_seconds(product, 5, device)


def timing_rows(report: Report, deadline: Deadline, args, device, shapes, block: int, label: str) -> None:
    """One step_bench table per solver in float32 products, each in its own guarded row, its
    rows written to the report as each implementation finishes; the sequential baseline takes
    the same root order."""
    peaks: list[float] = []
    plain = products_text(dash_fn.DashConfig(precision="float32"), device)

    def measure_peak() -> tuple[str, bool]:
        peaks.append(raw_peak_flops(device, "float32"))
        return f"{peaks[0] / 1e12:.2f} TFLOP/s", True

    guarded(report, deadline, "float32 matmul peak (raw torch.bmm)", 10, measure_peak)
    rows: list[dict] = []
    for solver in args.solver:
        variants = compiled_variants(args.dry_run, solver)
        if not args.dry_run and solver == "eigh":
            report.row("eigh: CUDA-graph rows", f"not timed: {EIGH_NOT_GRAPHED}")

        def table(solver=solver, variants=variants) -> tuple[str, bool]:
            options = {"options": {"precision": "float32"}}
            new, skips = timed_table(
                report, device, shapes, label, block, solver, args.reps, peaks, variants, **options
            )
            rows.extend(new)
            return f"{plain}; {len(new)} rows (above); CUDA-graph skips {skips}", skips == 0

        guarded(report, deadline, f"{solver}: step times, {label}", NEED["table"], table)
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


def precision_rows(report: Report, deadline: Deadline, args, device, shapes, block, label, cuda_graphs) -> None:
    """Plain and refresh steps of coupled Newton (the GPU's solver for the default cube roots)
    at each precision, with % of the peak of a raw torch.bmm of that precision's operands; the
    sequential baseline and AdamW once, in float32."""
    variants = {"dash_fn compiled" + (" + CUDA graphs" if device.type == "cuda" else ""): cuda_graphs}
    for precision in PRECISIONS:

        def row(precision=precision) -> tuple[str, bool]:
            peak = raw_peak_flops(device, precision)
            report.line(f"\n{precision}: peak of a raw torch.bmm of its operands {peak / 1e12:.2f} TFLOP/s")
            options = {"options": {"precision": precision}, "baselines": precision == "float32"}
            with warnings.catch_warnings():  # the dry run emulates TF32, as init says
                warnings.filterwarnings("ignore", "precision=")
                rows, skips = timed_table(
                    report, device, shapes, label, block, "cn", args.reps, [peak], variants, **options
                )
            products = products_text(dash_fn.DashConfig(precision=precision), device)
            return (
                f"{products}; {len(rows)} rows (above); peak {peak / 1e12:.2f} TFLOP/s; CUDA-graph skips {skips}",
                skips == 0,
            )

        name = f"precision {precision}: coupled Newton step times, {label}"
        guarded(report, deadline, name, NEED["precision"], row)


STACK_LENGTHS = (8, 5, 3, 1)  # a stack, and the shorter stacks a rank's share of it makes


def same_bits_in_stacks(device: torch.device, block: int, precision: str) -> str:
    """Whether ``precision``'s products (the step's own: float32 plain, TF32 or 16-bit tensor
    cores) give each block the same bits in stacks of STACK_LENGTHS: the first n and the last n
    blocks of the longest stack, alone, against the whole stack's."""
    products = products_for(precision, device)
    k = STACK_LENGTHS[0]
    a, b = (torch.randn(k, block, block, generator=torch.Generator().manual_seed(s)).to(device) for s in (0, 1))
    whole = products(a, b)
    worst = 0.0
    for n in STACK_LENGTHS[1:]:
        for part in (slice(0, n), slice(k - n, k)):
            alone = products(a[part], b[part])
            if not torch.equal(alone, whole[part]):
                worst = max(worst, float((alone - whole[part]).abs().max() / whole[part].abs().max()))
    lengths = ", ".join(map(str, STACK_LENGTHS))
    answer = "the same bits" if worst == 0 else f"NOT the same bits: up to {worst:.1e} of the largest entry"
    return f"{precision} products ({products.kernel}): {answer} in stacks of {lengths}"


def stack_gap(device: torch.device, shapes: dict, block: int, precision: str, steps: int = 6) -> float:
    """The gap the exact FSDP mode can leave: ``relative_difference`` between the layer stepped
    as one state (a stack per block shape across the parameters) and each parameter stepped in
    a state of its own (shorter stacks, as a rank's share), periodic refresh so that the two
    refresh the same blocks; 0 where every block gets the same bits in any stack."""
    config = dash_fn.DashConfig(block_size=block, refresh_schedule="periodic", inv_root_freq=2, precision=precision)
    start = layer_tensors(device, shapes, 0)
    together, state = dict(start), dash_fn.init(start, config)
    alone = {k: ({k: v}, dash_fn.init({k: v}, config)) for k, v in start.items()}
    for t in range(1, steps + 1):
        grads, refresh = layer_tensors(device, shapes, t), dash_fn.is_refresh_step(config, t)
        together, state = dash_fn.step(together, grads, state, lr=1e-3, refresh=refresh)
        for k, (p, s) in alone.items():
            alone[k] = dash_fn.step(p, {k: grads[k]}, s, lr=1e-3, refresh=refresh)
    return relative_difference({k: p[k] for k, (p, _) in alone.items()}, together)


def bits_rows(report: Report, deadline: Deadline, args, device, shapes, label) -> None:
    """(4): the same bits for a block in stacks of other lengths (what "bitwise equal to one
    process" in the exact FSDP mode rests on), per precision of the products, and the gap after
    steps where they are not."""
    block = SHIPPED_BLOCK[label]
    for precision in ("float32", "float16"):

        def row(precision=precision) -> tuple[str, bool]:
            bits = same_bits_in_stacks(device, block, precision)
            gap = stack_gap(device, shapes, block, precision)
            return f"{bits}; the layer's parameters stepped apart end {gap:.1e} from stepped together", True

        guarded(report, deadline, f"bits across stack lengths, {precision}, block {block}, {label}", NEED["bits"], row)


def variant_step(device: torch.device, shapes: dict, config: dash_fn.DashConfig, compile, reps: int) -> float:
    """Median seconds of ``config``'s step as :func:`shipped_steps` runs it (compiled with
    ``compile`` options, None: eager), after its WARMUP steps."""
    _, again = shipped_steps(device, shapes, config, compile, WARMUP)
    return median_seconds(again, reps, device)


def variant_rows(report: Report, deadline: Deadline, args, device, shapes, label, cuda_graphs, measured) -> None:
    """The defaults at block 1024 (the paper's) and the eigenvalue-corrected mode at the default
    block, compiled and eager; Distributed Shampoo with its default eigh roots."""
    block = SHIPPED_BLOCK[label]
    for mode, config in (
        (f"DashConfig(block_size={VARIANT_BLOCK[label]})", dash_fn.DashConfig(block_size=VARIANT_BLOCK[label])),
        ("eigenvalue-corrected", dash_fn.DashConfig(block_size=block, preconditioner="eigenvalue_corrected")),
    ):

        def row(config=config) -> tuple[str, bool]:
            before = cudagraph_skips()
            try:
                graphed = variant_step(device, shapes, config, cuda_graphs, args.reps)
            finally:
                torch._dynamo.reset()
            skips = cudagraph_skips() - before
            eager = variant_step(device, shapes, config, None, args.reps)
            return (
                f"{products_text(config, device)}; compiled{' + CUDA graphs' if device.type == 'cuda' else ''} "
                f"{1e3 * graphed:.2f} ms, eager {1e3 * eager:.2f} ms per step; CUDA-graph skips {skips}",
                skips == 0,
            )

        guarded(report, deadline, f"variant: {mode}, {label}", NEED["variant"], row)
    try:
        import distributed_shampoo  # noqa: F401
    except ImportError:
        return

    def eigh_row() -> tuple[str, bool]:
        plain, refresh = distributed_shampoo_times(device, shapes, block, "eigh", torch.float32, args.reps)
        period = dash_fn.DashConfig().inv_root_freq
        amortized = ((period - 1) * plain + refresh) / period
        ours = measured.get("DashConfig()")
        return f"float32; plain {1e3 * plain:.1f} ms, refresh {1e3 * refresh:.1f} ms{beside(amortized, ours)}", True

    guarded(
        report, deadline, f"variant: distributed shampoo, eigh roots, block {block}, {label}", NEED["variant"], eigh_row
    )


def run(args, report: Report) -> None:
    deadline = Deadline(args.budget)
    if args.dry_run:
        device, shapes, block, width, small, label = torch.device("cpu"), TINY_LAYER, 16, 16, TINY_LAYER, "tiny"
        cuda_graphs = {"backend": "aot_eager"}
        name = "CPU (dry run, accelerator strategy simulated, tensor-core stand-in)"
        tf32 = "n/a"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_check.py needs CUDA; use --dry-run to check the script on CPU")
        device, shapes, block, width, label = torch.device("cuda"), LLAMA_953M_LAYER, 1024, 512, "953M layer"
        small = {k: (r // 8, c // 8) for k, (r, c) in shapes.items()}  # the CPU's float64 run stays short
        cuda_graphs = {"backend": "inductor", "mode": "reduce-overhead"}
        # a graph that CUDA graphs would skip raises, with Inductor's reason, instead of running uncaptured
        torch._inductor.config.triton.cudagraph_or_error = True
        name = torch.cuda.get_device_name()
        tf32 = torch.backends.cuda.matmul.fp32_precision
    import tensordict

    sections = [s for s in SECTIONS if s in (args.only or SECTIONS) and s not in args.skip]
    report.line(
        f"{name}, torch {torch.__version__}, tensordict {tensordict.__version__}, float32 products: torch's "
        f"fp32_precision {tf32!r}, DashConfig(): {products_text(dash_fn.DashConfig(), device)}, "
        f"{budget_text(args.budget)}, sections {', '.join(sections)}"
    )
    report.line()
    report.line("| check | result |")
    report.line("|---|---|")
    torch._dynamo.utils.counters.clear()
    measured: dict[str, float] = {}  # (a)'s ms per step, for the peers beside it
    for section in sections:
        if section == "shipped":
            shipped_rows(report, deadline, args, device, shapes, label, cuda_graphs, measured)
        elif section == "peers":
            peer_rows(report, deadline, args, device, shapes, label, measured)
        elif section == "training":
            training_rows(report, deadline, args, device)
        elif section == "syncs":
            sync_and_graph_rows(report, deadline, device, width, min(block, 256), cuda_graphs)
        elif section == "accuracy":
            accuracy_rows(report, deadline, args, device, small, min(block, 256))
        elif section == "solvers":
            timing_rows(report, deadline, args, device, shapes, block, label)
        elif section == "precision":
            precision_rows(report, deadline, args, device, shapes, block, label, cuda_graphs)
        elif section == "bits":
            bits_rows(report, deadline, args, device, shapes, label)
        elif section == "variants":
            variant_rows(report, deadline, args, device, shapes, label, cuda_graphs, measured)
        try:
            torch._dynamo.reset()
        except Exception as error:  # a sticky device error: the rows after it fail on their own
            report.row(f"reset after {section}", describe(error), False)
    report.line()
    verdict = f"FAILED: {', '.join(report.failures)}" if report.failures else "every check that ran passed"
    not_run = f"; {len(report.not_run)} not run (budget)" if report.not_run else ""
    report.line(f"{verdict}{not_run}; total wall time {deadline.elapsed():.0f} s, {budget_text(args.budget)}")


def limits(args) -> None:
    """The emulated figures the limits come from, on the CPU with the accelerator strategy
    simulated: the shipped step's distance to float64 per precision (the products of float16
    through the tensor-core stand-in), and compiled (Inductor, which lowers the emulated
    products: it refuses ``out_dtype`` on the CPU) against eager for the syncs section's
    defaults row in float16 and float32."""
    label, shapes = ("tiny", TINY_LAYER) if args.dry_run else ("953M layer", LLAMA_953M_LAYER)
    width, block = (16, 16) if args.dry_run else (512, 256)  # the syncs section's model, as run() gives it
    cpu = torch.device("cpu")
    print(f"| figure | float32 | float16 | {FLOAT32_FACTOR:.0f}x float32 | {LIMIT_FACTOR}x float16 |")
    print("|---|---|---|---|---|")
    errors = []
    for precision in ("float32", "float16"):
        config = dash_fn.DashConfig(block_size=SHIPPED_BLOCK[label], precision=precision)
        with tensor_core_stand_in(), warnings.catch_warnings():  # the stand-in's float16, as a GPU's
            warnings.filterwarnings("ignore", "precision=")
            params, _ = shipped_steps(cpu, shapes, config, None, SHIPPED_STEPS)
        errors.append(relative_difference(params, float64_steps(cpu, shapes, config, SHIPPED_STEPS)))
    figures = " | ".join(
        [f"{e:.1e}" for e in errors] + [f"{FLOAT32_FACTOR * errors[0]:.1e}", f"{LIMIT_FACTOR * errors[1]:.1e}"]
    )
    print(f"| shipped step, {label}, block {SHIPPED_BLOCK[label]}, {SHIPPED_STEPS} steps, from float64 | {figures} |")
    gaps = []
    for precision in ("float32", "float16"):
        options = DEFAULTS_CONFIG | {"precision": precision}
        with warnings.catch_warnings():  # float16 emulated on the CPU, as init warns
            warnings.filterwarnings("ignore", "precision=")
            eager_steps, eager = functional_run(cpu, width, block, None, options)
            checked_steps(cpu, eager_steps, watch=False)
            compiled_steps, compiled = functional_run(cpu, width, block, {}, options)
            checked_steps(cpu, compiled_steps, watch=False)
        gaps.append(relative_difference(compiled(), eager()))
        torch._dynamo.reset()
    figures = " | ".join([f"{g:.1e}" for g in gaps] + ["-", f"{LIMIT_FACTOR * gaps[1]:.1e}"])
    print(f"| the defaults' functional step, width {width}, block {block}, Inductor against eager | {figures} |")


def budget_text(budget: float | None) -> str:
    return "no budget" if budget is None else f"budget {budget:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU, tiny shapes, aot_eager, the accelerator strategy simulated, the tensor-core stand-in registered",
    )
    parser.add_argument(
        "--limits", action="store_true", help="print the emulated figures the limits come from (CPU) and exit"
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
        help=f"seconds after which no new row starts and a running row is cut (the report is written "
        f"by then); when not given, {GPU_BUDGET:.0f} on a GPU and none in a dry run",
    )
    parser.add_argument("--out", help="append each row to this markdown file as it completes")
    args = parser.parse_args(argv)
    if args.limits:
        with simulated_accelerator():
            limits(args)
        return 0
    if args.dry_run:
        args.reps = 1
    elif args.budget is None:
        args.budget = GPU_BUDGET
    report = Report(args.out)
    # should a row hang in native code past the budget (where the cut cannot reach it), the log
    # shows where before the command is killed (a killed run writes no traceback), and again
    # every 30 s; a dry run without a budget has the test's own timeout as its hang guard
    repeat = None
    if args.budget is not None:
        faulthandler.dump_traceback_later(args.budget + WATCHDOG_AFTER, repeat=False, exit=False)
        repeat = threading.Timer(args.budget + WATCHDOG_AFTER + 1, faulthandler.dump_traceback_later, (30, True))
        repeat.daemon = True
        repeat.start()
    # the dry run: "auto" resolves as on a GPU and its tensor-core products run on the CPU's
    # stand-in (registered for the run, unless the process has one: the simulated test pass)
    registered = tensor_core_stand_in() if args.dry_run and process_stand_in() is None else contextlib.nullcontext()
    try:
        with simulated_accelerator() if args.dry_run else contextlib.nullcontext(), registered as stand_in:
            args.stand_in = stand_in or process_stand_in()
            run(args, report)
    finally:
        if repeat is not None:
            repeat.cancel()
        faulthandler.cancel_dump_traceback_later()
        report.close()
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
