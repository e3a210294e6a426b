"""Hugging Face ``Trainer`` with ``dash_fn.DASH``: a tiny randomly initialised Llama on bytes.

    python -m examples.hf_trainer [--steps 60] [--optimizer dash|adamw] [--lr LR] [--out runs/hf_trainer] [--no-resume]
        [--seed 0] [--dash FIELD=VALUE ...]

The model is transformers' ``LlamaForCausalLM`` built from a config (256 byte tokens, no
pretrained weights, nothing downloaded: ``HF_HUB_OFFLINE=1``), trained on the main job's data,
the bytes of the Python standard library's sources (``train_lm.stdlib_corpus``). DASH goes in
as ``Trainer(optimizers=(optimizer, scheduler))``, the one line that differs from AdamW; the
Trainer saves checkpoints (``optimizer.pt`` holds ``DASH.state_dict()``) and
``trainer.train(resume_from_checkpoint=...)`` continues a run bit for bit. The default learning
rates are the best of those tried for each optimizer at 60 steps (AdamW: 1e-3, 3e-3, 6e-3, 1e-2;
DASH: 3e-3, 1e-2).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: never reach the Hub
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    get_cosine_schedule_with_warmup,
)

import dash_fn
from examples.train_lm import add_dash_fields, stdlib_corpus

CONTEXT = 64


class ByteWindows(torch.utils.data.Dataset):
    """``count`` windows of ``CONTEXT`` bytes at fixed random offsets: causal-LM examples whose
    labels are their inputs (the model shifts them)."""

    def __init__(self, data: torch.Tensor, count: int, seed: int):
        self.data = data
        gen = torch.Generator().manual_seed(seed)
        self.starts = torch.randint(0, len(data) - CONTEXT, (count,), generator=gen).tolist()

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        tokens = self.data[self.starts[i] : self.starts[i] + CONTEXT]
        return {"input_ids": tokens, "labels": tokens}


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama of width 64 over byte tokens, randomly initialised from ``seed``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=172,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def optimizer_for(name: str, model: torch.nn.Module, lr: float, dash: dict | None = None) -> torch.optim.Optimizer:
    """DASH at its defaults (but for the DashConfig fields in ``dash``), or AdamW as the Trainer
    would build it; both decay only matrices."""
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": matrices, "weight_decay": 0.01}, {"params": vectors, "weight_decay": 0.0}]
    if name == "dash":
        return dash_fn.DASH(groups, lr=lr, **(dash or {}))
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def trainer_for(
    out: str, name: str, lr: float, steps: int, save_every: int, seed: int = 0, dash: dict | None = None
) -> Trainer:
    """A Trainer over a fresh model with the optimizer ``name`` and a cosine schedule."""
    train_bytes, val_bytes = stdlib_corpus(300_000)
    model = tiny_llama(seed)
    optimizer = optimizer_for(name, model, lr, dash)
    scheduler = get_cosine_schedule_with_warmup(
        optimizer, num_warmup_steps=max(1, steps // 10), num_training_steps=steps
    )
    args = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_every,
        report_to="none",
        use_cpu=True,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=ByteWindows(train_bytes, 16 * steps, seed),
        eval_dataset=ByteWindows(val_bytes, 64, seed + 1),
        optimizers=(optimizer, scheduler),
    )


def train_losses(trainer: Trainer) -> list[float]:
    """The training loss of every logged step."""
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--optimizer", choices=("dash", "adamw"), default="dash", help="the optimizer the Trainer steps"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="peak learning rate; None: 1e-2 for dash, 6e-3 for adamw"
    )
    parser.add_argument("--steps", type=int, default=60, help="training steps")
    parser.add_argument("--out", default="runs/hf_trainer", help="the Trainer's output_dir (checkpoints)")
    parser.add_argument(
        "--no-resume", action="store_true", help="skip the second run resumed from the middle checkpoint"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the model's initial weights and the data order")
    add_dash_fields(parser, "of the DASH run")
    args = parser.parse_args(argv)
    dash = dict(args.dash)
    lr = args.lr if args.lr is not None else {"dash": 1e-2, "adamw": 6e-3}[args.optimizer]
    half = max(1, args.steps // 2)
    trainer = trainer_for(args.out, args.optimizer, lr, args.steps, save_every=half, seed=args.seed, dash=dash)
    trainer.train()
    result = {"train_loss": train_losses(trainer), "eval_loss": trainer.evaluate()["eval_loss"], "model": trainer.model}
    print(
        f"{args.optimizer}@{lr:g}: final train loss {result['train_loss'][-1]:.4f}, eval loss {result['eval_loss']:.4f}"
    )
    if not args.no_resume:  # a new process would do the same: a fresh model and optimizer, then the checkpoint
        resumed = trainer_for(args.out, args.optimizer, lr, args.steps, save_every=half, seed=args.seed, dash=dash)
        resumed.train(resume_from_checkpoint=os.path.join(args.out, f"checkpoint-{half}"))
        same = all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), resumed.model.parameters()))
        print(f"resumed from checkpoint-{half}: final parameters {'identical' if same else 'DIFFER'}")
        result.update(
            resumed_model=resumed.model,
            resumed_train_loss=train_losses(resumed),
            resumed_step=resumed.state.global_step,
        )
    return result


if __name__ == "__main__":
    main()
