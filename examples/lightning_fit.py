"""Lightning with ``dash_fn.DASH``: the examples' byte-level Llama fitted by ``Trainer.fit``.

    python -m examples.lightning_fit [--epochs 4] [--optimizer dash|adamw] [--lr LR] [--out DIR] [--no-resume]

``configure_optimizers`` returns DASH and a per-step cosine schedule, the one place that differs
from AdamW. A ``ModelCheckpoint`` saves after every epoch (the optimizer's ``state_dict()`` goes
into the checkpoint), and ``trainer.fit(..., ckpt_path=...)`` resumes bit for bit. Each epoch
draws its batches from a sampler seeded by the epoch (``set_epoch``, which Lightning calls), so
a resumed run sees the batches the uninterrupted one saw. The data is the main job's: bytes of
the Python standard library's sources (``train_lm.stdlib_corpus``). The default learning rates
are the best of those tried for each optimizer (AdamW: 3e-3, 6e-3, 1e-2; DASH: 3e-3, 1e-2).
"""

from __future__ import annotations

import argparse
import glob
import math
import os

import lightning
import torch
from torch.nn import functional as F

import dash_fn
from examples.llama import Llama, LlamaConfig
from examples.train_lm import stdlib_corpus

CONTEXT, BATCH, BATCHES_PER_EPOCH = 64, 16, 15


class ByteLM(lightning.LightningModule):
    """Next-byte prediction with the examples' Llama; the optimizer is ``name`` at ``lr``."""

    def __init__(self, name: str, lr: float, total_steps: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.model = Llama(LlamaConfig(d_model=64, n_layers=2, n_heads=4, mlp_hidden=172, context=CONTEXT))
        self.name, self.lr, self.total_steps = name, lr, total_steps

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    def training_step(self, tokens, index):
        loss = self.loss(tokens)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        matrices = [p for p in self.parameters() if p.ndim >= 2]
        vectors = [p for p in self.parameters() if p.ndim < 2]
        groups = [{"params": matrices, "weight_decay": 0.01}, {"params": vectors, "weight_decay": 0.0}]
        if self.name == "dash":
            optimizer = dash_fn.DASH(groups, lr=self.lr)
        else:
            optimizer = torch.optim.AdamW(groups, lr=self.lr, betas=(0.9, 0.95))
        warmup = max(1, self.total_steps // 10)

        def schedule(t: int) -> float:  # linear warm-up, then cosine decay to 10%
            if t < warmup:
                return (t + 1) / warmup
            return 0.1 + 0.45 * (1 + math.cos(math.pi * (t - warmup) / max(1, self.total_steps - warmup)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def windows(data: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """``count`` windows of ``CONTEXT + 1`` bytes at fixed random offsets."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - CONTEXT - 1, (count,), generator=gen)
    return torch.stack([data[s : s + CONTEXT + 1] for s in starts.tolist()])


def loader(data: torch.Tensor, seed: int) -> torch.utils.data.DataLoader:
    """One epoch of ``BATCHES_PER_EPOCH`` batches; the order a function of (seed, epoch)."""
    dataset = windows(data, BATCH * BATCHES_PER_EPOCH, seed)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)


def fit(name: str, lr: float, epochs: int, out: str, ckpt_path: str | None = None, seed: int = 0) -> ByteLM:
    """A fresh module fitted for ``epochs`` (from ``ckpt_path`` if given), checkpointing each epoch."""
    train_bytes, _ = stdlib_corpus(300_000)
    module = ByteLM(name, lr, epochs * BATCHES_PER_EPOCH, seed)
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(
        dirpath=out, filename="{epoch}", save_top_k=-1, every_n_epochs=1
    )
    # deterministic=True sets torch's process-wide deterministic-algorithms flag and leaves it
    # set; restore it for in-process callers (the tests, a notebook)
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    trainer = lightning.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[checkpoints],
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        deterministic=True,
    )
    try:
        trainer.fit(module, loader(train_bytes, seed), ckpt_path=ckpt_path)
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    return module


@torch.no_grad()
def validation_loss(module: ByteLM, seed: int = 0) -> float:
    """Mean loss on 64 fixed windows of the validation bytes."""
    _, val_bytes = stdlib_corpus(300_000)
    return float(module.loss(windows(val_bytes, 64, seed + 1)))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--optimizer", choices=("dash", "adamw"), default="dash", help="the optimizer configure_optimizers returns"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="peak learning rate; None: 1e-2 for dash, 6e-3 for adamw"
    )
    parser.add_argument("--epochs", type=int, default=4, help=f"epochs of {BATCHES_PER_EPOCH} steps")
    parser.add_argument("--out", default="runs/lightning_fit", help="where ModelCheckpoint writes")
    parser.add_argument(
        "--no-resume", action="store_true", help="skip the second run resumed from the middle checkpoint"
    )
    args = parser.parse_args(argv)
    lightning.seed_everything(0, verbose=False)
    lr = args.lr if args.lr is not None else {"dash": 1e-2, "adamw": 6e-3}[args.optimizer]
    module = fit(args.optimizer, lr, args.epochs, args.out)
    result = {"module": module, "val_loss": validation_loss(module)}
    steps = args.epochs * BATCHES_PER_EPOCH
    print(f"{args.optimizer}@{lr:g}: validation loss {result['val_loss']:.4f} after {steps} steps")
    if not args.no_resume:  # a new process would do the same: a fresh module, then the checkpoint
        middle = os.path.join(args.out, f"epoch={args.epochs // 2 - 1}.ckpt")
        assert glob.glob(middle), f"no checkpoint {middle}"
        resumed = fit(args.optimizer, lr, args.epochs, os.path.join(args.out, "resumed"), ckpt_path=middle)
        same = all(torch.equal(p, q) for p, q in zip(module.parameters(), resumed.parameters()))
        print(f"resumed from {os.path.basename(middle)}: final parameters {'identical' if same else 'DIFFER'}")
        result["resumed"] = resumed
    return result


if __name__ == "__main__":
    main()
