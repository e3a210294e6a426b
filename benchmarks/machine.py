"""One line that says which machine a benchmark ran on, for its report."""

from __future__ import annotations

import os
import platform

import torch

# the widest vector extension a CPU reports, which sets its matmul kernels' speed: a VM that
# reports no AVX-512 BF16 runs bfloat16 products many times slower than float32 ones
VECTOR_EXTENSIONS = [("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")]


def machine_line(device: torch.device | None = None) -> str:
    """The CPU model, its widest vector extension and count (or the CUDA device), torch, its
    threads and Python."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        flags = set(next(line.split(":", 1)[1].split() for line in info if line.startswith("flags")))
        cpu += next((f", {name}" for flag, name in VECTOR_EXTENSIONS if flag in flags), "")
    except (OSError, StopIteration):
        pass
    where = (
        torch.cuda.get_device_name(device)
        if device is not None and device.type == "cuda"
        else f"{os.cpu_count()} CPUs ({cpu})"
    )
    return f"{where}, torch {torch.__version__}, {torch.get_num_threads()} threads, Python {platform.python_version()}"
