"""A writer killed (SIGKILL) mid-save leaves the previous checkpoint whole under its name."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import dash_fn
from dash_fn.state import CONSTANTS  # tables made on load from the config and plan, never saved

WRITER = os.path.join(os.path.dirname(__file__), "crash_writer.py")


def saved_value(path, kind) -> int:
    """The value k that every tensor of the checkpoint holds (asserting they all agree)."""
    if kind == "state":
        state = dash_fn.load_state(path)  # checks the CRC of every byte
        values = {
            float(x.reshape(-1)[0])
            for x in state.exclude("config", "plan", "shard", *CONSTANTS).items(include_nested=True, leaves_only=True)
            for x in [x[1]]
            if x.numel()
        }
        whole = all(
            bool((x == x.reshape(-1)[0]).all())
            for _, x in state.exclude("config", "plan", "shard", *CONSTANTS).items(
                include_nested=True, leaves_only=True
            )
            if x.numel()
        )
    else:
        blob = torch.load(path, weights_only=True)
        tensors = [x for entry in blob["opt"]["state"].values() for x in _leaves(entry)]
        values = {float(x.reshape(-1)[0]) for x in tensors if x.numel()} | {float(blob["step"])}
        whole = all(bool((x == x.reshape(-1)[0]).all()) for x in tensors if x.numel())
    assert whole and len(values) == 1, values
    return int(values.pop())


def _leaves(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)


@pytest.mark.parametrize("kind", ["state", "adapter"])
def test_sigkill_mid_save_leaves_the_previous_checkpoint(tmp_path, kind):
    rng = random.Random(0)
    path = tmp_path / "ckpt.pt"
    for _trial in range(5):  # 5 per kind: 10 kills in all (each a fresh process importing torch)
        writer = subprocess.Popen([sys.executable, WRITER, str(path), kind], stdout=subprocess.PIPE, text=True)
        first = writer.stdout.readline()  # at least one whole save before the kill
        assert first.strip(), "the writer saved nothing"
        time.sleep(rng.uniform(0.0, 0.3))  # lands mid-write of a later save most of the time
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        assert writer.returncode == -signal.SIGKILL
        assert saved_value(path, kind) >= 1
        leftovers = [name for name in os.listdir(tmp_path) if name != "ckpt.pt"]
        assert all(name.startswith("ckpt.pt.tmp-") for name in leftovers), leftovers
        for name in leftovers:
            os.remove(tmp_path / name)
