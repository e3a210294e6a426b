"""Which DashConfig fields a solver reads: ``dash_fn.preconditioners.fields_read`` is the one list,
and it is true. Every solver knob is changed in turn: a refresh under a solver that reads it
changes, a refresh under one that does not keeps its bits."""

from __future__ import annotations

import pytest
import torch

import dash_fn
from dash_fn.preconditioners import fields_read, unit_for
from dash_fn.roots import SOLVERS, start_vectors, uses_start_vectors
from dash_fn.roots.scaling import SCALINGS
from dash_fn.strategy import CPU

# each solver knob: (settings that let it matter, its other value); eigh's heuristics and its
# floor differ only on a singular factor (SINGULAR), every other knob is tried on a regular one
SINGULAR = {"eigh_heuristic", "eps_rel"}
KNOBS = {
    "eps": ({}, 1e-3),
    "eps_rel": ({}, 0.0),
    "eigh_heuristic": ({}, "relu"),
    "newton_steps": ({}, 3),
    "cn_tol": ({}, 1e-2),
    "cn_masking": ({"cn_tol": 1e-2}, False),
    "ndb_tol": ({"ndb_masking": True}, 1e-2),
    "ndb_masking": ({"ndb_tol": 1e-2}, True),
    "cheb_degree": ({}, 20),
    "cheb_eps": ({}, 1e-2),
    "qr_steps": ({}, 3),
    "scaling_const": ({}, 3.0),
    "pi_steps": ({}, 3),
    "pim_vectors": ({}, 4),
    "eps_power_iter": ({}, 1e-2),
    "scaling_dtype": ({}, "float64"),
    "scaling_seed": ({}, 5),
}


def _factors(eigenbases: bool, singular: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PSD factors of rank 5 (``singular``) or with every eigenvalue at least 0.1, and previous
    roots or bases."""
    g = torch.Generator().manual_seed(0)
    G = torch.randn(16, 8, 5, generator=g, dtype=torch.float64)
    F = (G @ G.mT + (0.0 if singular else 0.1) * torch.eye(8, dtype=torch.float64)).float()
    old = torch.linalg.qr(torch.randn(16, 8, 8, generator=g)).Q if eigenbases else torch.eye(8).expand(16, 8, 8)
    return F, old.contiguous()


def _refresh(config: dash_fn.DashConfig, singular: bool) -> torch.Tensor:
    unit = unit_for(config)
    solver = unit.solver(config, CPU)
    F, old = _factors(config.preconditioner == "eigenvalue_corrected", singular)
    start = start_vectors(8, config) if uses_start_vectors(config, solver) else None
    new, _ = unit.solve(F, old, 4, config, start, CPU, dash_fn.preconditioners.config_products(config, F.device), None)
    return new


CASES = [
    ("shampoo", solver, scaling) for solver in SOLVERS for scaling in SCALINGS if solver != "eigh" or scaling == "pim"
] + [("eigenvalue_corrected", solver, "pim") for solver in ("eigh", "qr")]


@pytest.mark.parametrize("preconditioner, solver, scaling", CASES)
def test_a_solver_reads_the_fields_it_lists_and_no_other(preconditioner, solver, scaling):
    base = dict(preconditioner=preconditioner, solver=solver, scaling=scaling, root_order=4, precision="float32")
    listed = fields_read(dash_fn.DashConfig(**base), solver)
    assert set(listed) <= {*KNOBS, "scaling"}
    wrong = []
    for field, (settings, other) in KNOBS.items():
        config = dash_fn.DashConfig(**base, **settings)
        singular = field in SINGULAR
        changed = not torch.equal(_refresh(config, singular), _refresh(config.replace(**{field: other}), singular))
        if changed != (field in listed):
            wrong.append(f"{field}: {'changes' if changed else 'does not change'} the refresh")
    assert not wrong, f"{preconditioner}/{solver}/{scaling} lists {listed}, but " + "; ".join(wrong)
