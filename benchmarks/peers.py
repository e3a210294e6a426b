"""dash_fn beside the optimizers users would pick instead: optimizer-step time and state bytes.

    python -m benchmarks.peers                       # 3 x Linear(1024, 1024), block 256
    python -m benchmarks.peers --d-model 2048 --reps 9
    python -m benchmarks.peers --quick               # tiny sizes: a smoke run
    python -m benchmarks.peers --only dash-eager adamw
    python -m benchmarks.peers --retain-freed-memory  # glibc keeps freed memory, for every row

The model is Distributed Shampoo's own kind of benchmark model: 3 x Linear(d, d) with bias.
Every optimizer gets its own copy of the same initial parameters and of the same fixed
gradients (seeded once), which are written into ``.grad`` before every step outside the timed
region (HeavyBall sets ``.grad`` to None after a step; none of the timed work is the copy).
Only ``optimizer.step()`` is timed: no forward, no backward.

Each row builds two optimizers, one whose preconditioner refreshes every step (frequency 1)
and one that refreshes every 10th step (frequency 10), and warms both up past the start of
preconditioning (``--start`` steps, then two more periods; the compiled row compiles there).
One repetition then times, per row in turn (round-robin, so that machine load falls on every
row alike), one step of the frequency-1 optimizer and 10 consecutive steps (one whole period,
one refresh in it, at whatever phase) of the frequency-10 one, each step timed on its own.
Columns, medians over the repetitions:

- "every step refreshes (freq 1)": the frequency-1 step;
- "freq 10, mean": the sum of the period's 10 steps / 10 (the amortised cost);
- "plain step (no refresh)": the median of the period's 10 steps (9 of them do not refresh);
- "state B/param": bytes of the tensors the frequency-10 optimizer holds in its state (each
  storage once; parameters and gradients excluded) / the number of parameters.

Rows and their settings (block 256 = ``--block-size``; the roots are eigh where the peer
has eigh; the preconditioning start is ``--start``, 10 by default):

- ``dash_fn.DASH`` (``dash-compiled``: ``compile=True``, torch.compile with Inductor;
  ``dash-eager``): block_size 256, solver "eigh", inv_root_freq 1 / 10, start_prec_step 10,
  otherwise dash_fn's defaults (eps 1e-10, beta_G 0.9, beta_LR 0.95, Adam grafting with
  beta_graft 0.95, eps_graft 1e-8, mu 0, vectors by AdamW with betas (0.9, 0.95)).
  ``dash-ec-compiled``, ``dash-ec-eager``: the same with
  ``preconditioner="eigenvalue_corrected"`` (eigh eigenbases; Adam in them with beta_G 0.9,
  beta_graft 0.95, eps_graft 1e-8: SOAP's betas and eps as the soap row has them);
  ``dash-ec-qr-compiled``: with solver "qr" (one orthogonal-iteration step a refresh, as SOAP).
- Meta's Distributed Shampoo (``distributed-shampoo``; github.com/facebookresearch/optimizers,
  not on PyPI: ``git clone`` it and ``pip install --no-deps --ignore-requires-python -e``), as
  close to the above as it goes: matrices in a group with max_preconditioner_dim 256,
  RootInvShampooPreconditionerConfig with EigenConfig (eigh inverse roots, exponent 1/4 for
  2-D), precondition_frequency 1 / 10, start_preconditioning_step 10, betas (0.9, 0.95)
  (gradient EMA, factor EMA), epsilon 1e-10, use_bias_correction True, grafting
  AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8), no momentum (this version has none),
  weight_decay 0, eager (no PT2 compile), the default single-device distributor, and its
  default use_symmetric_packing=True (factors and roots stored as upper triangles, which is
  why its state is smaller than dash_fn's full 256 x 256 matrices); biases in a
  second group with AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8) and no grafting, as
  dash_fn's vectors are AdamW.
- HeavyBall ``SOAP`` (``soap``): max_precond_dim 256 with split=True and merge_dims=True, so
  each (1024, 1024) matrix is cut into 256 x 256 blocks; precondition_frequency 1 / 10;
  betas (0.9, 0.95), shampoo_beta 0.95, eps 1e-8, weight_decay 0, precondition_1d False
  (biases are Adam); everything else HeavyBall's default, including its torch.compile of the
  step's pieces. A SOAP "refresh" is HeavyBall's eigenbasis update: one power-iteration step
  and a QR per factor (eigh only at initialisation), not an eigh.
- HeavyBall ``PSGDKron`` (``psgd-kron``): max_size_triangular 256 with split=True and
  merge_dims=True (256 x 256 triangular Q blocks); preconditioner_update_probability 1.0 /
  0.1. HeavyBall draws no random number for it: it accumulates the probability and updates
  when the sum crosses an integer, so 0.1 is every 10th step. betas (0.9, 0.999) (its
  default), weight_decay 0, the rest HeavyBall's defaults. Its "refresh" is the Q update (a
  few triangular matmuls and a solve), not a root.
- pytorch_optimizer ``ScalableShampoo`` (``scalable-shampoo``): block_size 256,
  preconditioning_compute_steps 1 / 10, start_preconditioning_step 10, betas (0.9, 0.95),
  graft_type RMSPROP (the Adam-like grafting it has), diagonal_eps 1e-10, matrix_eps 1e-6,
  use_svd False: its default coupled Schur-Newton roots (it has no eigh; the other choice is
  an SVD). It preconditions the biases with 1-D Shampoo factors too.
- ``torch.optim.Muon`` (``muon``) on the three weight matrices (all hidden here) with its
  defaults (momentum 0.95, nesterov, 5 Newton-Schulz steps, weight_decay set to 0), and
  ``torch.optim.AdamW`` (foreach, betas (0.9, 0.95)) on the biases; one row steps both.
  No refresh: the orthogonalisation runs every step, so all three time columns are the
  median step.
- ``torch.optim.AdamW`` (``adamw``): foreach=True, betas (0.9, 0.95), weight_decay 0. No
  refresh: all three columns are the median step.

A peer whose package is not installed (or fails to import) is skipped; the script says which
and why. The bench extra installs HeavyBall and pytorch_optimizer: ``pip install -e ".[bench]"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

import dash_fn
from benchmarks import machine

FREQS = (1, 10)
HEADER = (
    "| optimizer | every step refreshes (freq 1) ms | freq 10, mean ms | plain step (no refresh) ms | state B/param |"
)


# ---------------------------------------------------------------------------------------------
# the model, its gradients and the parameter copies


def make_model(d: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Parameters and fixed gradients of 3 x Linear(d, d) with bias, by name."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(3)))
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(seed + 1)
    grads = {n: torch.randn(p.shape, generator=gen) * 1e-2 for n, p in params.items()}
    return params, grads


class Instance:
    """One optimizer over its own copy of the parameters, stepping with the fixed gradients."""

    def __init__(self, build: Callable, params: dict, grads: dict, freq: int | None, args):
        self.params = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        self.grads = grads  # shared, read-only: each step gets a fresh copy in .grad
        self.opt = build(self.params, freq, args)

    def step_seconds(self) -> float:
        for n, p in self.params.items():
            p.grad = self.grads[n].clone()
        start = time.perf_counter()
        self.opt.step()
        return time.perf_counter() - start

    def state_bytes(self) -> int:
        exclude = {p.untyped_storage().data_ptr() for p in self.params.values()}
        exclude |= {p.grad.untyped_storage().data_ptr() for p in self.params.values() if p.grad is not None}
        return tensor_bytes(state_of(self.opt), exclude)


def state_of(opt) -> object:
    return [o.state for o in opt.optimizers] if isinstance(opt, Both) else opt.state


def tensor_bytes(root, exclude: set[int]) -> int:
    """Bytes of every tensor storage reachable from ``root`` (dicts, lists, TensorDicts and the
    attributes of plain objects), each storage once, those in ``exclude`` not at all."""
    seen_objects, alive, storages = set(), [], {}

    def walk(obj, depth):
        if depth > 12 or id(obj) in seen_objects:
            return
        seen_objects.add(id(obj))
        alive.append(obj)  # ids of temporaries (the lists built below) must not be reused
        if isinstance(obj, torch.Tensor):
            if obj.is_meta:
                return
            s = obj.untyped_storage()
            if s.data_ptr() not in exclude:
                storages[s.data_ptr()] = max(storages.get(s.data_ptr(), 0), s.nbytes())
            return
        if isinstance(
            obj,
            (
                str,
                bytes,
                int,
                float,
                bool,
                type(None),
                type,
                types.ModuleType,
                types.FunctionType,
                types.MethodType,
                types.BuiltinFunctionType,
            ),
        ):
            return
        if hasattr(obj, "values") and callable(obj.values) and hasattr(obj, "keys"):
            try:
                values = list(obj.values())
            except TypeError:
                values = []
            for v in values:
                walk(v, depth + 1)
            return
        if isinstance(obj, (list, tuple, set, frozenset)):
            for v in obj:
                walk(v, depth + 1)
            return
        if isinstance(obj, torch.optim.Optimizer):
            return  # only its .state is walked (by the caller)
        for v in list(getattr(obj, "__dict__", {}).values()) + [
            getattr(obj, k, None) for k in getattr(type(obj), "__slots__", ())
        ]:
            walk(v, depth + 1)  # plain objects and dataclasses (Distributed Shampoo's factor states)

    walk(root, 0)
    return sum(storages.values())


class Both:
    """torch.optim optimizers stepped as one (Muon on the matrices, AdamW on the rest)."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def step(self):
        for o in self.optimizers:
            o.step()


# ---------------------------------------------------------------------------------------------
# the rows


@dataclass
class Peer:
    key: str  # --only / --skip name
    name: str  # row label ({block}: the block size)
    module: str | None  # the import that must work, None: always there
    build: Callable  # (params by name, freq or None, args) -> optimizer with .step()
    refreshes: bool  # False: one optimizer, the same number in every time column
    note: str  # what the refresh columns mean for this row


def split_params(params: dict) -> tuple[list, list]:
    return [p for p in params.values() if p.ndim == 2], [p for p in params.values() if p.ndim != 2]


def build_dash(compile: bool, **options):
    def build(params, freq, args):
        return dash_fn.DASH(
            list(params.values()),
            lr=1e-3,
            compile=compile,
            block_size=args.block_size,
            inv_root_freq=freq,
            start_prec_step=args.start,
            refresh_schedule="periodic",  # as Distributed Shampoo: every root at once
            **{"solver": "eigh", **options},
        )

    return build


def build_distributed_shampoo(params, freq, args):
    from distributed_shampoo import (
        AdamPreconditionerConfig,
        DistributedShampoo,
        EigenConfig,
        RootInvShampooPreconditionerConfig,
    )

    matrices, vectors = split_params(params)
    adam = AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8)
    groups = [{"params": matrices}, {"params": vectors, "preconditioner_config": adam, "grafting_config": None}]
    return DistributedShampoo(
        [group for group in groups if group["params"]],  # (it refuses an empty group)
        lr=1e-3,
        betas=(0.9, 0.95),
        epsilon=1e-10,
        weight_decay=0.0,
        max_preconditioner_dim=args.block_size,
        precondition_frequency=freq,
        start_preconditioning_step=args.start,
        use_bias_correction=True,
        grafting_config=adam,
        preconditioner_config=RootInvShampooPreconditionerConfig(amortized_computation_config=EigenConfig()),
    )


def build_soap(params, freq, args):
    import heavyball

    return heavyball.SOAP(
        list(params.values()),
        lr=1e-3,
        betas=(0.9, 0.95),
        shampoo_beta=0.95,
        eps=1e-8,
        weight_decay=0.0,
        precondition_frequency=freq,
        max_precond_dim=args.block_size,
        merge_dims=True,
        split=True,
    )


def build_psgd_kron(params, freq, args):
    import heavyball

    return heavyball.PSGDKron(
        list(params.values()),
        lr=1e-3,
        weight_decay=0.0,
        preconditioner_update_probability=1.0 / freq,
        max_size_triangular=args.block_size,
        merge_dims=True,
        split=True,
    )


def build_scalable_shampoo(params, freq, args):
    from pytorch_optimizer import ScalableShampoo
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting

    return ScalableShampoo(
        list(params.values()),
        lr=1e-3,
        betas=(0.9, 0.95),
        start_preconditioning_step=args.start,
        preconditioning_compute_steps=freq,
        block_size=args.block_size,
        graft_type=LayerWiseGrafting.RMSPROP,
        diagonal_eps=1e-10,
        matrix_eps=1e-6,
        use_svd=False,
    )


def build_muon(params, freq, args):
    matrices, vectors = split_params(params)
    optimizers = [torch.optim.Muon(matrices, lr=1e-3, weight_decay=0.0)]
    if vectors:  # (torch.optim refuses an empty list)
        optimizers.append(torch.optim.AdamW(vectors, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, foreach=True))
    return Both(*optimizers)


def build_adamw(params, freq, args):
    return torch.optim.AdamW(list(params.values()), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, foreach=True)


PEERS = [
    Peer(
        "dash-compiled",
        "dash_fn.DASH compile=True (inductor)",
        None,
        build_dash(True),
        True,
        "freq 1: inv_root_freq=1 (eigh roots of every block each step); freq 10: inv_root_freq=10.",
    ),
    Peer("dash-eager", "dash_fn.DASH eager", None, build_dash(False), True, "as the compiled row."),
    Peer(
        "dash-bf16-compiled",
        "dash_fn.DASH precision=bfloat16, compile=True",
        None,
        build_dash(True, precision="bfloat16"),
        True,
        "as dash-compiled, the factor and preconditioning products with bf16 operands (native where the "
        "CPU has bf16 units, else emulated: see the machine line).",
    ),
    Peer(
        "dash-bf16-eager",
        "dash_fn.DASH precision=bfloat16, eager",
        None,
        build_dash(False, precision="bfloat16"),
        True,
        "as the compiled row.",
    ),
    Peer(
        "dash-ec-compiled",
        "dash_fn.DASH eigenvalue-corrected, compile=True",
        None,
        build_dash(True, preconditioner="eigenvalue_corrected"),
        True,
        "freq 1 / 10: the eigh eigenbases of every block; Adam runs in the bases every step (SOAP's form).",
    ),
    Peer(
        "dash-ec-eager",
        "dash_fn.DASH eigenvalue-corrected, eager",
        None,
        build_dash(False, preconditioner="eigenvalue_corrected"),
        True,
        "as the compiled row.",
    ),
    Peer(
        "dash-ec-qr-compiled",
        "dash_fn.DASH eigenvalue-corrected, qr bases, compile=True",
        None,
        build_dash(True, preconditioner="eigenvalue_corrected", solver="qr"),
        True,
        "freq 1 / 10: one orthogonal-iteration step (product + QR) per factor, as HeavyBall's SOAP refresh.",
    ),
    Peer(
        "distributed-shampoo",
        "Meta Distributed Shampoo (eigh)",
        "distributed_shampoo",
        build_distributed_shampoo,
        True,
        "precondition_frequency=1 / 10: eigh inverse roots of every block; "
        "factors and roots kept as packed upper triangles (its default).",
    ),
    Peer(
        "soap",
        "HeavyBall SOAP",
        "heavyball",
        build_soap,
        True,
        "precondition_frequency=1 / 10: the eigenbasis update (power step + QR per factor, not eigh); "
        "Adam runs in the basis every step.",
    ),
    Peer(
        "psgd-kron",
        "HeavyBall PSGDKron",
        "heavyball",
        build_psgd_kron,
        True,
        "preconditioner_update_probability=1.0 / 0.1 (deterministic accumulation: every step / every 10th): "
        "the Q update, no root.",
    ),
    Peer(
        "scalable-shampoo",
        "pytorch_optimizer ScalableShampoo (block {block})",
        "pytorch_optimizer",
        build_scalable_shampoo,
        True,
        "preconditioning_compute_steps=1 / 10: coupled Schur-Newton inverse roots of every block "
        "(its default; no eigh).",
    ),
    Peer(
        "muon",
        "torch.optim.Muon (+ AdamW for biases)",
        None,
        build_muon,
        False,
        "no refresh: Newton-Schulz every step; one number in all columns.",
    ),
    Peer("adamw", "torch AdamW (foreach)", None, build_adamw, False, "no refresh; one number in all columns."),
]


def available(peer: Peer) -> str | None:
    """None if the peer can run here, else why not."""
    if peer.module is None:
        return None
    if peer.key == "muon" and not hasattr(torch.optim, "Muon"):
        return f"torch {torch.__version__} has no torch.optim.Muon"
    try:
        __import__(peer.module)
    except ModuleNotFoundError as e:
        if e.name == peer.module:
            return f"not installed ({peer.module})"
        return f"import error: {e!r}"
    except Exception as e:  # noqa: BLE001 - any import failure skips the peer, and says so
        return f"import error: {e!r}"
    return None


def version_of(peer: Peer) -> str:
    """The version the row ran: the peer's distribution (with the git commit of a checkout)."""
    if peer.key.startswith("dash"):
        return f"dash_fn {version_or('dash-fn')}"
    if peer.module is None:
        return f"torch {torch.__version__}"
    dist = {"distributed_shampoo": "torch-shampoo"}.get(peer.module, peer.module)
    text = f"{dist} {version_or(dist)}"
    if peer.module == "distributed_shampoo":
        commit = git_commit(
            os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["distributed_shampoo"].__file__)))
        )
        text += f", git {commit}" if commit else ""
    return text


def version_or(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def git_commit(path: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", path, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# ---------------------------------------------------------------------------------------------
# timing


class Row:
    """A peer's optimizers (frequency 1 and 10, or one without a refresh) and its timings."""

    def __init__(self, peer: Peer, params: dict, grads: dict, args):
        self.peer = peer
        if peer.refreshes:
            self.every = Instance(peer.build, params, grads, 1, args)
            self.periodic = Instance(peer.build, params, grads, 10, args)
        else:
            self.every = None
            self.periodic = Instance(peer.build, params, grads, None, args)
        self.freq1, self.mean10, self.plain = [], [], []
        self.n_params = sum(p.numel() for p in params.values())

    def warm_up(self, start: int) -> None:
        """Past the start of preconditioning, then two whole periods (compiles, first roots)."""
        if self.every is not None:
            for _ in range(start + 3):
                self.every.step_seconds()
        for _ in range(start + 2 * FREQS[1] + 1):
            self.periodic.step_seconds()

    def repetition(self) -> None:
        times = [self.periodic.step_seconds() for _ in range(FREQS[1])]
        self.mean10.append(sum(times) / len(times))
        self.plain.append(statistics.median(times))
        self.freq1.append(self.every.step_seconds() if self.every is not None else statistics.median(times))

    def cells(self) -> list[str]:
        ms = [1e3 * statistics.median(x) for x in (self.freq1, self.mean10, self.plain)]
        if not self.peer.refreshes:
            ms = [ms[2]] * 3  # no refresh: the median step in every column
        nbytes = self.periodic.state_bytes()
        return [f"{m:.1f}" for m in ms] + [f"{nbytes / self.n_params:.2f}"]


def machine_line(load) -> str:
    """The CPU, its widest vector extension (bf16 units or not), torch and threads, and the load."""
    return f"{machine.machine_line()}, load average {load}"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--d-model", type=int, default=1024, help="the model is 3 x Linear(d_model, d_model) with bias")
    parser.add_argument(
        "--block-size", type=int, default=256, help="preconditioner block size (max_preconditioner_dim, ...)"
    )
    parser.add_argument(
        "--start",
        type=int,
        default=10,
        help="the step preconditioning starts at (>= 10: Distributed Shampoo needs start >= frequency)",
    )
    parser.add_argument("--reps", type=int, default=7, help="round-robin repetitions (medians reported)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (when not given: torch's choice)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (d_model 64, block 32, 2 reps): a smoke run")
    keys = [p.key for p in PEERS]
    parser.add_argument("--only", nargs="+", choices=keys, metavar="ROW", help=f"run only these rows, of {keys}")
    parser.add_argument("--skip", nargs="+", choices=keys, default=[], metavar="ROW", help="leave these rows out")
    parser.add_argument(
        "--retain-freed-memory",
        action="store_true",
        help="call dash_fn.utils.retain_freed_cpu_memory() first: the process (every row alike) reuses freed "
        "memory instead of faulting it in again",
    )
    args = parser.parse_args(argv)
    if args.retain_freed_memory and not dash_fn.utils.retain_freed_cpu_memory():
        parser.error("--retain-freed-memory: the C library is not glibc")
    if args.quick:
        args.d_model, args.block_size, args.reps = 64, 32, 2
    if args.start < FREQS[1]:
        parser.error(f"--start must be >= {FREQS[1]} (Distributed Shampoo requires start >= precondition_frequency)")

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_start = loadavg()
    print(f"machine: {machine_line(load_start)} (at start)")
    print(
        f"model: 3 x Linear({args.d_model}, {args.d_model}) with bias, block {args.block_size}, "
        f"preconditioning from step {args.start}, {args.reps} round-robin reps, medians"
    )
    allocator = (
        "dash_fn.utils.retain_freed_cpu_memory() (freed memory kept for reuse)"
        if args.retain_freed_memory
        else "glibc defaults (freed memory may go back to the OS)"
    )
    print(f"allocator: {allocator}")

    peers = [dataclasses.replace(p, name=p.name.format(block=args.block_size)) for p in PEERS]
    chosen = [p for p in peers if (args.only is None or p.key in args.only) and p.key not in args.skip]
    skipped = [(p, "not asked for (--only / --skip)") for p in peers if p not in chosen]
    runnable = []
    for peer in chosen:
        why = available(peer)
        if why is None:
            runnable.append(peer)
        else:
            skipped.append((peer, why))

    params, grads = make_model(args.d_model)
    rows = []
    for peer in runnable:
        try:
            row = Row(peer, params, grads, args)
            row.warm_up(args.start)
        except Exception as e:  # noqa: BLE001 - a peer that fails to build or step is skipped, and says so
            skipped.append((peer, f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            continue
        rows.append(row)
        print(f"  warmed up: {peer.name} ({version_of(peer)})", flush=True)
    for _ in range(args.reps):
        for row in rows:  # round-robin: every row takes its share of each stretch of load
            row.repetition()

    print()
    print(HEADER)
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row.peer.name} | " + " | ".join(row.cells()) + " |")
    print()
    for row in rows:
        print(f"- {row.peer.name} ({version_of(row.peer)}): {row.peer.note}")
    print("- plain step: the median of the 10 steps of a freq-10 period; freq 10, mean: their sum / 10.")
    for peer, why in skipped:
        print(f"skipped: {peer.name}: {why}")
    load_end = loadavg()
    print(f"machine: {machine_line(load_end)} (at end; {load_start} at start)")
    other = float(load_start.split()[0]) if load_start != "n/a" else 0.0  # the end includes this run's own threads
    if other > (os.cpu_count() or 1):
        print(
            f"note: the 1-minute load average at start ({other:.2f}) exceeded the {os.cpu_count()} cores: "
            "these figures were measured under load"
        )


if __name__ == "__main__":
    main()
