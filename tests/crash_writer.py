"""Saves checkpoints to one path in a loop, for tests/test_crash_safe.py to kill (SIGKILL) mid-write.

``python crash_writer.py PATH KIND``: KIND ``state`` writes dash_fn.save_state; ``adapter``
writes dash_fn.utils.atomic_save of {"step": k, "opt": DASH.state_dict()}. Each save k fills the
state with the value k, so a reader can tell a whole file from a mixed one; after each save
the writer prints k and flushes.
"""

import sys

import torch

import dash_fn

path, kind = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
params = {"w": torch.zeros(512, 512), "b": torch.zeros(512)}  # ~6 MB of state: saves take a while
if kind == "state":
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=256, solver="eigh"))
else:
    model = {k: torch.nn.Parameter(v) for k, v in params.items()}
    opt = dash_fn.DASH(model.values(), lr=0.0, block_size=256, solver="eigh")
    for p in model.values():
        p.grad = torch.zeros_like(p)
    opt.step()
    state = opt.state[model["w"]]["dash"]
for k in range(1, 10_000):
    for _, x in state.exclude("config", "plan", "shard").items(include_nested=True, leaves_only=True):
        x.fill_(k)
    if kind == "state":
        dash_fn.save_state(path, state)
    else:
        dash_fn.utils.atomic_save({"step": k, "opt": opt.state_dict()}, path)
    print(k, flush=True)
