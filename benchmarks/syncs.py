"""Counting host syncs: the ops through which a step would wait for its device.

On a GPU these read a device value on the host (``item``, ``bool``, ``nonzero``'s output
size, ``equal``, a linear-algebra error check); on the CPU they cost nothing but run all the
same, so counting them in a CPU run under the accelerator strategy shows what a GPU run waits on.
"""

from __future__ import annotations

import operator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
# _linalg_eigh's kernel checks LAPACK's or cuSOLVER's error flags on the host
# (_linalg_check_errors), a call this mode cannot see from outside the kernel
SYNC_OPS = (
    aten._local_scalar_dense,
    aten.nonzero,
    aten.is_nonzero,
    aten.equal,
    aten._linalg_check_errors,
    aten._linalg_eigh,
)
# graph nodes that read a device value on the host or branch on one
SYNC_NODES = (
    "_local_scalar_dense",
    "nonzero",
    "is_nonzero",
    "equal",
    "_linalg_check_errors",
    "_linalg_eigh",
    "cond",
    "item",
)


class SyncCounter(TorchDispatchMode):
    """Records every op of SYNC_OPS dispatched while active (``.syncs``: their names)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in SYNC_OPS:
            self.syncs.append(str(func))
        return func(*args, **(kwargs or {}))


def sync_nodes(gm: torch.fx.GraphModule) -> list[str]:
    """The nodes of an FX graph (and its subgraphs) that would sync or branch on device data."""
    found = []
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                if (
                    node.op == "call_function"
                    and node.target is not operator.getitem  # a tuple output's part ("item" is in its name)
                    and any(name in str(node.target) for name in SYNC_NODES)
                ):
                    found.append(str(node.target))
    return found


def cuda_graph_skip_reasons(gm: torch.fx.GraphModule, example_inputs) -> list[str]:
    """Why Inductor would not capture this inference graph in a CUDA graph, by its own checks
    (torch/_inductor/cudagraph_utils.py and output_code.py), less the device check that a CPU
    graph fails by nature: inputs mutated that are not static addresses, input storage
    rebound (``set_``), non-tensor inputs, and data-dependent control flow."""
    from torch._inductor import cudagraph_utils

    context = torch._guards.TracingContext.try_get()
    static = list(context.fw_metadata.static_input_indices) if context and context.fw_metadata else []
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    mutated = [
        node
        for node in gm.graph.nodes
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders
    ]
    rebound = [node for node in gm.graph.nodes if node.op == "call_function" and "aten.set_" in str(node.target)]
    reasons = [
        cudagraph_utils.check_for_mutation_ignore_cuda_graph_managed_tensor(
            gm, {node.args[0].name for node in mutated}, {placeholders.index(node.args[0]) for node in mutated}, static
        ),
        # Inductor's own check of this (2.13 on) is not in torch 2.11: the same test, by hand
        "input storage rebound (set_)" if any(node.args[0] in placeholders for node in rebound) else None,
    ]
    if not all(isinstance(x, (torch.Tensor, torch.SymInt, torch.Generator)) for x in example_inputs):
        reasons.append("non-Tensor inputs")
    reasons += [f"control flow or host read: {name}" for name in sync_nodes(gm)]
    return [reason for reason in reasons if reason]


def inspecting_backend(graphs: list):
    """A torch.compile backend (AOTAutograd, then the graph run as is, like aot_eager) that
    appends ``(graph, cuda_graph_skip_reasons)`` of every inference graph to ``graphs``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def compiler(gm, example_inputs):
        graphs.append((gm, cuda_graph_skip_reasons(gm, example_inputs)))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=compiler, keep_inference_input_mutations=True)


def assert_one_graph_without_syncs(config, params: dict, random_grads, steps: int = 9) -> None:
    """Under the simulated accelerator strategy: ``steps`` compiled steps make one graph with no
    node reading the device and nothing CUDA graphs would skip; the same steps eagerly make no
    sync after the first; compiled and eager agree. ``random_grads(params, t)`` gives step t's
    gradients (the tests pass theirs: this package imports nothing from tests/)."""
    import dash_fn
    from dash_fn.strategy import simulated_accelerator

    graphs: list = []
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    with simulated_accelerator():
        state, eager_params = dash_fn.init(params, config), params
        for t in range(1, steps + 1):
            params, state = compiled(params, random_grads(params, t), state, lr=torch.tensor(1e-2))
        eager_state, counter = dash_fn.init(eager_params, config), SyncCounter()
        for t in range(1, steps + 1):
            with counter if t > 1 else SyncCounter():
                eager_params, eager_state = dash_fn.step(
                    eager_params, random_grads(eager_params, t), eager_state, lr=torch.tensor(1e-2)
                )
    assert len(graphs) == 1
    assert graphs[0][1] == [], graphs[0][1][0][:2000]
    assert counter.syncs == []
    for k in params:
        assert torch.allclose(params[k], eager_params[k], rtol=1e-5, atol=1e-6), k
