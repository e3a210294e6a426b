"""FSDP2 training with DASH and resumable torch.distributed.checkpoint (DCP) checkpoints.

    torchrun --nproc_per_node=2 -m examples.fsdp_train --checkpoint-dir ckpt    # CPU, gloo
    torchrun --nproc_per_node=3 -m examples.fsdp_train --batch 6 --resume ckpt/step_50
    torchrun --nproc_per_node=8 -m examples.fsdp_train --d-model 512            # GPUs, NCCL
    python -m examples.fsdp_train                                               # one process

The byte-level Llama of train_lm.py with ``fully_shard`` on each transformer block and at the
root, stepped by ``dash_fn.DASH`` straight on the DTensor parameters: each rank keeps and
refreshes the blocks of its row shards only. Every step takes one global batch of ``--batch``
sequences and each rank reads its own slice of it, so the data does not depend on the number
of ranks. ``--checkpoint-dir`` saves model, optimizer and step with DCP every
``--checkpoint-every`` steps and at the end; ``--resume`` continues such a checkpoint, also at
another world size (``--fsdp-blocks exact``, the default). Rank 0 shows a progress bar and, at
the end, the validation loss, the step time, the optimizer state bytes on each rank and the
checkpoint written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import dash_fn
from examples.compiled_step import lr_at
from examples.ddp_train import next_byte_loss, state_bytes
from examples.llama import Llama, LlamaConfig
from examples.train_lm import batch_at, progress_bar, stdlib_corpus


def save(directory: str, t: int, model, opt) -> str:
    """Every rank writes its shards of model and optimizer; the step goes in as a plain tensor."""
    model_sd, optim_sd = get_state_dict(model, opt)
    path = f"{directory}/step_{t}"
    dcp.save({"model": model_sd, "optim": optim_sd, "meta": {"step": torch.tensor(t)}}, checkpoint_id=path)
    return path


def resume(path: str, model, opt) -> int:
    """Load a checkpoint (saved at any world size) into the sharded model and DASH; its step."""
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "meta": {"step": torch.tensor(0)}}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["meta"]["step"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100, help="train up to this step (a resumed run too)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step, split evenly across the ranks")
    parser.add_argument("--context", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--n-layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then cosine decay")
    parser.add_argument("--block-size", type=int, default=128, help="DASH block size")
    parser.add_argument("--inv-root-freq", type=int, default=10, help="steps between inverse-root refreshes")
    parser.add_argument(
        "--fsdp-blocks",
        choices=["exact", "aligned", "local"],
        default="exact",
        help="blocks as in one process, or cut at shard edges (resumes at the same world size only)",
    )
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000, help="bytes of standard-library source to read")
    parser.add_argument("--checkpoint-dir", default=None, help="save DIR/step_N with DCP")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: only at the end)"
    )
    parser.add_argument("--resume", default=None, help="a checkpoint directory (DIR/step_N) to continue from")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("nccl" if cuda else "gloo")
    else:  # one process: a group of one, so that the same FSDP code runs
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.batch % world_size:
        parser.error(f"--batch {args.batch} does not split evenly across {world_size} ranks")
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial model on every rank, before fully_shard splits it
    config = LlamaConfig(
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=max(1, args.d_model // 32),
        mlp_hidden=8 * args.d_model // 3,
        context=args.context,
    )
    model = Llama(config).to(device)
    mesh = init_device_mesh(device.type, (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = dash_fn.DASH(
        model.parameters(),
        lr=args.lr,
        block_size=args.block_size,
        solver="eigh",
        inv_root_freq=args.inv_root_freq,
        fsdp_blocks=args.fsdp_blocks,
    )
    start = resume(args.resume, model, opt) if args.resume else 0
    train_data, val_data = stdlib_corpus(args.corpus_bytes)

    steps = range(start + 1, args.steps + 1)
    steps = progress_bar(
        steps,
        desc=f"DASH + FSDP2 on {world_size} rank(s)",
        initial=start,
        total=args.steps,
        enabled=rank == 0 and not args.no_progress,
    )
    wall, timed, written = 0.0, 0, None
    for t in steps:
        tokens = batch_at(train_data, t, args.batch, args.context, seed=0).chunk(world_size)[rank].to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(t, args.steps, args.lr, args.warmup)
        began = time.perf_counter()
        opt.zero_grad()
        loss = next_byte_loss(model, tokens)  # FSDP2 averages the ranks' gradients: the global batch's
        loss.backward()
        opt.step()
        loss = loss.item()
        if t > start + 1:  # the first step builds the state
            wall, timed = wall + time.perf_counter() - began, timed + 1
        steps.set_postfix(loss=f"{loss:.3f}", ms=f"{1e3 * wall / max(1, timed):.0f}")
        if args.checkpoint_dir and (t == args.steps or (args.checkpoint_every and t % args.checkpoint_every == 0)):
            written = save(args.checkpoint_dir, t, model, opt)

    with torch.no_grad():  # every rank runs the same batches: FSDP2 all-gathers in each forward
        val = (
            sum(
                float(next_byte_loss(model, batch_at(val_data, -1 - i, args.batch, args.context, seed=0).to(device)))
                for i in range(4)
            )
            / 4
        )
    per_rank = [None] * world_size
    dist.all_gather_object(per_rank, state_bytes(opt))
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"ranks {world_size}, {params} parameters, steps {start + 1}-{args.steps}"
            + (f", resumed from {args.resume}" if args.resume else "")
        )
        print(f"final validation loss: {val:.6f}")
        print(f"mean step time: {1e3 * wall / max(1, timed):.1f} ms")
        print("optimizer state bytes per rank: " + ", ".join(f"{b} ({b / params:.2f} B/param)" for b in per_rank))
        print(f"checkpoint written: {written}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # DTensors keep gloo's process group, and so its worker threads, alive past
    # destroy_process_group (torch 2.13); a worker still releasing a collective's tensors when
    # the interpreter shuts down aborts the process now and then. Leave without the shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
