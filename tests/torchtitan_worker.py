"""One rank of tests/test_torchtitan.py, started by torchrun: runs examples/torchtitan_dash.py's
``main`` with the given arguments and saves what it returns to ``OUT_rank<r>.pt``.

    torchrun --standalone --nproc-per-node 4 tests/torchtitan_worker.py OUT --dp-shard 2 --tp 2
"""

import sys

import torch
import torch.distributed as dist

from examples import torchtitan_dash

if __name__ == "__main__":
    out = sys.argv[1]
    run = torchtitan_dash.main(sys.argv[2:])
    run["placements"] = {name: [repr(p) for p in placements] for name, placements in run["placements"].items()}
    torch.save(run, f"{out}_rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
