"""How a call executes: one decision, taken once per call, that every branch of the step reads.

Three strategies, from the device, whether the call is being traced, and an override:

- ``CPU`` (eager on the CPU): reading a device value on the host costs nothing there, so the
  step may branch on its data (skip a non-finite step early, take the direct block norm, read
  the refresh schedule, skip the fallback's selection when every root is finite) and uses the
  CPU's own kernels (torch's fused Adam kernel, factor EMAs inside their products:
  :mod:`dash_fn.forms`; the threaded eigh op: :mod:`dash_fn.roots.eigh_cpu`).
- ``CPU_COMPILED`` (traced on the CPU): no host reads (a read would break the graph), the
  device forms everywhere, and the eigh refresh as one opaque op that runs the eager CPU form.
- ``ACCELERATOR`` (on CUDA or any other accelerator, eager or traced): no host reads at all,
  so a step never waits on the device and its graphs hold no data-dependent control flow:
  what CUDA graphs capture. No CPU-only op.

The accelerator strategy runs on CPU tensors too, so that its code is tested where no GPU
is: set ``DASH_FN_SIMULATE_ACCELERATOR=1`` in the environment, or use
:func:`simulated_accelerator` in-process. Under it the CPU also counts as a tensor-core device
(:func:`dash_fn.roots.matmul.has_tensor_cores`), but kernel facts stay facts of the torch build:
CPU torch has no 16-bit product with a float32 result, so "auto" stays float32 there unless a
test registers a stand-in for that op (tests/tensor_core_stand_in.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

import torch

SIMULATE_ENV = "DASH_FN_SIMULATE_ACCELERATOR"


@dataclasses.dataclass(frozen=True)
class Strategy:
    """What a call may do: ``host_reads``, read device values on the host and branch on them
    (free on the CPU, a sync elsewhere); ``cpu_ops``, use the CPU-only ops
    (:mod:`dash_fn.roots.eigh_cpu`)."""

    name: str
    host_reads: bool
    cpu_ops: bool

    def holds(self, flags: torch.Tensor) -> bool:
        """Whether every flag is known, without a sync, to hold: read on the host where that is
        free, else never known (the caller then takes the form that is right for any flags)."""
        return self.host_reads and bool(flags.all())

    def select(self, flags: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``torch.where(flags, new, old)``; ``new`` itself where every flag is known to hold
        (the same bits, one pass fewer)."""
        return new if self.holds(flags) else torch.where(flags, new, old)


CPU = Strategy("cpu", host_reads=True, cpu_ops=True)
CPU_COMPILED = Strategy("cpu-compiled", host_reads=False, cpu_ops=True)
ACCELERATOR = Strategy("accelerator", host_reads=False, cpu_ops=False)

# read once: a compiled step specializes on it (a module constant), an environment read would not
_simulate = os.environ.get(SIMULATE_ENV, "") not in ("", "0")


def simulating() -> bool:
    """Whether CPU tensors take the accelerator strategy (``DASH_FN_SIMULATE_ACCELERATOR``)."""
    return _simulate


@contextlib.contextmanager
def simulated_accelerator(enabled: bool = True):
    """Within the block, CPU tensors take the accelerator strategy (or, with ``enabled=False``,
    the CPU's even under ``DASH_FN_SIMULATE_ACCELERATOR=1``). A compiled function is compiled
    for the strategy it first ran under: call ``torch._dynamo.reset()`` between the two."""
    global _simulate
    previous, _simulate = _simulate, enabled
    try:
        yield
    finally:
        _simulate = previous


def for_device(device: torch.device) -> Strategy:
    """The strategy of a call whose tensors live on ``device``."""
    if device.type != "cpu" or _simulate:
        return ACCELERATOR
    return CPU_COMPILED if torch.compiler.is_compiling() else CPU
