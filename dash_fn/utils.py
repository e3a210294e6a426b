"""Utilities beside the optimizer: what a training script may need around it, not to train.

- ``retain_freed_cpu_memory``: glibc keeps freed memory for reuse (CPU training).
- ``atomic_save``: ``torch.save`` that a crash cannot leave half-written.
- ``mark_static``: the state's tensors marked as static addresses (CUDA graphs).
- ``start_vectors``: the deterministic power-iteration start vectors of a block size.
"""

from .checkpoint import atomic_save
from .cpu_memory import retain_freed_cpu_memory
from .roots import start_vectors
from .state import mark_static

__all__ = ["retain_freed_cpu_memory", "atomic_save", "mark_static", "start_vectors"]
