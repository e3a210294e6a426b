"""pytest-benchmark suite for the peers table (the table itself: peers.py).

    pytest benchmarks/test_bench_peers.py --benchmark-enable

The cases of peers.py at a small size (3 x Linear(128, 128) with bias, block 64, warmed up past
the start of preconditioning): for every row that refreshes, one case at frequency 1 (every
timed step refreshes) and one at frequency 10, timed one step a round over 10 rounds, so
that its mean is the amortised "freq 10, mean" column and its median the plain step; rows
without a refresh (Muon, AdamW) have one case. Peers that are not installed (HeavyBall,
pytorch_optimizer: the bench extra; Meta's Distributed Shampoo: a git checkout) are skipped.
"""

import argparse

import pytest

from benchmarks.peers import PEERS, Instance, available, make_model

D_MODEL, BLOCK, START = 128, 64, 10
ARGS = argparse.Namespace(block_size=BLOCK, start=START)
ROUNDS = 10

CASES = [
    pytest.param(
        peer.key,
        freq,
        id=f"{peer.key}-freq{freq}" if freq else peer.key,
        marks=[pytest.mark.inductor] if peer.key == "dash-compiled" else [],
    )
    for peer in PEERS
    for freq in ((1, 10) if peer.refreshes else (None,))
]


@pytest.fixture(scope="module")
def model():
    return make_model(D_MODEL)


@pytest.mark.parametrize("key, freq", CASES)
def test_step(benchmark, model, key, freq):
    peer = next(p for p in PEERS if p.key == key)
    why = available(peer)
    if why is not None:
        pytest.skip(why)
    params, grads = model
    inst = Instance(peer.build, params, grads, freq, ARGS)
    for _ in range(START + 2 * 10 + 1):  # past the start of preconditioning; compiles, first roots
        inst.step_seconds()
    benchmark.pedantic(inst.step_seconds, rounds=ROUNDS, iterations=1)
