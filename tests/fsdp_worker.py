"""What each spawned rank of tests/test_fsdp.py runs (gloo on CPU).

``python fsdp_worker.py RANK W INIT_FILE OUT TASK [FROM_W | SCENARIO ...]``:

- ``equal``: functional scenarios on DTensor shards (``Shard(0)`` on a 1-D mesh, uneven and
  empty shards), each rank's shards after 10 steps written for the test to compare with one
  process; local mode beside its per-shard oracle; the aot_eager-compiled step (or only the
  scenarios named).
- ``save``: the adapter trains 5 steps under FSDP2 (``fully_shard``) and under DDP-style
  ownership (``process_group=``), and saves each with ``torch.distributed.checkpoint``.
- ``resume FROM_W``: loads the checkpoints saved by FROM_W ranks and trains 5 more steps;
  the full parameters are written for the test to compare with an uninterrupted run.

Gradients are computed identically on every rank from seeded generators (the full gradient,
then each rank's shard of it), so FSDP's own reduction is not under test.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist

import dash_fn
from conftest import random_grads

STEPS = 10
# rows not divisible by 2 or 3, a matrix with fewer rows than ranks, vectors, a conv kernel
SHAPES = {"w": (30, 20), "thin": (2, 9), "conv": (5, 3, 2, 2), "bias": (30,), "vec": (7,), "experts": (3, 10, 6)}
BATCH_DIMS = {"experts": 1}  # three experts: Shard(0) splits them between ranks
SCENARIOS = {
    "eigh": dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=3),
    "ndb": dash_fn.DashConfig(block_size=6, solver="ndb", inv_root_freq=2, mu=0.9),
    "one_dim_shampoo": dash_fn.DashConfig(
        block_size=8, solver="eigh", one_dim="shampoo", weight_decay=0.1, weight_decay_1d=0.05
    ),
    "staggered": dash_fn.DashConfig(
        block_size=6, solver="ndb", inv_root_freq=3, start_prec_step=2, mu=0.5, refresh_schedule="staggered"
    ),
    "storage": dash_fn.DashConfig(  # every kind kept in 16 bits (dash_fn.storage)
        block_size=8, solver="ndb", inv_root_freq=2, **dict.fromkeys(dash_fn.config.STORAGE_FIELDS, "bfloat16")
    ),
    "update_rules": dash_fn.DashConfig(  # every option of docs/ALGORITHM.md 4 e, 4 g, 5.6
        block_size=8, solver="eigh", grafting="spectral", nesterov_G=True, eps_rel=1e-4, root_order=3, mu=0.5
    ),
    "eigenvalue_corrected": dash_fn.DashConfig(  # docs/ALGORITHM.md 4 k: qr bases, periodic
        block_size=8, preconditioner="eigenvalue_corrected", solver="qr", inv_root_freq=2, refresh_schedule="periodic"
    ),
}
ADAPTER = dict(lr=1e-2, block_size=8, solver="eigh", mu=0.5, weight_decay=0.01)


def full_params(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen) for k, s in SHAPES.items()}


def shard_of(full: torch.Tensor, mesh) -> torch.Tensor:
    """Rank's ``Shard(0)`` piece of ``full`` as a DTensor, without communication."""
    from torch.distributed.tensor import DTensor, Shard

    rank, world = mesh.get_local_rank(0), mesh.size(0)
    chunk = -(-full.shape[0] // world)
    lo, hi = min(rank * chunk, full.shape[0]), min((rank + 1) * chunk, full.shape[0])
    return DTensor.from_local(
        full[lo:hi].clone(), mesh, (Shard(0),), run_check=False, shape=full.shape, stride=full.stride()
    )


def nan_in_last_rows(grads):
    """A NaN in the last row of w: on the last rank's shard only."""
    grads["w"][-1, 0] = float("nan")
    return grads


def run_functional(config, mesh=None, steps=STEPS, compile_backend=None, faults=None):
    params = full_params()
    if mesh is not None:
        params = {k: shard_of(v, mesh) for k, v in params.items()}
    state = dash_fn.init(params, config, batch_dims=BATCH_DIMS)
    step = (
        dash_fn.step
        if compile_backend is None
        else torch.compile(dash_fn.step, fullgraph=True, backend=compile_backend)
    )
    for t in range(1, steps + 1):
        for grads in [faults[t](random_grads(full_params(), 100 + t))] if t in (faults or {}) else []:
            params, state = step(
                params,
                {k: shard_of(v, mesh) for k, v in grads.items()},
                state,
                lr=1e-2 / t,
                refresh=dash_fn.is_refresh_step(config, t),
            )
        grads = random_grads(full_params(), t)
        if mesh is not None:
            grads = {k: shard_of(v, mesh) for k, v in grads.items()}
        params, state = step(params, grads, state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(config, t))
    return params, state


def local_oracle(config, rank: int, world: int) -> dict[str, torch.Tensor]:
    """fsdp_blocks="local" on this rank = one process on this rank's shards as whole params."""

    def piece(x):
        chunk = -(-x.shape[0] // world)
        return x[min(rank * chunk, x.shape[0]) : min((rank + 1) * chunk, x.shape[0])].clone()

    params = {k: piece(v) for k, v in full_params().items()}
    state = dash_fn.init(params, config, batch_dims=BATCH_DIMS)
    for t in range(1, STEPS + 1):
        params, state = dash_fn.step(
            params,
            {k: piece(v) for k, v in random_grads(full_params(), t).items()},
            state,
            lr=1e-2 / t,
            refresh=dash_fn.is_refresh_step(config, t),
        )
    return params


def equal_task(rank: int, world: int, out: str, *only: str) -> None:
    """Every scenario of ``equal``, or just those named in ``only``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    results = {}
    for name, config in SCENARIOS.items():
        if only and name not in only:
            continue
        params, state = run_functional(config, mesh)
        results[name] = {k: v.to_local() for k, v in params.items()}
        results[name + "_moved"] = state["shard"].exchanges
    if not only or "compiled" in only:
        torch._dynamo.config.recompile_limit = 64
        compiled = run_functional(SCENARIOS["eigh"], mesh, compile_backend="aot_eager")[0]
        results["compiled"] = {k: v.to_local() for k, v in compiled.items()}
    if not only:
        params, state = run_functional(SCENARIOS["eigh"], mesh, faults={5: nan_in_last_rows})
        results["skips"] = {k: v.to_local() for k, v in params.items()}
        results["skips_count"] = int(state["skipped"])
        local = SCENARIOS["eigh"].replace(fsdp_blocks="local")
        results["local"] = {k: v.to_local() for k, v in run_functional(local, mesh)[0].items()}
        results["local_oracle"] = local_oracle(local, rank, world)
        net, _, mesh = sharded_training("fsdp", world)
        opt = dash_fn.DASH(net.parameters(), compile={"backend": "aot_eager"}, **ADAPTER)
        for t in range(1, STEPS + 1):
            set_grads(net, t, mesh)
            opt.step()
        results["compiled_adapter"] = [p.full_tensor() for p in net.parameters()]
        results["syncs"] = count_syncs(mesh, world)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))


def count_syncs(mesh, world: int) -> list[str]:
    """The host syncs of steady-state FSDP2 steps under the accelerator strategy (simulated on
    the CPU): functional on DTensor shards and adapter on fully_shard parameters, eager, NDB
    with momentum and the non-finite guard."""
    from benchmarks.syncs import SyncCounter
    from dash_fn.strategy import simulated_accelerator

    config = SCENARIOS["ndb"]
    counter = SyncCounter()
    with simulated_accelerator():
        params, state = run_functional(config, mesh, steps=2)
        for t in range(3, 6):
            grads = {k: shard_of(v, mesh) for k, v in random_grads(full_params(), t).items()}
            with counter:
                params, state = dash_fn.step(params, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
        net, _, mesh = sharded_training("fsdp", world)
        opt = dash_fn.DASH(net.parameters(), **{**ADAPTER, "solver": "ndb", "inv_root_freq": 2})
        for t in range(1, 6):
            set_grads(net, t, mesh)
            with counter if t > 2 else contextlib.nullcontext():
                opt.step()
    return counter.syncs


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Tanh(), torch.nn.Linear(30, 5))


def set_grads(net: torch.nn.Module, t: int, mesh=None) -> None:
    full = random_grads({k: v.detach() for k, v in model().named_parameters()}, t)
    for name, p in net.named_parameters():
        p.grad = shard_of(full[name], mesh) if mesh is not None else full[name].clone()


def reference(steps: int = STEPS, compile=False) -> list[torch.Tensor]:
    """The uninterrupted one-process run of the adapter."""
    net = model()
    opt = dash_fn.DASH(net.parameters(), compile=compile, **ADAPTER)
    for t in range(1, steps + 1):
        set_grads(net, t)
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def sharded_training(mode: str, world: int):
    """The adapter under FSDP2 (``fully_shard`` per Linear and at the root) or DDP ownership."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    net = model()
    if mode == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in (net[0], net[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(net, mesh=mesh)
        return net, dash_fn.DASH(net.parameters(), **ADAPTER), mesh
    return net, dash_fn.DASH(net.parameters(), process_group=dist.group.WORLD, **ADAPTER), None


FUNCTIONAL = dash_fn.DashConfig(block_size=8, solver="eigh", mu=0.5, inv_root_freq=2)


def functional_training(world: int):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    params = {k: shard_of(v, mesh) for k, v in full_params().items()}
    return params, dash_fn.init(params, FUNCTIONAL, batch_dims=BATCH_DIMS), mesh


def functional_steps(params, state, mesh, steps):
    for t in steps:
        grads = {k: shard_of(v, mesh) for k, v in random_grads(full_params(), t).items()}
        params, state = dash_fn.step(params, grads, state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(FUNCTIONAL, t))
    return params, state


def save_task(world: int, out: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    params, state, mesh = functional_training(world)
    params, state = functional_steps(params, state, mesh, range(1, STEPS // 2 + 1))
    dcp.save(
        {"params": params, "optim": dash_fn.state_to_dict(state)},
        checkpoint_id=os.path.join(out, f"functional_w{world}"),
    )
    for mode in ("fsdp", "ddp"):
        net, opt, mesh = sharded_training(mode, world)
        for t in range(1, STEPS // 2 + 1):
            set_grads(net, t, mesh)
            opt.step()
        model_sd, optim_sd = get_state_dict(net, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(out, f"{mode}_w{world}"))


def resume_task(rank: int, world: int, out: str, saved_world: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    results = {"errors": config_mismatch(world, os.path.join(out, f"fsdp_w{saved_world}"))}
    params, state, mesh = functional_training(world)
    sd = {"params": params, "optim": dash_fn.state_to_dict(state)}
    dcp.load(sd, checkpoint_id=os.path.join(out, f"functional_w{saved_world}"))
    params, state = functional_steps(
        sd["params"], dash_fn.state_from_dict(state, sd["optim"]), mesh, range(STEPS // 2 + 1, STEPS + 1)
    )
    results["functional"] = {k: v.full_tensor() for k, v in params.items()}
    for mode in ("fsdp", "ddp"):
        net, opt, mesh = sharded_training(mode, world)
        model_sd, optim_sd = get_state_dict(net, opt)
        sd = {"model": model_sd, "optim": optim_sd}
        dcp.load(sd, checkpoint_id=os.path.join(out, f"{mode}_w{saved_world}"))
        set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        for t in range(STEPS // 2 + 1, STEPS + 1):
            set_grads(net, t, mesh)
            opt.step()
        results[mode] = [p.full_tensor() if mesh is not None else p.detach().clone() for p in net.parameters()]
    torch.save(results, os.path.join(out, f"resume_w{saved_world}_to_w{world}_rank{rank}.pt"))


def config_mismatch(world: int, checkpoint: str) -> list[str]:
    """Load a checkpoint into an optimizer of another block size: the errors raised."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    errors = []
    net, _, mesh = sharded_training("fsdp", world)
    opt = dash_fn.DASH(net.parameters(), **{**ADAPTER, "block_size": 4})
    model_sd, optim_sd = get_state_dict(net, opt)
    sd = {"model": model_sd, "optim": optim_sd}
    dcp.load(sd, checkpoint_id=checkpoint, planner=DefaultLoadPlanner(allow_partial_load=True))
    before = [x.clone() for x in opt.state[net[0].weight]["dash"].values(include_nested=True, leaves_only=True)]
    try:
        set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    except ValueError as error:
        errors.append(str(error))
    after = list(opt.state[net[0].weight]["dash"].values(include_nested=True, leaves_only=True))
    errors.append(f"unchanged: {all(torch.equal(a, b) for a, b in zip(before, after))}")
    return errors


def hsdp_task(rank: int, out: str) -> None:
    """(Replicate(), Shard(0)) on a 2 x 2 mesh: every rank's shard equals one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))

    def hsdp(full):
        local = shard_of(full, mesh["shard"]).to_local()
        return DTensor.from_local(
            local, mesh, (Replicate(), Shard(0)), run_check=False, shape=full.shape, stride=full.stride()
        )

    params = {k: hsdp(v) for k, v in full_params().items()}
    state = dash_fn.init(params, SCENARIOS["eigh"], batch_dims=BATCH_DIMS)
    for t in range(1, STEPS + 1):
        params, state = dash_fn.step(
            params,
            {k: hsdp(v) for k, v in random_grads(full_params(), t).items()},
            state,
            lr=1e-2 / t,
            refresh=dash_fn.is_refresh_step(SCENARIOS["eigh"], t),
        )
    torch.save({k: v.full_tensor() for k, v in params.items()}, os.path.join(out, f"hsdp_rank{rank}.pt"))


def main(rank: int, world: int, init_file: str, out: str, task: str, *args: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if task == "equal":
        equal_task(rank, world, out, *args)
    elif task == "save":
        save_task(world, out)
    elif task == "resume":
        resume_task(rank, world, out, int(args[0]))
    elif task == "hsdp":
        hsdp_task(rank, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
