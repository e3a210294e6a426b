"""DashConfig validation: each bad value raises ValueError naming the field and the range."""

import dataclasses
import math

import pytest
import torch

import dash_fn

BAD = [
    ("preconditioner", "soap"),
    ("qr_steps", 0),
    ("qr_steps", 1.0),
    ("block_size", 0),
    ("block_size", 2.5),
    ("block_size", True),
    ("newton_steps", 0),
    ("inv_root_freq", 0),
    ("inv_root_warmup", -1),
    ("inv_root_warmup", 2.5),
    ("start_prec_step", 0),
    ("start_prec_step", 1.5),
    ("start_prec_step", -math.inf),
    ("cheb_degree", 1),
    ("pi_steps", 0),
    ("pim_vectors", 0),
    ("scaling_seed", -1),
    ("solver", "svd"),
    ("refresh_schedule", "sometimes"),
    ("scaling", "spectral"),
    ("eigh_heuristic", "clip"),
    ("eps_rel", -1e-3),
    ("eps_rel", 1.0),
    ("root_order", 0),
    ("root_order", 2.0),
    ("graft_rms", 0.0),
    ("graft_rms", math.inf),
    ("nesterov_G", 1),
    ("grafting", "sgd"),
    ("one_dim", "sgd"),
    ("precision", "float64"),
    ("precision", "int8"),
    ("scaling_dtype", "bfloat16"),
    ("eps", -1e-3),
    ("eps", math.nan),
    ("eps", math.inf),
    ("cn_tol", 0.0),
    ("cheb_eps", 0.0),
    ("scaling_const", -2.0),
    ("eps_graft", 0.0),
    ("adamw_eps", 0.0),
    ("beta_G", 1.0),
    ("beta_graft", -0.1),
    ("adamw_beta1", 1.0),
    ("adamw_beta2", 1.5),
    ("beta_LR", 1.01),
    ("mu", 1.0),
    ("weight_decay", -0.1),
    ("weight_decay_1d", "0.1"),
    ("cn_masking", 1),
    ("bias_correction", "yes"),
    ("nesterov", "yes"),
    ("eps_power_iter", -1e-6),
    ("ndb_tol", 0.0),
    ("ndb_masking", "no"),
    ("comm_dtype", "float16"),
    ("beta_LR", -0.1),
    ("weight_decay_1d", -0.5),
    ("fsdp_blocks", "rows"),
    ("skip_nonfinite", 0),
    ("thin_ratio", 1.0),
    ("thin_ratio", 0.5),
    ("thin_ratio", "4"),
    ("thin_ratio", math.nan),
    ("factor_dtype", "float64"),
    ("root_dtype", "bf16"),
    ("grad_ema_dtype", torch.bfloat16),
    ("graft_dtype", "half"),
]
# values at the edge of each range that must be accepted
BOUNDARY = [
    ("beta_LR", 1.0),
    ("beta_LR", 0.0),
    ("beta_G", 0.0),
    ("mu", 0.0),
    ("start_prec_step", math.inf),
    ("eps", 0.0),
    ("weight_decay_1d", None),
    ("nesterov", None),
    ("weight_decay_1d", 0.0),
    ("block_size", 1),
    ("newton_steps", 1),
    ("cheb_degree", 2),
    ("comm_dtype", "bfloat16"),
    ("comm_dtype", None),
    ("scaling_dtype", "float64"),
    ("eps_power_iter", 0.0),
    ("thin_ratio", math.inf),
    ("thin_ratio", 1.001),
    ("root_dtype", "bfloat16"),
    ("factor_dtype", "float16"),
    ("grad_ema_dtype", "float32"),
    ("graft_dtype", None),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_invalid_value_names_field(field, value):
    with pytest.raises(ValueError, match=f"DashConfig.{field} must be"):
        dash_fn.DashConfig(**{field: value})


def test_defaults_follow_the_spec():
    c = dash_fn.DashConfig()
    assert (c.block_size, c.solver, c.scaling, c.newton_steps, c.inv_root_freq, c.start_prec_step) == (
        256,
        "auto",
        "pim",
        10,
        10,
        1,
    )
    assert (c.weight_decay, c.weight_decay_1d, c.vector_decay) == (0.0, None, 0.0)
    assert (
        c.replace(weight_decay=0.1).vector_decay == 0.1
        and c.replace(weight_decay=0.1, weight_decay_1d=0.0).vector_decay == 0.0
    )
    # the scaling study's exponent, floor and look-ahead (docs/ALGORITHM.md 9)
    assert (c.resolved_root_order, c.eps_rel, c.nesterov_G) == (3, 1e-5, True)
    # NDB composes square roots: unset, its order is Shampoo's 4, also when the solver is replaced
    assert dash_fn.DashConfig(solver="ndb").resolved_root_order == c.replace(solver="ndb").resolved_root_order == 4
    assert dash_fn.DashConfig(solver="cn").resolved_root_order == 3
    tuned = dash_fn.DashConfig.tuned(block_size=128)
    assert tuned == c.replace(inv_root_freq=3, block_size=128)
    paper = dash_fn.DashConfig.paper()
    assert (paper.root_order, paper.eps_rel, paper.nesterov_G) == (4, 0.0, False)
    assert (paper.solver, paper.scaling, paper.inv_root_freq, paper.eps, paper.one_dim, paper.block_size) == (
        "ndb",
        "pim",
        1,
        0.0,
        "shampoo",
        1024,
    )
    assert (c.eps, c.beta_G, c.beta_LR, c.beta_graft, c.eps_graft, c.mu, c.one_dim) == (
        1e-10,
        0.9,
        0.95,
        0.95,
        1e-8,
        0.0,
        "adamw",
    )


def test_never_precondition_and_replace():
    c = dash_fn.DashConfig(start_prec_step=math.inf)
    assert c.replace(block_size=8).block_size == 8
    with pytest.raises(ValueError, match="DashConfig.block_size"):
        c.replace(block_size=-8)


def test_frozen_and_hashable():
    c = dash_fn.DashConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.block_size = 3
    assert hash(c) == hash(dash_fn.DashConfig())


def test_every_field_has_a_bad_value_case():
    """Generated from dataclasses.fields: a field added without a validation case fails here."""
    import dataclasses

    covered = {field for field, _ in BAD}
    missing = [f.name for f in dataclasses.fields(dash_fn.DashConfig) if f.name not in covered]
    assert not missing, f"DashConfig fields without a bad-value case in BAD: {missing}"


@pytest.mark.parametrize("field, value", BOUNDARY, ids=[f"{f}={v!r}" for f, v in BOUNDARY])
def test_boundary_values_are_accepted(field, value):
    assert getattr(dash_fn.DashConfig(**{field: value}), field) == value


@pytest.mark.parametrize("nesterov", [True, False])
def test_nesterov_without_momentum_is_refused(nesterov):
    """``nesterov`` chooses the form of mu's momentum: with mu = 0 it would change nothing, so
    setting it is refused in a message that names mu and nesterov_G (Muon's Nesterov)."""
    with pytest.raises(ValueError, match=r"nesterov=\w+ chooses the form of .* mu, which is 0.*mu > 0.*nesterov_G"):
        dash_fn.DashConfig(nesterov=nesterov)
    assert dash_fn.DashConfig(nesterov=nesterov, mu=0.9).nesterov is nesterov


def test_unset_nesterov_is_nesterovs_momentum_wherever_mu_is_set():
    """None (the default) steps as nesterov=True does where mu > 0, bitwise, and not as False."""
    params = {"w": torch.randn(12, 8, generator=torch.Generator().manual_seed(0))}

    def run(**fields):
        config = dash_fn.DashConfig(block_size=8, solver="eigh", mu=0.9, **fields)
        values, state = dict(params), dash_fn.init(params, config)
        for t in range(3):
            grads = {"w": torch.randn(12, 8, generator=torch.Generator().manual_seed(t + 1))}
            values, state = dash_fn.step(values, grads, state, lr=0.1)
        return values["w"]

    unset = run()
    assert torch.equal(unset, run(nesterov=True)) and not torch.equal(unset, run(nesterov=False))


@pytest.mark.parametrize(
    "name, equivalent",
    [("betas", "beta_G"), ("momentum", "mu"), ("max_preconditioner_dim", "block_size=")],
)
def test_another_optimizers_keyword_gets_dashs_equivalent(name, equivalent):
    """DashConfig answers a keyword ported from AdamW, Muon or Distributed Shampoo as the adapter
    does: one short line naming DASH's equivalent, not the dataclass's error."""
    with pytest.raises(TypeError) as error:
        dash_fn.DashConfig(**{name: 0.9})
    message = str(error.value)
    assert message.startswith(f"DashConfig got {name}=, which is ") and equivalent in message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("where", ["DashConfig", "DASH"])
def test_a_misspelt_field_gets_did_you_mean_in_one_short_line(where):
    make = dash_fn.DashConfig if where == "DashConfig" else lambda **kw: dash_fn.DASH([torch.zeros(2, 2)], **kw)
    with pytest.raises(TypeError) as error:
        make(blok_size=128)
    assert str(error.value) == f"{where} got unknown option 'blok_size'; did you mean 'block_size'?"
    with pytest.raises(TypeError) as error:  # nothing near: where the fields are described
        make(zzz=1)
    message = str(error.value)
    assert message.startswith(f"{where} got unknown option 'zzz'; ") and "help(" in message
    assert len(message) < 200
