"""Optimizer state and checkpoint bytes per parameter: dash_fn's storage options beside the peers.

    python -m benchmarks.memory_table [--models peers main-job embedding] [--no-peers] [--steps 30] [--rounds 5]

Three models: peers.py's 3 x Linear(1024, 1024) with bias ("peers"), the main job's byte-level
Llama (examples/train_lm.py's defaults, "main-job") and nn.Embedding(32000, 64) ("embedding").
Each optimizer takes 12 steps with fixed gradients (every peer's state exists by then, roots
included: preconditioning starts at step 10 as in peers.py), then:

- "state B/param": bytes of the tensor storages its state holds (peers.py's count: each storage
  once, parameters and gradients excluded), over the model's parameter count;
- "checkpoint B/param": the length of ``torch.save(optimizer.state_dict())``, over the same;
- "step ms": the median of ``--steps`` further eager steps (one ``optimizer.step()`` each, the
  same gradient; at a refresh every 10 steps the median is a plain step), taken in ``--rounds``
  rounds that visit every optimizer in turn, and that against AdamW's; for the embedding also
  the two batched products its step cannot avoid, alone.

dash_fn rows use ``dash_fn.DASH`` with eigh roots every 10 steps at the model's block size (256;
the main job's 128), one row per storage option, their combinations, and thin blocks on and off
(``thin_ratio=4`` and ``inf``), alone and with the 16-bit storage. Peers as in benchmarks/peers.py (Meta's
Distributed Shampoo, HeavyBall SOAP and PSGDKron, torch.optim.Muon with AdamW for the vectors,
torch AdamW), each where it is installed (``pip install -e ".[bench]"``; Distributed Shampoo
from a clone of facebookresearch/optimizers), or skipped with the reason.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import time
from types import SimpleNamespace

import torch

import dash_fn
from benchmarks import peers
from benchmarks.machine import machine_line

BF16 = "bfloat16"
DASH_OPTIONS = {
    "dash_fn default": {},
    "dash_fn thin_ratio=inf (every block two-sided)": {"thin_ratio": math.inf},
    "dash_fn thin_ratio=4 (thin blocks)": {"thin_ratio": 4.0},
    "dash_fn preconditioner=eigenvalue_corrected": {"preconditioner": "eigenvalue_corrected"},
    "dash_fn root_dtype=bf16": {"root_dtype": BF16},
    "dash_fn grad_ema_dtype=bf16": {"grad_ema_dtype": BF16},
    "dash_fn graft_dtype=bf16": {"graft_dtype": BF16},
    "dash_fn factor_dtype=bf16": {"factor_dtype": BF16},
    "dash_fn grad_ema + graft bf16": {"grad_ema_dtype": BF16, "graft_dtype": BF16},
    "dash_fn root + grad_ema bf16": {"root_dtype": BF16, "grad_ema_dtype": BF16},
    "dash_fn root + grad_ema + graft bf16": {"root_dtype": BF16, "grad_ema_dtype": BF16, "graft_dtype": BF16},
    "dash_fn thin_ratio=4 + root + grad_ema + graft bf16": {
        "thin_ratio": 4.0,
        "root_dtype": BF16,
        "grad_ema_dtype": BF16,
        "graft_dtype": BF16,
    },
    "dash_fn all four bf16": {"root_dtype": BF16, "grad_ema_dtype": BF16, "graft_dtype": BF16, "factor_dtype": BF16},
}
PEER_KEYS = ("distributed-shampoo", "soap", "psgd-kron", "muon", "adamw")
START = 10  # preconditioning starts here for everyone (Distributed Shampoo needs start >= frequency)
FREQ = 10


def model_params(name: str) -> tuple[dict[str, torch.Tensor], int]:
    """(parameters by name, block size) of one of the three models."""
    torch.manual_seed(0)
    if name == "peers":
        return peers.make_model(1024)[0], 256
    if name == "embedding":
        return {"weight": torch.randn(32000, 64) * 0.02}, 256
    from examples.llama import Llama, LlamaConfig

    model = Llama(LlamaConfig(d_model=128, n_layers=2, n_heads=4, mlp_hidden=(8 * 128) // 3, context=64))
    return {k: v.detach().clone() for k, v in model.named_parameters()}, 128


def build_dash(options: dict):
    def build(params, freq, args):
        return dash_fn.DASH(
            list(params.values()),
            lr=1e-3,
            block_size=args.block_size,
            solver="eigh",
            inv_root_freq=freq,
            start_prec_step=args.start,
            **options,
        )

    return build


def checkpoint_bytes(opt) -> int:
    buffer = io.BytesIO()
    dicts = [o.state_dict() for o in opt.optimizers] if isinstance(opt, peers.Both) else opt.state_dict()
    torch.save(dicts, buffer)
    return buffer.tell()


def prepared(build, params: dict, block_size: int):
    """An optimizer on its own copy of ``params``, past START + 2 steps (every state exists)."""
    gen = torch.Generator().manual_seed(1)
    grads = {n: torch.randn(p.shape, generator=gen) * 1e-2 for n, p in params.items()}
    instance = peers.Instance(build, params, grads, FREQ, SimpleNamespace(block_size=block_size, start=START))
    for _ in range(START + 2):
        instance.step_seconds()
    return instance


def rows_for(model: str, with_peers: bool, timed_steps: int, rounds: int):
    """Bytes per parameter of every optimizer, and its median step over ``rounds`` rounds that
    each time every optimizer for ``timed_steps // rounds`` steps in turn (side by side: a
    slow moment of the machine spreads over all rows instead of landing on one)."""
    params, block_size = model_params(model)
    n = sum(p.numel() for p in params.values())
    builds = {label: build_dash(options) for label, options in DASH_OPTIONS.items()}
    found: dict[str, dict] = {}
    for peer in peers.PEERS if with_peers else []:
        if peer.key in PEER_KEYS:
            why = peers.available(peer)
            name = peer.name.format(block=block_size)
            if why is None:
                builds[name] = peer.build
            else:
                found[name] = {"skipped": why}
    instances = {label: prepared(build, params, block_size) for label, build in builds.items()}
    for label, instance in instances.items():
        found[label] = {"state": instance.state_bytes() / n, "checkpoint": checkpoint_bytes(instance.opt) / n}
    times: dict[str, list[float]] = {label: [] for label in instances}
    for _ in range(rounds if timed_steps else 0):
        for label, instance in instances.items():
            times[label] += [instance.step_seconds() for _ in range(max(1, timed_steps // rounds))]
    for label, t in times.items():
        if t:
            found[label]["ms"] = 1e3 * statistics.median(t)
    order = list(builds) + [k for k in found if k not in builds]
    return params, block_size, {label: found[label] for label in order}


def thin_products_ms(params: dict, block_size: int, timed_steps: int) -> float:
    """Median ms of the two batched products a thin embedding's step cannot avoid: the factor
    product G^T G of its (rows/B, B, c) blocks and the preconditioned G R (R: c x c)."""
    (weight,) = params.values()
    G = torch.randn_like(weight).reshape(-1, block_size, weight.shape[1])
    R = torch.randn(G.shape[0], G.shape[2], G.shape[2])
    times = []
    for _ in range(timed_steps + 3):
        started = time.perf_counter()
        torch.bmm(G.mT, G)
        torch.bmm(G, R)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times[3:])


def table(model: str, params: dict, found: dict) -> list[str]:
    n = sum(p.numel() for p in params.values())
    timed = any("ms" in row for row in found.values())
    adamw = found.get("torch AdamW (foreach)", {}).get("ms")
    head = "| optimizer | state B/param | checkpoint B/param |" + (" step ms | vs AdamW |" if timed else "")
    lines = [f"**{model}** ({n:,} parameters)", "", head, "|---|---|---|" + ("---|---|" if timed else "")]
    for label, row in found.items():
        if "skipped" in row:
            lines.append(f"| {label} | skipped: {row['skipped']} | |" + (" | |" if timed else ""))
            continue
        cells = f"| {label} | {row['state']:.2f} | {row['checkpoint']:.2f} |"
        if timed:
            ratio = f"{row['ms'] / adamw:.2f}x" if adamw else "-"
            cells += f" {row['ms']:.1f} | {ratio} |"
        lines.append(cells)
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=["peers", "main-job", "embedding"],
        default=["peers", "main-job", "embedding"],
        help="the models to measure",
    )
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True, help="the peers' rows too")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per optimizer (0: none)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the timed steps are spread over")
    args = parser.parse_args(argv)
    print(machine_line(), "\n")
    started = time.perf_counter()
    for model in args.models:
        params, block_size, found = rows_for(model, args.peers, args.steps, args.rounds)
        print("\n".join(table(model, params, found)), flush=True)
        if model == "embedding" and args.steps:
            floor = thin_products_ms(params, block_size, args.steps)
            print(f"its thin blocks' two batched products alone (G^T G, G R): {floor:.1f} ms\n", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
