"""The size of the compiled step at the DASH paper's 953M layer (block 1024), where compile time is spent.

A GPU run that has minutes cannot afford a refresh cut into blocks of one: each chunk is one
more unrolled copy of the solver in the graph (benchmarks/graph_size.py traces it).
"""

from __future__ import annotations

import pytest

import dash_fn.roots as roots
from benchmarks.graph_size import one_solve_ops, traced_ops


@pytest.mark.parametrize(
    "schedule, refresh, solves",
    [
        ("staggered", None, 2),  # each of the two factor stacks (98 blocks of 1024, 6 of 512) its slice in one chunk
        ("periodic", True, 6),  # 98 blocks of 4 MiB in 1 GiB of NDB temporaries: 5 chunks, and the 512 stack
    ],
)
def test_the_953m_layer_refresh_holds_few_solver_copies(schedule, refresh, solves):
    """The graph holds about ``solves`` copies of the solver (a chunk is a copy), not one per
    block (a staggered slice of 10 blocks cut into chunks of one was 10 copies a stack)."""
    assert roots.SMALL_WORKSPACE == 2**30  # the package's floor (no other test left its own behind)
    ops, products = traced_ops(schedule, refresh)
    per_solve = one_solve_ops()
    assert (solves - 1) * per_solve < ops < (solves + 1) * per_solve, (ops, per_solve)
    assert products < 80 * solves, products


def test_chunks_follow_memory_beyond_the_floor():
    """The floor lifts only small stacks: 1568 blocks of 4 MiB (the whole 953M model's refresh)
    are still cut so that NDB's temporaries stay within one stack."""
    block = 1024 * 1024 * 4
    assert roots.chunk_blocks(10, block, "ndb") == 10  # a staggered slice: whole
    assert roots.chunk_blocks(98, block, "ndb") == roots.SMALL_WORKSPACE // (roots.SOLVERS["ndb"].workspace * block)
    chunk = roots.chunk_blocks(1568, block, "ndb")
    assert chunk * roots.SOLVERS["ndb"].workspace <= 1568 and 1568 // chunk <= 13
