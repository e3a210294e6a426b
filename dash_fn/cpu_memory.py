"""``retain_freed_cpu_memory``: stop glibc from handing freed tensor memory back to the OS.

A PyTorch CPU step allocates its temporaries with glibc's ``malloc``, which gives a freed
block back to the kernel when it was mapped on its own (blocks above the mmap threshold) or
when the free space at the top of the heap exceeds the trim threshold; the next step's
allocations then take a page fault, and the zeroing of a fresh page, for every 4 KiB they
touch: tens of thousands of faults per step for an eager step of a few large layers
(``benchmarks/plain_step.py`` reports the faults per step and the time they cost, RESULTS the
figures). PyTorch's own CPU tuning guide
answers this with jemalloc or tcmalloc; this is the same remedy for glibc, from Python,
without a preload: the process keeps the memory it freed (its resident size stays at its
peak, as with a GPU caching allocator) and reuses it.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# the largest mmap threshold glibc accepts on 64-bit systems (HEAP_MAX_SIZE / 2): blocks
# above it are still mapped and unmapped on each use
MMAP_THRESHOLD_MAX = 32 * 2**20
NEVER_TRIM = 2**31 - 1  # mallopt takes a C int


def retain_freed_cpu_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of returning it to the OS; process-wide.

    Sets the trim threshold to 2 GiB and the mmap threshold to 32 MiB (glibc's largest), so
    that tensors up to 32 MiB come from the heap and the heap does not shrink between steps.
    Call it once, early, in a training process on the CPU. The cost: the process's resident
    memory stays at its peak.

    Returns:
        True when the settings took effect; False where the C library is not glibc (musl,
        macOS, Windows), where nothing is changed.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    # mallopt returns 1 on success; setting either fixes both (no dynamic adjustment)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
