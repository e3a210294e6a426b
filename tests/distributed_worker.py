"""What each spawned rank of tests/test_distributed.py runs (gloo on CPU).

Every scenario runs the same steps twice on every rank: once as one process (no process
group) and once as this rank of W; the results are written to ``<out>/rank<k>.pt`` for the
test to compare. Gradients come from seeded generators, so all ranks see the same ones, as
after DDP's all-reduce.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import dash_fn
from conftest import mixed_params, random_grads, tensors
from dash_fn.state import CONSTANTS

STEPS = 10

# name -> (params, DashConfig): mixed shapes with ragged strips, vectors under AdamW and
# under one-sided Shampoo, and a one-block model where ranks 1.. own nothing at all.
SCENARIOS = {
    "eigh": (lambda: mixed_params(), dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=3)),
    "ndb": (lambda: mixed_params(), dash_fn.DashConfig(block_size=24, solver="ndb", inv_root_freq=2, mu=0.9)),
    "one_dim_shampoo": (
        lambda: mixed_params(),
        dash_fn.DashConfig(block_size=16, solver="eigh", one_dim="shampoo", weight_decay=0.1),
    ),
    "owns_nothing": (
        lambda: mixed_params(shapes={"w": (12, 10), "b": (10,)}),
        dash_fn.DashConfig(block_size=64, solver="cn"),
    ),
    "vectors_only": (lambda: mixed_params(shapes={"b": (10,), "c": (3,)}), dash_fn.DashConfig(block_size=8)),
    "uniform": (
        lambda: mixed_params(shapes={f"w{i}": (48, 48) for i in range(4)}),
        dash_fn.DashConfig(block_size=16, solver="eigh"),
    ),
    "moe": (
        lambda: mixed_params(shapes={"experts": (5, 20, 12), "b": (10,)}),
        dash_fn.DashConfig(block_size=8, solver="eigh", mu=0.5),
    ),
    "staggered": (
        lambda: mixed_params(),
        dash_fn.DashConfig(
            block_size=8, solver="eigh", inv_root_freq=3, start_prec_step=2, mu=0.5, refresh_schedule="staggered"
        ),
    ),
}
SCENARIOS["storage"] = (  # every kind kept in 16 bits (dash_fn.storage)
    lambda: mixed_params(),
    dash_fn.DashConfig(block_size=8, solver="ndb", **dict.fromkeys(dash_fn.config.STORAGE_FIELDS, "bfloat16")),
)
SCENARIOS["update_rules"] = (  # every option of docs/ALGORITHM.md 4 e, 4 g, 5.6; thin blocks at B = 24
    lambda: mixed_params(),
    dash_fn.DashConfig(
        block_size=24, solver="eigh", grafting="rms", nesterov_G=True, eps_rel=1e-4, root_order=3, mu=0.5
    ),
)
SCENARIOS["eigenvalue_corrected"] = (  # docs/ALGORITHM.md 4 k: eigh bases, staggered, momentum, thin blocks at B = 24
    lambda: mixed_params(),
    dash_fn.DashConfig(
        block_size=24, preconditioner="eigenvalue_corrected", solver="eigh", inv_root_freq=3, mu=0.5, nesterov_G=True
    ),
)
SCENARIOS["warmup"] = (  # docs/ALGORITHM.md 4 d: every root on the warm-up steps, then the staggered slices
    lambda: mixed_params(),
    dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=3, start_prec_step=2, inv_root_warmup=2, mu=0.5),
)
BATCH_DIMS = {"moe": {"experts": 1}}  # five experts, each its own matrix
SCENARIOS["skips"] = (lambda: mixed_params(), dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=2, mu=0.5))


def overflow_one_block(grads):
    """Only rect's first 8 x 8 block overflows its factor products: only its owner can tell."""
    grads["rect"][:8, :8] *= 1e25
    return grads


FAULTS = {"skips": {4: overflow_one_block}}  # before step t, a spoiled step that every rank must skip


def state_bytes(state) -> int:
    """Bytes of the state's arrays (not its 0-d counters, which every rank keeps, nor the
    constant tables made from the config and plan: start vectors, the stagger's indices)."""
    return sum(x.numel() * x.element_size() for k, x in tensors(state).items() if x.ndim and k[0] not in CONSTANTS)


def run(params, config, process_group=None, steps=STEPS, compile_backend=None, batch_dims=None, faults=None):
    state = dash_fn.init(params, config, process_group, batch_dims=batch_dims)
    step = (
        dash_fn.step
        if compile_backend is None
        else torch.compile(dash_fn.step, fullgraph=True, backend=compile_backend)
    )
    for t in range(1, steps + 1):
        if t in (faults or {}):
            params, state = step(
                params,
                faults[t](random_grads(params, 100 + t)),
                state,
                lr=1e-2 / t,
                refresh=dash_fn.is_refresh_step(config, t),
            )
        params, state = step(
            params, random_grads(params, t), state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(config, t)
        )
    return params, state


def main(rank: int, world_size: int, init_file: str, out: str, *only: str) -> None:
    """Every scenario, one process and sharded, or just those named in ``only``."""
    torch.set_num_threads(int(os.environ.get("DASH_TEST_THREADS", "1")))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    group = dist.group.WORLD
    results = {}
    for name, (make_params, config) in SCENARIOS.items():
        if only and name not in only:
            continue
        single, single_state = run(make_params(), config, batch_dims=BATCH_DIMS.get(name))
        sharded, sharded_state = run(
            make_params(), config, group, batch_dims=BATCH_DIMS.get(name), faults=FAULTS.get(name)
        )
        results[name] = {
            "skipped": int(sharded_state["skipped"]),
            "single": single,
            "sharded": sharded,
            "single_bytes": state_bytes(single_state),
            "sharded_bytes": state_bytes(sharded_state),
        }
    if not only or "compiled" in only:
        torch._dynamo.config.recompile_limit = 64  # the two runs below compile one graph each
        results["compiled"] = {
            "single": run(mixed_params(), SCENARIOS["eigh"][1], compile_backend="aot_eager")[0],
            "sharded": run(mixed_params(), SCENARIOS["eigh"][1], group, compile_backend="aot_eager")[0],
        }
    if not only:
        config = SCENARIOS["ndb"][1]
        results["bf16"] = {"sharded": run(mixed_params(), config.replace(comm_dtype="bfloat16"), group)[0]}
        results["adapter"] = adapter_run(group)
        results["syncs"] = count_syncs(group)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def adapter_run(group) -> dict:
    """dash_fn.DASH on a small model, distributed and not, with a checkpoint round trip at step 5."""
    out = {}
    for label, process_group in (("single", None), ("sharded", group)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))
        opt = dash_fn.DASH(model.parameters(), lr=1e-2, block_size=8, solver="eigh", process_group=process_group)
        data = torch.Generator().manual_seed(1)
        for t in range(STEPS):
            x = torch.randn(16, 20, generator=data)
            model.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            if t == 4:  # each rank saves and reloads its own share
                saved = opt.state_dict()
                opt = dash_fn.DASH(
                    model.parameters(), lr=1e-2, block_size=8, solver="eigh", process_group=process_group
                )
                opt.load_state_dict(saved)
        out[label] = [p.detach().clone() for p in model.parameters()]
    return out


def count_syncs(group) -> list[str]:
    """The host syncs of steady-state sharded steps under the accelerator strategy (simulated
    on the CPU): functional and adapter, eager, NDB with momentum and the non-finite guard."""
    from benchmarks.syncs import SyncCounter
    from dash_fn.strategy import simulated_accelerator

    config = SCENARIOS["ndb"][1]
    counter = SyncCounter()
    with simulated_accelerator():
        params, state = run(mixed_params(), config, group, steps=2)  # warm: the first refresh is behind
        for t in range(3, 6):
            with counter:
                params, state = dash_fn.step(
                    params, random_grads(params, t), state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t)
                )
        model = torch.nn.Linear(30, 20)
        opt = dash_fn.DASH(
            model.parameters(), lr=1e-2, block_size=8, solver="ndb", mu=0.5, inv_root_freq=2, process_group=group
        )
        for t in range(5):
            model.zero_grad()
            model(torch.randn(4, 30, generator=torch.Generator().manual_seed(t))).square().mean().backward()
            if t < 2:
                opt.step()
                continue
            with counter:
                opt.step()
    return counter.syncs


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
