"""What each spawned rank of tests/test_tensor_parallel.py runs (gloo on CPU).

``python tp_worker.py RANK W INIT_FILE OUT TASK DP TP [FROM_DP FROM_TP]``:

- ``equal``: a Llama-style block laid out as torchtitan lays it out on a (DP, TP) mesh
  (:func:`parallelize`): tensor parallel on the ``tp`` dim, then ``fully_shard`` on ``dp``
  when DP > 1. Each rank writes its pieces after the functional step (exact blocks, eager
  and compiled with aot_eager; local blocks beside their per-piece oracle), after the adapter,
  and the host syncs of the accelerator strategy's steps.
- ``save``: the first half of the functional steps, then a DCP checkpoint of parameters and state.
- ``resume FROM_DP FROM_TP``: loads the checkpoint saved on that layout, takes the other half of the steps, writes
  the full parameters.
- ``hsdp``: HSDP beside tensor parallel on a (2, 2, 2) mesh, exact blocks; each rank's pieces.

Gradients are the same full tensors on every rank (seeded), each rank taking its piece, so
neither FSDP's reductions nor tensor parallelism's are under test: only the optimizer's.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import dash_fn
from conftest import random_grads
from dash_fn.distributed.fsdp import sent_elements

STEPS = 6
# widths that put tensor-parallel edges inside blocks of 8 (40 / 2 = 20 rows or columns a
# rank) and FSDP2 edges inside them too (20 / 2 = 10), besides aligned ones (24 / 2 = 12 at
# block 4 in "ndb")
DIM, HIDDEN = 24, 40
SCENARIOS = {
    "eigh": dash_fn.DashConfig(block_size=8, solver="eigh", inv_root_freq=2, mu=0.5),
    "ndb": dash_fn.DashConfig(block_size=4, solver="ndb", inv_root_freq=2, one_dim="shampoo"),
    "eigenvalue_corrected": dash_fn.DashConfig(
        block_size=8, preconditioner="eigenvalue_corrected", solver="qr", inv_root_freq=2
    ),
}
ADAPTER = dict(lr=1e-2, block_size=8, solver="eigh", inv_root_freq=2)


class Block(torch.nn.Module):
    """A Llama block's parameters, named as torchtitan names them."""

    def __init__(self):
        super().__init__()
        self.attention_norm = torch.nn.RMSNorm(DIM)
        self.attention = torch.nn.ModuleDict(
            {k: torch.nn.Linear(DIM, DIM, bias=False) for k in ("wq", "wk", "wv", "wo")}
        )
        self.ffn_norm = torch.nn.RMSNorm(DIM)
        self.feed_forward = torch.nn.ModuleDict(
            {
                "w1": torch.nn.Linear(DIM, HIDDEN, bias=False),
                "w2": torch.nn.Linear(HIDDEN, DIM, bias=False),
                "w3": torch.nn.Linear(DIM, HIDDEN, bias=False),
            }
        )
        # outside the tensor-parallel plan (an MoE router): replicated over tp, so that under
        # FSDP2 it lives on the dp sub-mesh alone
        self.router = torch.nn.Linear(DIM, 6, bias=False)


def block() -> Block:
    torch.manual_seed(0)
    net = Block()
    with torch.no_grad():  # norms away from 1, so that their updates differ between ranks' pieces
        for p in net.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    return net


def parallelize(dp: int, tp: int, replicas: int = 1) -> tuple[Block, object]:
    """The block on a (dp, tp) mesh as torchtitan's Llama: ColwiseParallel on q, k, v, w1, w3,
    RowwiseParallel on o and w2, SequenceParallel on the norms; then fully_shard on dp. With
    ``replicas`` > 1 the mesh is (replicas, dp, tp) and FSDP2 is HSDP over its first two dims."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    if replicas > 1:
        mesh = init_device_mesh("cpu", (replicas, dp, tp), mesh_dim_names=("dp_replicate", "dp", "tp"))
        data = mesh["dp_replicate", "dp"]
    else:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        data = mesh["dp"]
    net = block()
    plan = {
        "attention_norm": SequenceParallel(),
        "ffn_norm": SequenceParallel(),
        **{f"attention.{k}": ColwiseParallel() for k in ("wq", "wk", "wv")},
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }
    if tp > 1:
        parallelize_module(net, mesh["tp"], plan)
        if dp * replicas == 1:
            distribute_module(net.router, mesh["tp"])  # Replicate(): every parameter a DTensor
    if dp * replicas > 1:
        fully_shard(net, mesh=data)
    return net, mesh


def full_params() -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in block().named_parameters()}


def box(x: torch.Tensor, like) -> tuple[slice, ...]:
    """Where ``like``'s piece lies in the whole tensor: DTensor's own offsets (the worker checks
    them against the pieces the layout really holds)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    shape, offset = _compute_local_shape_and_global_offset(
        x.shape, like.device_mesh.shape, like.device_mesh.get_coordinate(), like.placements
    )
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def piece(x: torch.Tensor, like) -> torch.Tensor:
    """``like``'s piece of the whole tensor ``x`` as a DTensor placed like it."""
    from torch.distributed.tensor import DTensor

    local = x[box(x, like)].contiguous()
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=x.shape, stride=x.stride()
    )


def pieces(full: dict[str, torch.Tensor], params) -> dict[str, torch.Tensor]:
    return {k: piece(v, params[k]) for k, v in full.items()}


def grads_at(t: int) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in random_grads(full_params(), t).items()}


def run_functional(config, params=None, steps=range(1, STEPS + 1), state=None, compile_backend=None):
    """``steps`` functional steps on ``params`` (DTensors, or the whole tensors when None)."""
    params = full_params() if params is None else params
    sharded = type(next(iter(params.values()))).__name__ == "DTensor"
    state = dash_fn.init(params, config) if state is None else state
    step = (
        dash_fn.step
        if compile_backend is None
        else torch.compile(dash_fn.step, fullgraph=True, backend=compile_backend)
    )
    for t in steps:
        grads = grads_at(t)
        grads = pieces(grads, params) if sharded else grads
        params, state = step(params, grads, state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(config, t))
    return params, state


def local_oracle(config, params) -> dict[str, torch.Tensor]:
    """fsdp_blocks="local" on this rank = one process on this rank's pieces as whole params."""
    local = {k: v.to_local().clone() for k, v in params.items()}
    state = dash_fn.init(local, config)
    for t in range(1, STEPS + 1):
        grads = {k: v.to_local() for k, v in pieces(grads_at(t), params).items()}
        local, state = dash_fn.step(local, grads, state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(config, t))
    return local


def adapter_run(net, steps, compile=False) -> list[torch.Tensor]:
    opt = dash_fn.DASH(net.parameters(), compile=compile, **ADAPTER)
    named = dict(net.named_parameters())
    for t in steps:
        for name, g in grads_at(t).items():
            p = named[name]
            p.grad = piece(g, p) if type(p).__name__ == "DTensor" else g
        opt.step()
    return opt


def count_syncs(dp: int, tp: int) -> list[str]:
    """The host syncs of steady-state steps under the accelerator strategy (simulated on the
    CPU): functional on the parallelized block's pieces, NDB with the guard, eager."""
    from benchmarks.syncs import SyncCounter
    from dash_fn.strategy import simulated_accelerator

    config = SCENARIOS["ndb"]
    counter = SyncCounter()
    with simulated_accelerator():
        net, _ = parallelize(dp, tp)
        params = {k: v.detach() for k, v in net.named_parameters()}
        params, state = run_functional(config, params, steps=range(1, 3))
        for t in range(3, 6):
            grads = pieces(grads_at(t), params)
            with counter:
                params, state = dash_fn.step(params, grads, state, lr=1e-2, refresh=dash_fn.is_refresh_step(config, t))
    return counter.syncs


def sent_in_one_step(params, state) -> int:
    """Elements this rank's all-to-alls send in one step (its buffer holds only what other
    ranks get)."""
    import torch.distributed._functional_collectives as collectives

    original, sent = collectives.all_to_all_single, []

    def counted(buffer, *args, **kwargs):
        sent.append(buffer.numel())
        return original(buffer, *args, **kwargs)

    collectives.all_to_all_single = counted
    try:
        config = state["config"]
        refresh = dash_fn.is_refresh_step(config, STEPS + 1)
        dash_fn.step(params, pieces(grads_at(STEPS + 1), params), state, lr=1e-3, refresh=refresh)
    finally:
        collectives.all_to_all_single = original
    return sum(sent)


def equal_task(rank: int, out: str, dp: int, tp: int) -> None:
    results: dict = {}
    net, _ = parallelize(dp, tp)
    params = dict(net.named_parameters())
    full = full_params()
    results["holds"] = all(torch.equal(params[k].to_local(), piece(v, params[k]).to_local()) for k, v in full.items())
    results["boxes"] = {k: box(v, params[k]) for k, v in full.items()}
    results["placements"] = {k: str(tuple(v.placements)) for k, v in params.items()}
    for name, config in SCENARIOS.items():
        got, state = run_functional(config, {k: v.detach() for k, v in params.items()})
        results[name] = {k: v.to_local() for k, v in got.items()}
        results[name + "_exchanges"] = state["shard"].exchanges
        if name == "eigh":  # one more step: what its all-to-alls send, beside what the plan says
            results["sent"] = sent_in_one_step(got, state)
            shard = state["shard"]
            results["planned"] = [
                a + b
                for a, b in zip(
                    sent_elements(state["plan"], shard.rects, shard.owned_rects),
                    sent_elements(state["plan"], shard.owned_rects, shard.rects),
                )
            ][shard.rank]
    torch._dynamo.config.recompile_limit = 64
    compiled = run_functional(
        SCENARIOS["eigh"], {k: v.detach() for k, v in params.items()}, compile_backend="aot_eager"
    )[0]
    results["compiled"] = {k: v.to_local() for k, v in compiled.items()}
    local = SCENARIOS["eigh"].replace(fsdp_blocks="local")
    results["local"] = {
        k: v.to_local() for k, v in run_functional(local, {k: v.detach() for k, v in params.items()})[0].items()
    }
    results["local_oracle"] = local_oracle(local, params)
    aligned, state = run_functional(ALIGNED, {k: v.detach() for k, v in params.items()})
    results["aligned"] = {k: v.to_local() for k, v in aligned.items()}
    results["aligned_sent"] = sent_in_one_step(aligned, state)
    adapted, _ = parallelize(dp, tp)
    adapter_run(adapted, range(1, STEPS + 1))
    results["adapter"] = {k: v.to_local() for k, v in adapted.named_parameters()}
    results["syncs"] = count_syncs(dp, tp)
    torch.save(results, os.path.join(out, f"equal_{dp}x{tp}_rank{rank}.pt"))


FUNCTIONAL = SCENARIOS["eigh"]
ALIGNED = SCENARIOS["eigh"].replace(fsdp_blocks="aligned")
COLWISE = (
    "attention.wq.weight",
    "attention.wk.weight",
    "attention.wv.weight",
    "feed_forward.w1.weight",
    "feed_forward.w3.weight",
)
ROWWISE = ("attention.wo.weight", "feed_forward.w2.weight")


def tiles_oracle(config, tp: int) -> dict[str, torch.Tensor]:
    """fsdp_blocks="aligned" = one process on every tensor-parallel piece as a parameter of its
    own: colwise weights cut into tp bands of rows, rowwise ones into tp bands of columns."""

    def cut(name: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.chunk(x, tp, 0) if name in COLWISE else torch.chunk(x, tp, 1) if name in ROWWISE else (x,)
        return {f"{name}#{i}": part.contiguous() for i, part in enumerate(parts)}

    params = {k: v for name, x in full_params().items() for k, v in cut(name, x).items()}
    state = dash_fn.init(params, config)
    for t in range(1, STEPS + 1):
        grads = {k: v for name, g in grads_at(t).items() for k, v in cut(name, g).items()}
        params, state = dash_fn.step(params, grads, state, lr=1e-2 / t, refresh=dash_fn.is_refresh_step(config, t))
    whole = {}
    for name in full_params():
        parts = [v for k, v in params.items() if k.rsplit("#", 1)[0] == name]
        whole[name] = torch.cat(parts, dim=1 if name in ROWWISE else 0)
    return whole


def save_task(out: str, dp: int, tp: int, config=FUNCTIONAL) -> None:
    import torch.distributed.checkpoint as dcp

    net, _ = parallelize(dp, tp)
    params, state = run_functional(
        config, {k: v.detach() for k, v in net.named_parameters()}, steps=range(1, STEPS // 2 + 1)
    )
    path = os.path.join(out, f"tp_{config.fsdp_blocks}_{dp}x{tp}")
    dcp.save({"params": params, "optim": dash_fn.state_to_dict(state)}, checkpoint_id=path)


def resume_task(rank: int, out: str, dp: int, tp: int, from_dp: int, from_tp: int, config=FUNCTIONAL) -> None:
    import torch.distributed.checkpoint as dcp

    if dp * tp > 1:
        net, _ = parallelize(dp, tp)
        params = {k: v.detach() for k, v in net.named_parameters()}
    else:
        params = full_params()
    state = dash_fn.init(params, config)
    sd = {"params": params, "optim": dash_fn.state_to_dict(state)}
    dcp.load(sd, checkpoint_id=os.path.join(out, f"tp_{config.fsdp_blocks}_{from_dp}x{from_tp}"))
    state = dash_fn.state_from_dict(state, sd["optim"])
    params, _ = run_functional(config, sd["params"], steps=range(STEPS // 2 + 1, STEPS + 1), state=state)
    whole = {k: v.full_tensor() if type(v).__name__ == "DTensor" else v for k, v in params.items()}
    name = f"resume_{config.fsdp_blocks}_{from_dp}x{from_tp}_to_{dp}x{tp}_rank{rank}.pt"
    torch.save(whole, os.path.join(out, name))


def hsdp_task(rank: int, out: str) -> None:
    """HSDP beside tensor parallel on a (2, 2, 2) mesh: exact blocks, eager."""
    net, _ = parallelize(2, 2, replicas=2)
    params = {k: v.detach() for k, v in net.named_parameters()}
    got = run_functional(SCENARIOS["eigh"], params)[0]
    results = {"pieces": {k: v.to_local() for k, v in got.items()}, "boxes": {k: box(v, v) for k, v in got.items()}}
    results["placements"] = {k: str(tuple(v.placements)) for k, v in params.items()}
    torch.save(results, os.path.join(out, f"hsdp_rank{rank}.pt"))


def main(rank: int, world: int, init_file: str, out: str, task: str, *args: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dp, tp, *rest = (int(a) for a in args) if args else (2, 2)
    if task == "equal":
        equal_task(rank, out, dp, tp)
    elif task in ("save", "save_aligned"):
        save_task(out, dp, tp, ALIGNED if task == "save_aligned" else FUNCTIONAL)
    elif task in ("resume", "resume_aligned"):
        resume_task(rank, out, dp, tp, *rest, config=ALIGNED if task == "resume_aligned" else FUNCTIONAL)
    elif task == "hsdp":
        hsdp_task(rank, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
