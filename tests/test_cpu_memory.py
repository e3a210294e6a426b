"""``retain_freed_cpu_memory``: after it, reallocating freed tensors takes no page faults.

Each case runs in its own process: the setting is process-wide and must not leak into the
test session. The process allocates eight 12 MB tensors at once and frees them, five times
over after four rounds of warm-up, and counts its minor page faults (memory the allocator took back from the OS)."""

import platform
import subprocess
import sys

import pytest

CHURN = """
import resource, sys, torch, dash_fn
if sys.argv[1] == "retain":
    assert dash_fn.retain_freed_cpu_memory()

def churn():
    tensors = [torch.ones(3_000_000) for _ in range(8)]  # written, so every page is touched
    del tensors

for _ in range(4):  # the heap settles within a few rounds
    churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    churn()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


def faults_per_churn(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def test_retained_memory_is_reused_without_page_faults():
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the setting is glibc's; elsewhere the function changes nothing and says so")
    default, retained = faults_per_churn("default"), faults_per_churn("retain")
    # 96 MB handed back and faulted in again is about 23,000 pages of 4 KiB each time
    assert default > 5000, f"the default allocator did not churn here ({default} faults); the test shows nothing"
    assert retained < 0.01 * default, f"{retained} page faults per churn with memory retained, {default} without"
