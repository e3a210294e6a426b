"""Soak test of the non-finite guard: thousands of compiled train steps with injected faults.

    python -m benchmarks.soak                          # 10,000 steps, Inductor, beside a fault-free run
    python -m benchmarks.soak --steps 300 --every 30 --backend aot_eager --no-progress

A byte-level Llama (examples/llama.py; d_model 64, 1 layer, context 32, batch 8) trains on the
running Python's standard library sources (examples/train_lm.py's ``stdlib_corpus``) with one
compiled train step: loss and gradients by ``torch.func.grad_and_value`` of a functional
model, the faults applied to the gradients, then ``dash_fn.step``, all of it in one
``torch.compile(fullgraph=True)`` function, with the refresh flag from the host's step count
(two graphs, a plain step and a refresh step). The faults are data, not Python branches: every
step passes the same tensors (a gradient scale, one poison value per parameter added to one of
its entries, the lr as a 0-d tensor), so after the first window nothing recompiles.

Schedule (``--seed``): the first ``--every`` steps are the warm-up (no faults); after that each
window of ``--every`` steps holds one fault at a random step in it, the kinds cycling through

* ``nan``: a NaN in one entry of one parameter's gradient (parameter and entry drawn);
* ``inf``: the same with +Inf;
* ``zero``: every gradient all zero;
* ``scale``: every gradient times 1e30 (finite, but G G^T overflows float32);
* ``lr_spike``: the learning rate times 1000 for that step.

The guard must skip exactly the nan, inf and scale steps (``state["skipped"]`` counts them,
and the parameters and the whole state keep their bits on those steps, but for the roots of a
skipped refresh step, refreshed from the unchanged factors); zero gradients and lr
spikes are ordinary steps. Checked and reported: parameters finite after every step (a flag
per step, kept on the device: no host sync), skips at exactly the faulted steps, bitwise
unchanged state on skipped steps, root fallbacks (``state["factors", k, "fallbacks"]``),
compiled graphs after warm-up (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``
and a compile-start callback: must not change), resident memory (VmRSS) at step 1,000 and at
the end, and the final training and validation loss against a fault-free run of the same
steps on the same batches (``--compare``, the default: the two runs step in lockstep in this
process and share the compiled graph). Prints a markdown report (``--json``: the result with
every step's train loss, too); exits 1 if an invariant fails. ``--kinds`` picks the fault kinds
(e.g. all but ``lr_spike``, to see what the skipped faults alone cost).

One torch thread by default (``--threads``): this model's kernels are tiny, and on a shared
2-core machine two OpenMP threads made the compiled step 10-100x slower (barriers waiting for
a descheduled thread), while one thread runs it in about 3 ms.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import sys
import time

import torch
from torch._dynamo.callback import callback_handler
from torch._dynamo.utils import counters

import dash_fn
from benchmarks.machine import machine_line
from examples.compiled_step import lr_at
from examples.llama import Llama, LlamaConfig, next_byte_loss
from examples.train_lm import stdlib_corpus

KINDS = ("nan", "inf", "zero", "scale", "lr_spike")
SKIPPING = ("nan", "inf", "scale")
SCALE = 1e30
LR_SPIKE = 1000.0


def fault_schedule(steps: int, every: int, seed: int, n_params: int, kinds=KINDS) -> dict[int, dict]:
    """``{step: fault}``: one fault per window of ``every`` steps after the first, the kinds in
    turn; a nan/inf fault names the parameter index and a draw for the entry it poisons."""
    rng = random.Random(seed)
    faults, j = {}, 1
    while True:
        t = j * every + rng.randint(1, every)
        if t > steps:
            break
        kind = kinds[(j - 1) % len(kinds)]
        faults[t] = {"kind": kind, "param": rng.randrange(n_params), "entry": rng.random()}
        j += 1
    return faults


def make_train_step(model: Llama, names: list[str], backend: str):
    """Compiled ``(params, state, tokens, lr, scale, poison, where) -> (params, loss, finite)``.

    Gradients are multiplied by ``scale`` (0-d) and entry ``where[i]`` of parameter i's
    flattened gradient gets ``poison[i]`` added (0.0 adds nothing; NaN or Inf poisons it);
    ``finite`` (0-d bool) tells whether every new parameter is finite."""

    def train_step(params, state, tokens, lr, scale, poison, where, refresh):
        grads, loss = torch.func.grad_and_value(lambda p: next_byte_loss(model, p, tokens))(params)
        faulty = {}
        for i, name in enumerate(names):
            g = grads[name] * scale
            faulty[name] = g.reshape(-1).index_add(0, where[i : i + 1], poison[i : i + 1]).view_as(g)
        params, state = dash_fn.step(params, faulty, state, lr=lr, refresh=refresh)
        finite = torch.stack([torch.isfinite(p).all() for p in params.values()]).all()
        return params, loss, finite

    return torch.compile(train_step, fullgraph=True, backend=backend)


def rss_mib() -> float:
    """Resident set size of this process (VmRSS), MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bits(tensors) -> list[torch.Tensor]:
    """Copies to compare bit for bit (NaN == NaN, -0.0 != 0.0)."""
    out = []
    for x in tensors:
        x = x.detach().clone()
        out.append(x.view(torch.int32) if x.dtype == torch.float32 else x)
    return out


def same_bits(before: list[torch.Tensor], after) -> bool:
    return all(torch.equal(b, a) for b, a in zip(before, bits(after)))


def state_tensors(state, roots: bool = True) -> list[torch.Tensor]:
    """Every tensor of the state but the skip counter (which a skipped step increments), and
    without the roots when ``roots`` is false (a skipped refresh step refreshes them)."""
    items = sorted(state.items(include_nested=True, leaves_only=True), key=lambda kv: str(kv[0]))
    return [v for k, v in items if k != "skipped" and (roots or k[-1] != "Fbar") and isinstance(v, torch.Tensor)]


def fallbacks(state) -> int:
    plan = state["plan"]
    return sum(int(state["factors", str(k), "fallbacks"].sum()) for k in range(len(plan.factors)))


class Run:
    """One training run: its params, state and per-step histories (on the device)."""

    def __init__(self, name: str, params: dict, config: dash_fn.DashConfig, steps: int):
        self.name = name
        self.params = {k: v.clone() for k, v in params.items()}
        self.state = dash_fn.init(self.params, config)
        self.loss = torch.zeros(steps + 1)
        self.finite = torch.ones(steps + 1, dtype=torch.bool)
        self.skipped = torch.zeros(steps + 1, dtype=torch.int64)
        self.fallbacks = torch.zeros(steps + 1, dtype=torch.int64)
        self.counters = [self.state["factors", str(k), "fallbacks"] for k in range(len(self.state["plan"].factors))]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10_000, help="training steps")
    parser.add_argument(
        "--every",
        type=int,
        default=100,
        help="one fault per window of this many steps (the first window is the warm-up)",
    )
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="fault kinds, injected in turn")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (one is fastest for this model on a shared CPU; restored on return)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule, the batches and the model")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor or aot_eager)")
    parser.add_argument(
        "--compare", action=argparse.BooleanOptionalAction, default=True, help="also run a fault-free copy in lockstep"
    )
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm progress bar")
    parser.add_argument(
        "--rss-at", type=int, default=1000, help="step of the first RSS reading (the last is at the end)"
    )
    parser.add_argument(
        "--lr", type=float, default=3e-3, help="peak learning rate (warm-up 100 steps, cosine decay to 10%%)"
    )
    parser.add_argument("--d-model", type=int, default=64, help="model width")
    parser.add_argument("--layers", type=int, default=1, help="transformer blocks")
    parser.add_argument("--context", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=8, help="sequences per batch")
    parser.add_argument("--block-size", type=int, default=64, help="DASH block size")
    parser.add_argument("--inv-root-freq", type=int, default=10, help="steps between root refreshes")
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000, help="bytes of standard library source to read")
    parser.add_argument(
        "--json", default=None, help="also write the result (with every step's train loss) to this JSON file"
    )
    parser.add_argument("--val-batches", type=int, default=32, help="validation batches for the final loss")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.every < 1:
        parser.error("--steps and --every must be >= 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run_soak(args, argv)
    finally:
        torch.set_num_threads(threads)


def run_soak(args, argv) -> dict:
    wall_start = time.perf_counter()
    load_before = os.getloadavg()

    torch.manual_seed(args.seed)
    model = Llama(
        LlamaConfig(
            d_model=args.d_model,
            n_layers=args.layers,
            n_heads=4,
            mlp_hidden=(8 * args.d_model) // 3,
            context=args.context,
        )
    )
    init_params = {k: v.detach().clone() for k, v in model.named_parameters()}
    names = list(init_params)
    config = dash_fn.DashConfig(block_size=args.block_size, inv_root_freq=args.inv_root_freq)
    runs = [Run("faults", init_params, config, args.steps)]
    if args.compare:
        runs.append(Run("fault-free", init_params, config, args.steps))
    train_step = make_train_step(model, names, args.backend)

    train, val = stdlib_corpus(args.corpus_bytes)
    window = torch.arange(args.context + 1)
    gen = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(train) - args.context - 1, (args.steps + 1, args.batch), generator=gen)

    faults = fault_schedule(args.steps, args.every, args.seed, len(names), tuple(args.kinds))
    numels = [init_params[n].numel() for n in names]
    one = torch.ones(())
    no_poison = torch.zeros(len(names))
    no_where = torch.zeros(len(names), dtype=torch.int64)
    warmup = min(args.every, args.steps)
    rss_at = min(args.rss_at, args.steps)

    compiles_after_warmup = []
    graphs_at_warmup = None

    def on_compile(event):
        if graphs_at_warmup is not None:
            compiles_after_warmup.append(str(getattr(event, "compile_id", event)))

    callback_handler.register_start_callback(on_compile)
    counters.clear()
    rss = {}
    bitwise_ok, bitwise_checked = True, 0
    bad_steps = []
    progress = None
    if args.progress:
        from tqdm import tqdm

        progress = tqdm(total=args.steps, desc="soak", unit="step", mininterval=2.0)
    step_time_start = None
    try:
        for t in range(1, args.steps + 1):
            tokens = train[starts[t][:, None] + window]
            base_lr = lr_at(t, args.steps, args.lr, warmup=100)
            fault = faults.get(t)
            refresh = dash_fn.is_refresh_step(config, t)
            for run in runs:
                before = None
                scale, poison, where, lr = one, no_poison, no_where, torch.tensor(base_lr)
                if fault is not None and run.name == "faults":
                    kind = fault["kind"]
                    if kind in ("nan", "inf"):
                        poison, where = no_poison.clone(), no_where.clone()
                        i = fault["param"]
                        poison[i] = math.nan if kind == "nan" else math.inf
                        where[i] = int(fault["entry"] * numels[i])
                    elif kind == "zero":
                        scale = torch.zeros(())
                    elif kind == "scale":
                        scale = torch.tensor(SCALE)
                    else:
                        lr = torch.tensor(base_lr * LR_SPIKE)
                    before = (
                        bits(list(run.params.values()) + state_tensors(run.state, not refresh))
                        if kind in SKIPPING
                        else None
                    )
                run.params, loss, finite = train_step(run.params, run.state, tokens, lr, scale, poison, where, refresh)
                run.loss[t] = loss.detach()
                run.finite[t] = finite
                run.skipped[t] = run.state["skipped"]
                run.fallbacks[t] = sum(c.sum() for c in run.counters)
                if before is not None:
                    bitwise_checked += 1
                    if not same_bits(before, list(run.params.values()) + state_tensors(run.state, not refresh)):
                        bitwise_ok = False
                        bad_steps.append(t)
            if t == warmup:
                graphs_at_warmup = counters["stats"]["unique_graphs"]
                step_time_start = time.perf_counter()
            if t == rss_at:
                gc.collect()
                rss["first"] = rss_mib()
            if progress is not None:
                progress.update(1)
                if t % 500 == 0:
                    progress.set_postfix(
                        loss=f"{float(runs[0].loss[t - 99 : t + 1].mean()):.3f}", rss=f"{rss_mib():.0f}M"
                    )
    finally:
        callback_handler.remove_start_callback(on_compile)
        if progress is not None:
            progress.close()
    gc.collect()
    rss["end"] = rss_mib()
    graphs_end = counters["stats"]["unique_graphs"]
    steady_s = time.perf_counter() - step_time_start if step_time_start is not None else float("nan")

    # Validation loss: fixed batches of the held-out files.
    vgen = torch.Generator().manual_seed(args.seed + 1)
    vstarts = torch.randint(0, len(val) - args.context - 1, (args.val_batches, args.batch), generator=vgen)
    for run in runs:
        with torch.no_grad():
            run.val = (
                sum(float(next_byte_loss(model, run.params, val[s[:, None] + window])) for s in vstarts)
                / args.val_batches
            )
        run.train_final = float(run.loss[max(1, args.steps - 99) :].mean())

    soak = runs[0]
    kinds = {k: sum(1 for f in faults.values() if f["kind"] == k) for k in args.kinds}
    expected_skips = sorted(t for t, f in faults.items() if f["kind"] in SKIPPING)
    skipped_steps = ((soak.skipped[1:] - soak.skipped[:-1]).nonzero().flatten() + 1).tolist()  # steps that counted one
    skipped = int(soak.state["skipped"])
    finite_all = bool(soak.finite[1:].all())
    first_nonfinite = None if finite_all else int((~soak.finite[1:]).nonzero()[0]) + 1
    recompiles = graphs_end - (graphs_at_warmup or 0)
    result = {
        "steps": args.steps,
        "backend": args.backend,
        "faults": kinds,
        "fault_steps": {t: f["kind"] for t, f in sorted(faults.items())},
        "expected_skips": len(expected_skips),
        "skipped": skipped,
        "skips_at_fault_steps": skipped_steps == expected_skips,
        "unexpected_skip_steps": sorted(set(skipped_steps) - set(expected_skips)),
        "missed_skip_steps": sorted(set(expected_skips) - set(skipped_steps)),
        "bitwise_unchanged_on_skips": bitwise_ok,
        "bitwise_checked": bitwise_checked,
        "bitwise_failed_steps": bad_steps,
        "params_finite": finite_all,
        "first_nonfinite_step": first_nonfinite,
        "fallbacks": fallbacks(soak.state),
        "fallback_steps": ((soak.fallbacks[1:] - soak.fallbacks[:-1]).nonzero().flatten() + 1).tolist(),
        "graphs_at_warmup": graphs_at_warmup,
        "graphs_end": graphs_end,
        "recompiles_after_warmup": recompiles,
        "compile_events_after_warmup": len(compiles_after_warmup),
        "graph_breaks": sum(counters["graph_break"].values()),
        "rss_first_mib": rss["first"],
        "rss_end_mib": rss["end"],
        "rss_growth_pct": 100 * (rss["end"] - rss["first"]) / rss["first"],
        "rss_at": rss_at,
        "train_loss": soak.train_final,
        "val_loss": soak.val,
        "wall_s": time.perf_counter() - wall_start,
        "load_before": load_before[0],
        "load_after": os.getloadavg()[0],
        "steady_ms_per_step": 1e3 * steady_s / max(1, args.steps - warmup),
        "train_losses": soak.loss[1:].tolist(),  # per step, for plots and diagnosis
    }
    if args.compare:
        clean = runs[1]
        result.update(
            clean_train_loss=clean.train_final,
            clean_val_loss=clean.val,
            clean_fallbacks=fallbacks(clean.state),
            clean_skipped=int(clean.state["skipped"]),
            clean_params_finite=bool(clean.finite[1:].all()),
            clean_train_losses=clean.loss[1:].tolist(),
            loss_jumps=loss_jumps(faults, soak.loss, clean.loss, args.steps, warmup),
        )
    failures = []
    if not finite_all:
        failures.append(f"non-finite parameters (first at step {first_nonfinite})")
    if skipped != len(expected_skips) or not result["skips_at_fault_steps"]:
        failures.append(
            f"skipped {skipped} != expected {len(expected_skips)} (unexpected at {result['unexpected_skip_steps']}, "
            f"missed at {result['missed_skip_steps']})"
        )
    if not bitwise_ok:
        failures.append(f"state changed on skipped steps {bad_steps}")
    if recompiles or compiles_after_warmup:
        failures.append(f"{recompiles} new graphs and {len(compiles_after_warmup)} compiles after warm-up")
    if args.compare and (result["clean_skipped"] or not result["clean_params_finite"]):
        failures.append("the fault-free run skipped a step or has non-finite parameters")
    result["failures"] = failures
    result["ok"] = not failures
    print(report(args, result, argv))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(result, f)
    return result


def loss_jumps(faults: dict, loss: torch.Tensor, clean: torch.Tensor, steps: int, warmup: int) -> dict[str, tuple]:
    """Per fault kind, how much the faulted step moved the train-loss gap to the fault-free run:
    ``gap(t + 1) - gap(t)``, ``gap = loss - clean loss`` on the same batch (``loss[t]`` is taken
    before step t's update); ``(count, median, mean, largest |.|)``. The row "none" is every
    step after the warm-up without a fault: the noise the other rows stand against."""
    gap = loss - clean
    jumps = {}
    for t in range(warmup + 1, steps):
        kind = faults[t]["kind"] if t in faults else "none"
        jumps.setdefault(kind, []).append(float(gap[t + 1] - gap[t]))
    out = {}
    for k, v in jumps.items():
        x = torch.tensor(v, dtype=torch.float64)
        out[k] = (len(v), float(x.median()), float(x.mean()), float(x[x.abs().argmax()]))
    return out


def report(args, r: dict, argv) -> str:
    cmd = " ".join(["python -m benchmarks.soak", *(sys.argv[1:] if argv is None else argv)])
    n_faults = sum(r["faults"].values())
    finite = "yes" if r["params_finite"] else f"NO (first at step {r['first_nonfinite_step']})"
    lines = [
        f"`{cmd}`",
        "",
        f"Machine: {machine_line()}; load average {r['load_before']:.2f} before, {r['load_after']:.2f} after.",
        (
            f"Model: byte-level Llama, d_model {args.d_model}, {args.layers} layer(s), context {args.context}, "
            f"batch {args.batch}; "
            f"DASH block {args.block_size}, inv_root_freq {args.inv_root_freq}, lr {args.lr:g} (warm-up, cosine); "
            f"backend {r['backend']}; "
            f"{r['steps']} steps, warm-up {min(args.every, r['steps'])} steps, "
            f"then one fault per {args.every} steps (seed {args.seed})."
        ),
        "",
        "| check | result |",
        "|---|---|",
        f"| faults injected | {n_faults}: " + ", ".join(f"{k} {v}" for k, v in r["faults"].items()) + " |",
        (
            f"| steps skipped (state['skipped']) | {r['skipped']} (expected {r['expected_skips']}: the nan, "
            "inf and scale faults); "
            f"at exactly the faulted steps: {'yes' if r['skips_at_fault_steps'] else 'NO'} |"
        ),
        "| params and state bitwise unchanged on skipped steps | "
        f"{'yes' if r['bitwise_unchanged_on_skips'] else 'NO'} ({r['bitwise_checked']} checked) |",
        f"| parameters finite after every step | {finite} |",
        f"| root fallbacks (sum over factor stacks) | {r['fallbacks']}"
        + (
            f" at {len(r['fallback_steps'])} refreshes, steps {r['fallback_steps'][0]} to {r['fallback_steps'][-1]}"
            if r["fallback_steps"]
            else ""
        )
        + (f" (fault-free run: {r['clean_fallbacks']})" if "clean_fallbacks" in r else "")
        + " |",
        (
            f"| recompiles after warm-up | {r['recompiles_after_warmup']} (unique graphs {r['graphs_at_warmup']} -> "
            f"{r['graphs_end']}; "
            f"{r['compile_events_after_warmup']} compile events; {r['graph_breaks']} graph breaks) |"
        ),
        f"| RSS at step {r['rss_at']:,} / end | {r['rss_first_mib']:.1f} MiB / {r['rss_end_mib']:.1f} MiB: "
        f"{r['rss_growth_pct']:+.2f}% |",
        f"| final train loss (mean of last 100 steps) | {r['train_loss']:.4f}"
        + (f" (fault-free {r['clean_train_loss']:.4f})" if "clean_train_loss" in r else "")
        + " |",
        f"| final validation loss ({args.val_batches} batches) | {r['val_loss']:.4f}"
        + (f" (fault-free {r['clean_val_loss']:.4f})" if "clean_val_loss" in r else "")
        + " |",
        f"| wall time | {r['wall_s']:.0f} s ({r['steady_ms_per_step']:.1f} ms per step after warm-up, "
        f"{'both runs' if 'clean_val_loss' in r else 'one run'}) |",
        "",
    ]
    if "loss_jumps" in r:
        lines += [
            (
                "Train-loss gap to the fault-free run (same batches) that each faulted step opened: "
                "gap(t + 1) - gap(t) over the faults of a kind (none: the steps without a fault, for scale)."
            ),
            "",
            "| fault | steps | median | mean | largest |",
            "|---|---|---|---|---|",
            *(f"| {k} | {n} | {med:+.4f} | {m:+.4f} | {x:+.4f} |" for k, (n, med, m, x) in r["loss_jumps"].items()),
            "",
        ]
    lines += [
        "All invariants hold." if r["ok"] else "FAILED: " + "; ".join(r["failures"]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
