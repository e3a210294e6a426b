"""Data-parallel training with DASH's optimizer state split across ranks.

    torchrun --nproc_per_node=2 -m examples.ddp_train                 # CPU, gloo
    torchrun --nproc_per_node=8 -m examples.ddp_train --d-model 512    # GPUs, NCCL
    python -m examples.ddp_train                                       # one process

The byte-level Llama of train_lm.py, wrapped in DistributedDataParallel (which all-reduces the
gradients), stepped by ``dash_fn.DASH(..., process_group=WORLD)``: each rank keeps the factors,
roots and moments of its share of the blocks only, refreshes those roots, and the step
all-gathers the finished directions, so every rank applies the same update. Each rank reads
its own batches of the standard library's source. Rank 0 shows a progress bar and, at the
end, the validation loss, the step time, the optimizer state bytes on each rank, and whether
the ranks' parameters are bitwise identical (they must be).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

import dash_fn
from examples.compiled_step import lr_at
from examples.llama import Llama, LlamaConfig
from examples.train_lm import batch_at, progress_bar, stdlib_corpus


def state_bytes(opt: dash_fn.DASH) -> int:
    """Bytes of this rank's optimizer state tensors."""
    total = 0
    for entry in opt.state.values():
        state = entry["dash"]
        total += sum(
            x.numel() * x.element_size()
            for x in state.values(include_nested=True, leaves_only=True)
            if isinstance(x, torch.Tensor)
        )
    return total


def next_byte_loss(model, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--context", type=int, default=64, help="bytes per sequence")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument("--n-layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps, then cosine decay")
    parser.add_argument("--block-size", type=int, default=128, help="DASH block size")
    parser.add_argument("--solver", default="auto", help="root solver")
    parser.add_argument("--inv-root-freq", type=int, default=10, help="steps between inverse-root refreshes")
    parser.add_argument(
        "--comm-dtype", choices=["float32", "bfloat16"], default="float32", help="dtype of the gathered directions"
    )
    parser.add_argument("--corpus-bytes", type=int, default=2_000_000, help="bytes of standard-library source to read")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    distributed = "RANK" in os.environ  # started by torchrun
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)

    torch.manual_seed(0)  # the same initial model on every rank
    config = LlamaConfig(
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=max(1, args.d_model // 32),
        mlp_hidden=8 * args.d_model // 3,
        context=args.context,
    )
    model = Llama(config).to(device)
    trained = DistributedDataParallel(model) if distributed else model
    opt = dash_fn.DASH(
        model.parameters(),
        lr=args.lr,
        block_size=args.block_size,
        solver=args.solver,
        inv_root_freq=args.inv_root_freq,
        comm_dtype=None if args.comm_dtype == "float32" else args.comm_dtype,
        process_group=dist.group.WORLD if distributed else None,
    )
    train_data, val_data = stdlib_corpus(args.corpus_bytes)

    steps = range(1, args.steps + 1)
    steps = progress_bar(steps, desc=f"DASH on {world_size} rank(s)", enabled=rank == 0 and not args.no_progress)
    wall = 0.0
    for t in steps:
        tokens = batch_at(train_data, t, args.batch, args.context, seed=rank).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(t, args.steps, args.lr, args.warmup)
        start = time.perf_counter()
        opt.zero_grad()
        loss = next_byte_loss(trained, tokens)
        loss.backward()
        opt.step()
        loss = loss.item()
        if t > 1:  # the first step builds the state
            wall += time.perf_counter() - start
        steps.set_postfix(loss=f"{loss:.3f}", ms=f"{1e3 * wall / max(1, t - 1):.0f}")

    with torch.no_grad():
        val = (
            sum(
                float(next_byte_loss(model, batch_at(val_data, -1 - i, args.batch, args.context, seed=0).to(device)))
                for i in range(4)
            )
            / 4
        )
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mine = torch.tensor([state_bytes(opt)], device=device)
    if distributed:
        everyone = [torch.empty_like(flat) for _ in range(world_size)]
        dist.all_gather(everyone, flat)
        identical = all(torch.equal(x, flat) for x in everyone)
        per_rank = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(per_rank, mine)
    else:
        identical, per_rank = True, [mine]
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(
            f"ranks {world_size}, {params} parameters, {args.steps} steps: val loss {val:.4f}, "
            f"{1e3 * wall / max(1, args.steps - 1):.1f} ms/step"
        )
        print(
            "optimizer state bytes per rank: "
            + ", ".join(f"{int(b)} ({int(b) / params:.2f} B/param)" for b in per_rank)
        )
        print(f"parameters bitwise identical on all ranks: {identical}")
    if distributed:
        dist.destroy_process_group()
    if not identical:
        raise SystemExit("ranks diverged")


if __name__ == "__main__":
    main()
