"""tests/mutation_check.py stays runnable: every listed bug still applies to today's code."""

import os

import mutation_check


def test_every_mutation_applies_exactly_once():
    assert len(mutation_check.MUTATIONS) >= 20
    for mutation in mutation_check.MUTATIONS:
        with open(os.path.join(mutation_check.ROOT, mutation.path)) as f:
            assert f.read().count(mutation.old) == 1, mutation.name
        assert all(os.path.exists(os.path.join(mutation_check.ROOT, t)) for t in mutation.tests if t.endswith(".py")), (
            mutation.name
        )
