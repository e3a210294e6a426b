"""One line that says which machine a benchmark ran on, for its report."""

from __future__ import annotations

import os
import platform

import torch


def machine_line(device: torch.device | None = None) -> str:
    """The CPU model and count (or the CUDA device), torch, its threads and Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    where = (
        torch.cuda.get_device_name(device)
        if device is not None and device.type == "cuda"
        else f"{os.cpu_count()} CPUs ({cpu})"
    )
    return f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, Python {platform.python_version()}"
