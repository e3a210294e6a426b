"""The compiled training step: loss, gradients and the DASH update in one torch.compile'd function.

    python examples/compiled_step.py [--steps 40] [--solver eigh] [--backend inductor]

``torch.func.grad_and_value`` computes loss and gradients of a functional model; ``dash_fn.step``
applies the update; the whole train step compiles with ``fullgraph=True``. The learning rate
changes every step (warm-up then cosine) and is passed as a 0-d tensor, so it never recompiles.
Roots refresh every ``--inv-root-freq`` steps, by a flag from the host's step count: two
graphs, a plain step and a refresh step, with no data-dependent control flow, so on CUDA the
step runs under CUDA graphs (``mode="reduce-overhead"``). ``--deterministic`` (the
default) turns on ``torch.use_deterministic_algorithms``: without it Inductor's CPU code sums the
embedding gradient with atomic adds from several threads, and runs differ in the last bits
(benchmarks/RESULTS.md, "Reproducibility").
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time

import torch

import dash_fn

if __package__:  # imported as examples.compiled_step (or `python -m`): the sibling from the package
    from examples.llama import Llama, LlamaConfig, next_byte_loss
else:  # `python examples/compiled_step.py`: the script's folder is first on the import path
    from llama import Llama, LlamaConfig, next_byte_loss


def make_train_step(model: Llama, config: dash_fn.DashConfig, **compile_kwargs):
    """A compiled ``(params, state, tokens, lr, t) -> (params, state, loss)``.

    ``t`` is the host-side number of the step being taken, passed on as
    ``refresh=is_refresh_step(config, t)`` (a static branch: one graph per value). The new
    parameters are copied into the ones passed in, which stay the step's fixed input buffers:
    under CUDA graphs (``mode="reduce-overhead"``) a replay overwrites the previous replay's
    outputs, so they must not be fed back as the next call's inputs.
    """

    def train_step(params, state, tokens, lr, refresh):
        grads, loss = torch.func.grad_and_value(lambda p: next_byte_loss(model, p, tokens))(params)
        params, state = dash_fn.step(params, grads, state, lr=lr, refresh=refresh)
        return params, state, loss

    compiled = torch.compile(train_step, fullgraph=True, **compile_kwargs)

    cuda_graphs = compile_kwargs.get("mode") == "reduce-overhead"

    def run(params, state, tokens, lr, t: int):
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        new, state, loss = compiled(params, state, tokens, lr, dash_fn.is_refresh_step(config, t))
        for name, p in params.items():
            p.copy_(new[name])
        return params, state, loss.clone()

    return run


def lr_at(t: int, steps: int, peak: float, warmup: int, final: float = 0.1) -> float:
    """Linear warm-up to ``peak``, then cosine decay to ``final`` times it at step ``steps``."""
    if t <= warmup:
        return peak * t / warmup
    progress = (t - warmup) / max(1, steps - warmup)
    return peak * (final + (1 - final) / 2 * (1 + math.cos(math.pi * progress)))


@contextlib.contextmanager
def deterministic_flag_restored():
    """Leave torch's process-wide deterministic-algorithms flag as found (--deterministic sets it)."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def main(argv: list[str] | None = None) -> None:
    with deterministic_flag_restored():
        _main(argv)


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument(
        "--solver",
        default="auto",
        help="root solver (auto: eigh on the CPU, coupled Newton on a GPU: eigh cannot run under CUDA graphs)",
    )
    parser.add_argument("--block-size", type=int, default=128, help="DASH block size")
    parser.add_argument("--inv-root-freq", type=int, default=5, help="steps between inverse-root refreshes")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (warm-up, then cosine decay)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--d-model", type=int, default=128, help="model width")
    parser.add_argument(
        "--deterministic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch.use_deterministic_algorithms (no measurable cost on CPU)",
    )
    args = parser.parse_args(argv)
    if args.deterministic:  # warn_only off the CPU: there it is untested (no GPU was available)
        if args.device.startswith("cuda"):
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=args.device != "cpu")
    device = torch.device(args.device)
    compile_kwargs = {"backend": args.backend}
    if device.type == "cuda" and args.backend == "inductor":
        compile_kwargs["mode"] = "reduce-overhead"  # CUDA graphs

    torch.manual_seed(0)
    model = Llama(LlamaConfig(d_model=args.d_model, n_layers=2, mlp_hidden=(8 * args.d_model) // 3, context=64)).to(
        device
    )
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    for p in params.values():  # fixed buffers: CUDA graphs read them in place (make_train_step)
        torch._dynamo.mark_static_address(p, guard=False)
    config = dash_fn.DashConfig(block_size=args.block_size, solver=args.solver, inv_root_freq=args.inv_root_freq)
    state = dash_fn.init(params, config)
    train_step = make_train_step(model, config, **compile_kwargs)
    data = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0)).to(device)
    data = torch.cat([data, data])  # a repeating sequence: learnable, so the loss must fall
    lr = torch.tensor(0.0, device=device)
    for t in range(1, args.steps + 1):
        starts = torch.randint(0, 4096, (16,), generator=torch.Generator().manual_seed(t))
        tokens = torch.stack([data[s : s + 65] for s in starts.tolist()])
        lr.fill_(lr_at(t, args.steps, args.lr, warmup=5))
        start = time.perf_counter()
        params, state, loss = train_step(params, state, tokens, lr, t)
        if t == 1 or t % 10 == 0 or t == args.steps:
            print(
                f"step {t:4d}  loss {float(loss):.4f}  lr {float(lr):.2e}  "
                f"{1e3 * (time.perf_counter() - start):8.1f} ms"
            )
    print(f"graphs compiled: {torch._dynamo.utils.counters['stats']['unique_graphs']}")


if __name__ == "__main__":
    main()
