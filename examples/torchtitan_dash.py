"""DASH as torchtitan's optimizer: change the optimizer and nothing else.

    pip install 'dash_fn[torchtitan]'     # torchtitan 0.3.0, and triton, which it imports
    torchrun --nproc_per_node=4 -m examples.torchtitan_dash --dp-shard 2 --tp 2 --stop-at 3 --checkpoint-dir ckpt
    torchrun --nproc_per_node=4 -m examples.torchtitan_dash --dp-shard 2 --tp 2 --checkpoint-dir ckpt  # resumes
    torchrun --nproc_per_node=8 -m examples.torchtitan_dash --dp-shard 4 --tp 2 --steps 100  # GPUs, NCCL
    python -m examples.torchtitan_dash --optimizer adamw                 # one process, torchtitan's AdamW

torchtitan 0.3.0 builds its optimizers through ``OptimizersContainer``: a config of parameter
groups, each naming an optimizer that the container's ``_resolve_optimizer_factory`` looks up.
:class:`DashOptimizers` is that container with "DASH" added, so a torchtitan job switches with
one line of its config (``config.optimizer = dash_optimizer(lr=...)``); its LR scheduler, its
checkpoint manager and its parallel plan stay as they are. The container also reads
torchtitan's flat checkpoints back (:meth:`DashOptimizers.load_state_dict`): torchtitan
rebuilds optimizer state one parameter at a time, while a DASH group keeps the state of all
its parameters together (on the group's first parameter).

The script trains torchtitan's own Llama 3 debug model job (``llama3_debugmodel()``: 6.2M
parameters, its warm-up-stable-decay LR schedule and its DCP ``CheckpointManager``) laid out by
torchtitan's own plan (tensor parallel on the mesh's ``tp`` dim, FSDP2 on ``dp_shard``), on
bytes of Python's standard library: no tokenizer, no download. It builds those pieces as
torchtitan's ``Trainer.__init__`` does, but not the Trainer itself, whose tokenizer and dataset
come from a torchtitan checkout's test assets and which runs on CUDA only; in a checkout the
Trainer takes the same container (``config = llama3_debugmodel(); config.optimizer =
dash_optimizer(lr=3e-3)``). On the CPU (gloo) three things differ from a GPU run, none of them
DASH's: the attention is torchtitan's SDPA module (FlexAttention has no backward on the CPU;
with one document a sequence both are the same causal attention), parameters stay float32,
and FSDP2 reduces gradients by a plain sum (gloo lacks the pre-multiplied sum NCCL does).
A run with ``--checkpoint-dir`` resumes from the latest checkpoint there; on the same layout
it then equals an uninterrupted run bit for bit (tests/test_torchtitan.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchtitan.distributed.parallel_dims as titan_parallel_dims
import torchtitan.tools.utils as titan_utils
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torchtitan.components.optimizer import OptimizersContainer, default_adamw
from torchtitan.components.optimizer.optimizer import ParamGroupConfig
from torchtitan.components.optimizer.utils import init_optim_state, load_flat_optim_state_dict
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.utils import set_spmd_backend
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.llama3.config_registry import llama3_debugmodel

import dash_fn
from examples.train_lm import stdlib_corpus

# torchtitan's SPMD backend in which parameters are DTensors (the global shapes and placements
# DASH cuts its blocks from) and inputs plain tensors: its default, "spmd_types", holds
# tensor-parallel pieces as plain local tensors (and in 0.3.0 FSDP2 refused them on the CPU)
SPMD_BACKEND = "partial_dtensor"
IMPLEMENTATION_KEYS = ("fused", "foreach")  # the container adds them to every group; DASH has neither


def build_dash(param_groups: list[dict[str, Any]], **kwargs: Any) -> dash_fn.DASH:
    """``dash_fn.DASH`` over torchtitan's parameter groups (named, with DASH's keys)."""
    groups = [{k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS} for group in param_groups]
    return dash_fn.DASH(groups, **kwargs)


class DashOptimizers(OptimizersContainer):
    """torchtitan's ``OptimizersContainer`` that also builds ``optimizer_name="DASH"`` groups."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        """The container's config; ``build()`` makes a :class:`DashOptimizers`."""

    @staticmethod
    def _resolve_optimizer_factory(name: str):
        return build_dash if name == "DASH" else OptimizersContainer._resolve_optimizer_factory(name)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load torchtitan's flat state dict (``state.<fqn>.<key...>``, ``param_groups.<fqn>.<key>``).

        Other optimizers go through torchtitan's own loader. For DASH the per-parameter entries
        are rebuilt from every key under each parameter's name, since torchtitan's loader asks
        only for parameters that hold live state, which in DASH is a group's first one."""
        for optimizer in self.optimizers:
            init_optim_state(optimizer)
            if isinstance(optimizer, dash_fn.DASH):
                optimizer.load_state_dict(dash_state_dict(optimizer, state_dict))
            else:
                load_flat_optim_state_dict(optimizer, state_dict)


def dash_state_dict(optimizer: dash_fn.DASH, flat: dict[str, Any]) -> dict[str, Any]:
    """``DASH.load_state_dict``'s input from torchtitan's flat, name-keyed dict."""
    entries = state_by_name(flat, [name for group in optimizer.param_groups for name in group["param_names"]])
    state: dict[int, dict] = {}
    groups = []
    index = 0
    for group in optimizer.param_groups:
        names = group["param_names"]
        ids = list(range(index, index + len(names)))
        state.update({i: entries[name] for i, name in zip(ids, names)})
        keys = [key for key in group if key not in ("params", "param_names")]
        missing = [key for key in keys if f"param_groups.{names[0]}.{key}" not in flat]
        if missing:
            raise ValueError(
                f"torchtitan's checkpoint lacks param_groups.{names[0]}.{missing[0]} (saved by another optimizer?)"
            )
        saved = {key: flat[f"param_groups.{names[0]}.{key}"] for key in keys}
        groups.append({**saved, "params": ids, "param_names": names})
        index += len(names)
    return {"state": state, "param_groups": groups}


def state_by_name(flat: dict[str, Any], names: list[str]) -> dict[str, dict]:
    """Each parameter's keys ``state.<name>.<a>.<b>`` as nested dicts ``{a: {b: value}}``, in one
    pass over ``flat`` (names hold dots, so a key's name is its longest prefix that is one)."""
    out: dict[str, dict] = {name: {} for name in names}
    for key, value in flat.items():
        if not key.startswith("state."):
            continue
        rest = key[len("state.") :]
        dots = [i for i, c in enumerate(rest) if c == "."]
        name = next((rest[:i] for i in reversed(dots) if rest[:i] in out), None)
        if name is not None:
            *path, last = rest[len(name) + 1 :].split(".")
            node = out[name]
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
    return out


def dash_optimizer(lr: float, **dash_kwargs: Any) -> DashOptimizers.Config:
    """torchtitan's optimizer config for DASH on every parameter (``dash_kwargs``: DashConfig
    fields, e.g. ``block_size=128``); the value of ``Trainer.Config(optimizer=...)``."""
    group = ParamGroupConfig(pattern=".*", optimizer_name="DASH", optimizer_kwargs={"lr": lr, **dash_kwargs})
    return DashOptimizers.Config(param_groups=[group], implementation="for-loop")


class TrainState(Stateful):
    """The step, saved with the checkpoint (torchtitan's Trainer saves its own the same way)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": torch.tensor(self.step)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train (or resume); this rank's parameter pieces and placements by name, and the loss and
    learning rate of each step it took."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--dp-shard", type=int, default=1, help="FSDP2 degree (the mesh's dp_shard dim)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (the mesh's tp dim)")
    parser.add_argument("--steps", type=int, default=6, help="steps of the LR schedule and of the run")
    parser.add_argument("--stop-at", type=int, help="stop after this step (a checkpoint is written there)")
    parser.add_argument("--optimizer", choices=("dash", "adamw"), default="dash", help="DASH, or the job's AdamW")
    parser.add_argument("--lr", type=float, default=3e-3, help="the peak learning rate of the schedule")
    parser.add_argument("--block-size", type=int, default=256, help="DASH's block size")
    parser.add_argument("--batch", type=int, default=2, help="sequences a data-parallel rank reads each step")
    parser.add_argument("--seq-len", type=int, default=64, help="bytes a sequence predicts")
    parser.add_argument("--checkpoint-dir", help="save every --checkpoint-every steps and resume from the latest")
    parser.add_argument("--checkpoint-every", type=int, default=3, help="steps between checkpoints")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    if not cuda:  # torchtitan 0.3.0 picks "cuda" when it finds no accelerator
        titan_utils.device_type = titan_parallel_dims.device_type = "cpu"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "RANK" in os.environ:  # started by torchrun
            dist.init_process_group("nccl" if cuda else "gloo")
        else:
            dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if args.dp_shard * args.tp != world:
        raise SystemExit(f"--dp-shard {args.dp_shard} x --tp {args.tp} must be the world size, {world}")

    # torchtitan's own debug-model job, with DASH as its optimizer and this run's sizes
    config = llama3_debugmodel()
    if args.optimizer == "dash":
        config.optimizer = dash_optimizer(args.lr, block_size=args.block_size)
    else:  # the job's own AdamW, the one line a switch to DASH changes
        config.optimizer = default_adamw(lr=args.lr)
        config.optimizer.implementation = "fused" if cuda else "for-loop"
    config.training.local_batch_size, config.training.seq_len, config.training.steps = (
        args.batch,
        args.seq_len,
        args.steps,
    )
    if not cuda:
        config.training.mixed_precision_param = "float32"
        for layer in config.model_spec.model.layers:  # FlexAttention has no backward on the CPU:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()  # the same causal attention
    config.parallelism.data_parallel_shard_degree = args.dp_shard
    config.parallelism.tensor_parallel_degree = args.tp
    config.parallelism.spmd_backend = SPMD_BACKEND
    config.checkpoint.enable = args.checkpoint_dir is not None
    config.checkpoint.interval = args.checkpoint_every

    # what torchtitan's Trainer.__init__ does with it, minus tokenizer, data loader and metrics
    dims = ParallelDims.from_config(config.parallelism, world)
    dims.build_mesh()
    set_spmd_backend(config.parallelism.spmd_backend)
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = spec.model.build()
    spec.parallelize_fn(
        model,
        parallel_dims=dims,
        training=config.training,
        parallelism=config.parallelism,
        compile_config=config.compile,
        ac_config=None,
        dump_folder=tempfile.gettempdir(),
    )
    if not cuda:  # gloo has no PREMUL_SUM, FSDP2's reduce-scatter for torchtitan's gradient factor 1:
        for module in model.modules():  # a plain sum, the same gradients
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    optimizers = config.optimizer.build(model_parts=[model])
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=args.steps)
    train_state = TrainState()
    checkpoints = config.checkpoint.build(
        dataloader=None,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": train_state},
        sd_adapter=None,
        base_folder=args.checkpoint_dir or "",
    )
    checkpoints.load()

    corpus = stdlib_corpus(1 << 20)[0]  # byte values, all below the debug model's vocabulary of 2048
    dp_rank, batch_ranks = (
        (dims.get_mesh("batch").get_local_rank(), dims.get_mesh("batch").size()) if dims.dp_enabled else (0, 1)
    )
    last = min(args.steps, args.stop_at or args.steps)
    losses, lrs = {}, {}
    while train_state.step < last:
        train_state.step += 1
        tokens = tokens_at(corpus, train_state.step, dp_rank, args.batch, args.seq_len + 1).to(device)
        inputs = tokens[:, :-1]
        positions = torch.arange(args.seq_len, device=device).expand_as(inputs)  # one document a sequence
        masks = model.get_attention_masks(positions=positions) if cuda else None  # SDPA: causal, no mask
        logits = model(inputs, positions, masks)
        if isinstance(logits, DTensor):  # under tensor parallel, sharded over the vocabulary
            logits = logits.full_tensor()
        # torchtitan's FSDP2 sums gradients over data-parallel ranks, so each rank divides its
        # summed loss by the tokens of the global batch
        tokens_in_step = tokens[:, 1:].numel() * batch_ranks
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten(), reduction="sum") / tokens_in_step
        loss.backward()
        lrs[train_state.step] = optimizers.optimizers[0].param_groups[0]["lr"]
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        checkpoints.save(train_state.step, last_step=train_state.step == last)
        losses[train_state.step] = loss.item() * batch_ranks  # the mean over this rank's batch
        if dist.get_rank() == 0:
            print(f"step {train_state.step}: loss {losses[train_state.step]:.4f}, lr {lrs[train_state.step]:.2e}")
    checkpoints.close()
    params = dict(model.named_parameters())
    return {
        "params": {name: p.to_local().detach().clone() for name, p in params.items()},
        "placements": {name: tuple(p.placements) for name, p in params.items()},
        "losses": losses,
        "lrs": lrs,
    }


def tokens_at(corpus: torch.Tensor, step: int, dp_rank: int, batch: int, length: int) -> torch.Tensor:
    """Sequences of ``length`` bytes for one data-parallel rank at one step: a pure function of
    (step, dp rank), so a resumed run reads what the uninterrupted one read."""
    generator = torch.Generator().manual_seed(step * 1000 + dp_rank)
    starts = torch.randint(0, corpus.numel() - length, (batch,), generator=generator)
    return torch.stack([corpus[s : s + length] for s in starts.tolist()])


if __name__ == "__main__":
    main()
    dist.destroy_process_group()
