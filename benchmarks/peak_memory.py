"""Peak bytes of the tensors a call allocates and holds at once, counted op by op (any device).

    with PeakMemory() as mem:
        fn()
    mem.peak  # bytes above what was alive before the call

A TorchDispatchMode sees every tensor an operator returns; a storage it has not seen is new,
counted until it is freed (a weakref finalizer subtracts it). Exact and repeatable, unlike a
resident-set high-water mark: it counts what the code holds, not what the allocator keeps.
Eager only (inside torch.compile the generated kernels allocate without dispatch).
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakMemory(TorchDispatchMode):
    """Tracks the live bytes of storages allocated inside the ``with`` block and their peak."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            x.untyped_storage().data_ptr() for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)
        }
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor):
                storage = x.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen and key not in inputs and storage.nbytes():  # not a view, not in place
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._release, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out
