"""dash_fn.DASH, the torch.optim adapter: it equals the functional step bitwise, per group."""

import logging
import math
import re
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import dash_fn
from conftest import assert_equal_states, mixed_params, random_grads, tensors
from dash_fn.foreign import FOREIGN
from dash_fn.roots import SOLVERS

pytestmark = pytest.mark.accelerator  # also run under the simulated accelerator strategy (docs/CONTRIBUTING.md)

CONFIG = dict(block_size=16, solver="eigh", inv_root_freq=3)
# Every kind of parameter (blocks, strips and corners, a conv kernel, AdamW vectors), kept small.
SHAPES = {"square": (32, 32), "rect": (40, 21), "conv": (3, 4, 3, 3), "bias": (40,), "vec": (7,), "scalar": ()}


def model_values():
    return mixed_params(shapes=SHAPES)


def parameters():
    return {k: torch.nn.Parameter(v) for k, v in model_values().items()}


def set_grads(params, grads, skip=()):
    for k, p in params.items():
        p.grad = None if k in skip else grads[k].clone()


def values(params):
    return {k: p.detach().clone() for k, p in params.items()}


def state_of(opt, group=0):
    return opt.state[opt.param_groups[group]["params"][0]]["dash"]


def functional(params, config, lrs, names=None):
    """The functional run the adapter must reproduce: ``names`` picks the parameters and
    renames them by position, as the adapter names them within a group."""
    names = list(params) if names is None else names
    current = {str(i): params[k] for i, k in enumerate(names)}
    state = dash_fn.init(current, config)
    for t, lr in enumerate(lrs, 1):
        grads = random_grads(params, t)
        grads = {str(i): grads[k] for i, k in enumerate(names)}
        current, state = dash_fn.step(current, grads, state, lr=lr, refresh=dash_fn.is_refresh_step(config, t))
    return {k: current[str(i)] for i, k in enumerate(names)}, state


@pytest.mark.compat
@pytest.mark.parametrize("solver", [s for s in ("eigh", "ndb") if s in SOLVERS])  # without and with start vectors
def test_adapter_equals_functional_step_bitwise(solver):
    config = dict(CONFIG, solver=solver, mu=0.5, weight_decay=0.01)
    params = parameters()
    opt = dash_fn.DASH(params.values(), lr=0.01, **config)
    for t in range(1, 6):
        set_grads(params, random_grads(params, t))
        opt.step()
    want, want_state = functional(model_values(), dash_fn.DashConfig(**config), [0.01] * 5)
    for k in want:
        assert torch.equal(params[k].detach(), want[k]), k
    assert_equal_states(state_of(opt), want_state)


def test_param_groups_have_their_own_lr_and_weight_decay():
    params = parameters()
    matrices, vectors = ["square", "rect", "conv"], ["bias", "vec", "scalar"]
    opt = dash_fn.DASH(
        [
            {"params": [params[k] for k in matrices], "lr": 0.02, "weight_decay": 0.1},
            {"params": [params[k] for k in vectors], "weight_decay_1d": 0.05},
        ],
        lr=0.005,
        **CONFIG,
    )
    for t in range(1, 5):
        set_grads(params, random_grads(params, t))
        opt.step()
    base = dash_fn.DashConfig(**CONFIG)
    want_m, state_m = functional(model_values(), base.replace(weight_decay=0.1), [0.02] * 4, matrices)
    want_v, state_v = functional(model_values(), base.replace(weight_decay_1d=0.05), [0.005] * 4, vectors)
    for k, want in {**want_m, **want_v}.items():
        assert torch.equal(params[k].detach(), want), k
    assert_equal_states(state_of(opt, 0), state_m)
    assert_equal_states(state_of(opt, 1), state_v)
    assert state_of(opt, 0)["config"].weight_decay == 0.1 and state_of(opt, 1)["config"].weight_decay_1d == 0.05


@pytest.mark.compat
def test_scheduler_sets_the_lr_each_step_uses():
    params = parameters()
    opt = dash_fn.DASH(params.values(), lr=0.04, **CONFIG)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    used = []
    for t in range(1, 7):
        set_grads(params, random_grads(params, t))
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert used == pytest.approx([0.04, 0.04, 0.02, 0.02, 0.01, 0.01])
    want, _ = functional(model_values(), dash_fn.DashConfig(**CONFIG), used)
    for k in want:
        assert torch.equal(params[k].detach(), want[k]), k


def ownership(plan_params, config, name):
    """Which entries of each state tensor belong to parameter ``name``, found numerically: one
    step from a zero state with a gradient only for ``name`` makes exactly its entries nonzero."""
    grads = {k: torch.zeros_like(v) for k, v in plan_params.items()}
    grads[name] = random_grads(plan_params, 1)[name]
    refresh = dash_fn.is_refresh_step(config, 1)
    _, probe = dash_fn.step(plan_params, grads, dash_fn.init(plan_params, config), lr=0.01, refresh=refresh)
    owned = {}
    for key, x in tensors(probe).items():
        source = tensors(probe)[key[:-1] + ("F",)] if key[-1] == "Fbar" else x  # roots start at I
        if x.ndim:
            owned[key] = source.reshape(len(x), -1).ne(0).any(1).reshape((-1,) + (1,) * (x.ndim - 1))
    return owned


def test_grad_none_leaves_parameter_and_its_state_untouched():
    """The skipped parameters keep their values and their slices of every state tensor; all
    else equals a functional step with zero gradients for them (blocks never interact)."""
    config = dash_fn.DashConfig(**CONFIG, mu=0.5)
    params = parameters()
    opt = dash_fn.DASH(params.values(), lr=0.01, **CONFIG, mu=0.5)
    for t in range(1, 4):
        set_grads(params, random_grads(params, t))
        opt.step()
    skipped = {"rect": "1", "bias": "3"}  # several regions sharing stacks; an AdamW vector
    before, before_state = values(params), state_of(opt).clone()
    grads = random_grads(params, 4)
    set_grads(params, grads, skip=skipped)
    opt.step()
    named = {str(i): v for i, v in enumerate(before.values())}
    zero_filled = {str(i): torch.zeros_like(g) if k in skipped else g for i, (k, g) in enumerate(grads.items())}
    want, want_state = dash_fn.step(
        named, zero_filled, before_state.clone(), lr=0.01, refresh=dash_fn.is_refresh_step(config, 4)
    )
    for i, k in enumerate(params):
        assert torch.equal(params[k].detach(), before[k] if k in skipped else want[str(i)]), k
    owned = {}
    for index in skipped.values():
        for key, mask in ownership(named, config, index).items():
            owned[key] = owned.get(key, False) | mask
    got, old, new = tensors(state_of(opt)), tensors(before_state), tensors(want_state)
    assert int(owned["adamw", "m"].sum()) == 40  # the bias, within the flat AdamW buffers
    assert any(0 < int(mask.sum()) < len(mask) for key, mask in owned.items() if key[0] == "factors")  # shared stacks
    for key in got:
        expected = torch.where(owned[key], old[key], new[key]) if key in owned else new[key]
        assert torch.equal(got[key], expected), key


def test_group_without_grads_is_skipped_entirely():
    params = {k: p for k, p in parameters().items() if k in ("square", "bias", "rect")}
    opt = dash_fn.DASH(
        [{"params": [params["square"], params["bias"]]}, {"params": [params["rect"]]}], lr=0.01, **CONFIG
    )
    set_grads(params, random_grads(params, 1), skip={"rect"})
    opt.step()
    assert params["rect"] not in opt.state  # never stepped: no state yet, as in torch.optim
    set_grads(params, random_grads(params, 2))
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in params.values())
    before, before_state = values(params), state_of(opt, 0).clone()
    opt.step()
    assert all(torch.equal(params[k].detach(), before[k]) for k in params)
    assert_equal_states(state_of(opt, 0), before_state)
    assert int(state_of(opt, 0)["step"]) == 2 and int(state_of(opt, 1)["step"]) == 1


@pytest.mark.compat
def test_closure_is_evaluated_with_grad_and_its_loss_returned():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 20), torch.nn.Tanh(), torch.nn.Linear(20, 3))
    x, y = torch.randn(16, 30), torch.randn(16, 3)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    opt = dash_fn.DASH(model.parameters(), lr=0.01, **CONFIG)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with torch.no_grad():  # the closure still gets gradients
        loss = opt.step(closure)
    assert len(calls) == 1
    grads = torch.func.grad(lambda p: torch.nn.functional.mse_loss(torch.func.functional_call(model, p, (x,)), y))(
        start
    )
    assert torch.equal(loss, torch.nn.functional.mse_loss(torch.func.functional_call(model, start, (x,)), y))
    config = dash_fn.DashConfig(**CONFIG)
    want, _ = dash_fn.step(
        start, grads, dash_fn.init(start, config), lr=0.01, refresh=dash_fn.is_refresh_step(config, 1)
    )
    for k, p in model.named_parameters():
        assert torch.equal(p.detach(), want[k]), k


@pytest.mark.compat
@pytest.mark.parametrize("schedule, graphs", [("periodic", 2), ("staggered", 1)])
def test_compiled_step_matches_eager_in_two_graphs(schedule, graphs):
    """On the CPU two graphs serve all periodic steps (plain and refresh, picked on the host
    from the state's counter), one all staggered steps: a new lr every step (scheduler), a
    parameter without grad and a skipped non-finite step recompile none, and the schedule
    follows the counter past the skip (step 4 is skipped, so the refresh due at 4 comes at the
    next call), as in eager."""
    shapes = {"w": (12, 10), "b": (10,)}  # one block: a small graph compiles fast
    runs = {}
    for compile in (False, {"backend": "aot_eager"}):
        params = {k: torch.nn.Parameter(v) for k, v in mixed_params(shapes=shapes).items()}
        opt = dash_fn.DASH(
            params.values(),
            lr=0.01,
            compile=compile,
            block_size=16,
            solver="eigh",
            inv_root_freq=2,
            refresh_schedule=schedule,
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))
        counters.clear()
        for t in range(1, 8):
            grads = random_grads(params, t)
            if t == 4:
                grads["w"][0, 0] = math.nan
            set_grads(params, grads, skip={"b"} if t == 3 else ())
            opt.step()
            scheduler.step()
        runs[bool(compile)] = values(params)
        assert opt.skipped_steps() == [1]
        if compile:
            assert counters["stats"]["unique_graphs"] == graphs
            assert sum(counters["graph_break"].values()) == 0
    for k in runs[False]:
        torch.testing.assert_close(runs[True][k], runs[False][k], rtol=1e-5, atol=1e-6, msg=k)


def test_two_compiled_optimizers_on_different_models_in_one_process():
    """Dynamo caches graphs per function: the second model's plan must not turn symbolic."""
    for shapes in ({"w": (12, 10), "s": (8, 8), "b": (10,)}, {"u": (6, 9), "v": (4, 6), "c": (4,)}):
        params = {k: torch.nn.Parameter(v) for k, v in mixed_params(shapes=shapes).items()}
        options = dict(lr=0.01, block_size=16, solver="eigh", refresh_schedule="staggered")  # eager as compiled
        opt = dash_fn.DASH(params.values(), compile={"backend": "aot_eager"}, **options)
        eager = dash_fn.DASH([torch.nn.Parameter(p.detach().clone()) for p in params.values()], **options)
        for t in range(1, 3):
            set_grads(params, random_grads(params, t))
            for p, q in zip(params.values(), eager.param_groups[0]["params"]):
                q.grad = p.grad.clone()
            opt.step()
            eager.step()
        for p, q in zip(params.values(), eager.param_groups[0]["params"]):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_compiled_optimizer_says_once_that_it_compiles(monkeypatch):
    """The first compiled step logs one warning on the "dash_fn" logger (users silence it
    there), which on a CPU says that whether compiling pays depends on the model; the graphs compiled after it
    (another group, the periodic refresh step) say nothing."""
    from dash_fn import optim

    monkeypatch.setattr(optim, "_compile_notice_given", False)  # as in a new process
    params = {k: torch.nn.Parameter(v) for k, v in mixed_params(shapes={"w": (12, 10), "b": (10,)}).items()}
    groups = [{"params": [params["w"]]}, {"params": [params["b"]], "weight_decay": 0.1}]
    opt = dash_fn.DASH(
        groups,
        lr=0.01,
        compile={"backend": "aot_eager"},
        block_size=16,
        solver="eigh",
        refresh_schedule="periodic",
        inv_root_freq=2,
    )
    notices: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = notices.append
    logging.getLogger("dash_fn").addHandler(handler)
    try:
        for t in range(1, 4):  # steps 1 and 2 refresh, 3 does not: two graphs per group
            set_grads(params, random_grads(params, t))
            opt.step()
    finally:
        logging.getLogger("dash_fn").removeHandler(handler)
    assert len(opt._compiled_steps) == 4, opt._compiled_steps.keys()
    assert [r.levelno for r in notices] == [logging.WARNING], [r.getMessage() for r in notices]
    assert "On a CPU whether it pays depends on the model" in notices[0].getMessage()
    assert "compiles the optimizer step" in notices[0].getMessage()


def test_changed_hyper_parameter_applies_and_layout_change_is_refused():
    params = parameters()
    opt = dash_fn.DASH(params.values(), lr=0.01, **CONFIG)
    config = dash_fn.DashConfig(**CONFIG)
    current = {str(i): v for i, v in enumerate(model_values().values())}
    state = dash_fn.init(current, config)
    for t in range(1, 5):
        if t == 3:  # a weight-decay schedule, as some training recipes use
            opt.param_groups[0]["weight_decay"] = 0.1
            config = config.replace(weight_decay=0.1)
            state.set_non_tensor("config", config)
        grads = random_grads(params, t)
        set_grads(params, grads)
        opt.step()
        grads = {str(i): g for i, g in enumerate(grads.values())}
        current, state = dash_fn.step(current, grads, state, lr=0.01, refresh=dash_fn.is_refresh_step(config, t))
    for i, k in enumerate(params):
        assert torch.equal(params[k].detach(), current[str(i)]), k
    assert_equal_states(state_of(opt), state)

    before, before_state = values(params), state_of(opt).clone()
    opt.param_groups[0]["block_size"] = 32
    with pytest.raises(ValueError, match="block_size is 32 here but 16"):
        opt.step()
    assert all(torch.equal(params[k].detach(), before[k]) for k in params)
    assert_equal_states(state_of(opt), before_state)

    opt.param_groups[0].update(block_size=16, solver="ndb")  # a solver that needs start vectors
    opt.step()
    assert ("start_vectors", "16") in tensors(state_of(opt)) and int(state_of(opt)["step"]) == 5


def test_bad_options_raise_before_anything_is_added():
    params = list(parameters().values())
    with pytest.raises(TypeError, match="'blocksize'"):
        dash_fn.DASH(params, blocksize=32)
    with pytest.raises(ValueError, match="block_size"):
        dash_fn.DASH(params, block_size=0)
    with pytest.raises(ValueError, match="lr"):
        dash_fn.DASH(params, lr=-1.0)
    with pytest.raises(TypeError, match="compile"):
        dash_fn.DASH(params, compile="yes")
    opt = dash_fn.DASH(params[:2], lr=0.01)
    with pytest.raises(ValueError, match="param group.*solver"):
        opt.add_param_group({"params": params[2:], "solver": "svd"})
    assert len(opt.param_groups) == 1
    params[0].grad = torch.zeros_like(params[0]).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


def test_param_group_keys_are_strict():
    params = list(parameters().values())
    with pytest.raises(
        TypeError,
        match=r"param group got unknown option 'weight_decy'; did you mean 'weight_decay'\?$",
    ):
        dash_fn.DASH([{"params": params, "weight_decy": 0.1}])
    opt = dash_fn.DASH(params[:2], lr=0.01)
    with pytest.raises(TypeError, match="param group got momentum=, which is SGD's and Muon's option: .* is mu"):
        opt.add_param_group({"params": params[2:], "momentum": 0.9})
    assert len(opt.param_groups) == 1


def test_named_parameters_name_the_state_and_the_errors():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    opt = dash_fn.DASH(model.named_parameters(), lr=0.01, block_size=4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    assert state_of(opt)["plan"].names == ("0.weight", "0.bias", "1.weight", "1.bias")
    with pytest.raises(ValueError, match=r"batch_dims=2 leaves no matrix in parameter '0.weight' of shape \(5, 6\)"):
        dash_fn.DASH([{"params": list(model.named_parameters()), "batch_dims": 2}])
    saved = opt.state_dict()
    assert saved["param_groups"][0]["param_names"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    restored = dash_fn.DASH(model.named_parameters(), lr=0.01, block_size=4)
    restored.load_state_dict(saved)
    assert_equal_states(state_of(restored), state_of(opt))


def test_weight_decay_decays_vectors_as_adamw_does_unless_told_otherwise():
    """weight_decay alone: every parameter decays, vectors included (torch.optim.AdamW's rule);
    weight_decay_1d=0.0 leaves the vectors undecayed."""

    def bias_after_one_step(**decay):
        bias = torch.nn.Parameter(torch.ones(4))
        opt = dash_fn.DASH([bias], lr=0.1, **decay)
        bias.grad = torch.zeros(4)
        opt.step()
        return bias.detach()

    assert torch.equal(bias_after_one_step(weight_decay=0.5), torch.full((4,), 1 - 0.1 * 0.5))
    assert torch.equal(bias_after_one_step(weight_decay=0.5, weight_decay_1d=0.0), torch.ones(4))


def test_mixed_precision_group_says_why_its_state_is_float64():
    params = [torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64)), torch.nn.Parameter(torch.randn(4, 4))]
    opt = dash_fn.DASH(params, lr=0.01, block_size=4)
    for p in params:
        p.grad = torch.randn_like(p)
    with pytest.warns(
        UserWarning, match=r"mix float64 \('0'\) with lower precision \('1'\).*whole state is kept in float64"
    ):
        opt.step()
    assert state_of(opt)["groups", "0", "A"].dtype == torch.float64
    split = dash_fn.DASH([{"params": params[:1]}, {"params": params[1:]}], lr=0.01, block_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split.step()
    assert state_of(split, 1)["groups", "0", "A"].dtype == torch.float32


# --- where DASH keeps torch.optim's contract (issue 28): torch.optim.Adam is the oracle ---


def stepped(opt_cls, params, **kwargs):
    """An optimizer of ``opt_cls`` over ``params`` after one step with fixed gradients."""
    opt = opt_cls(params, **kwargs)
    for p, g in zip(params, random_grads({str(i): p for i, p in enumerate(params)}, 1).values()):
        p.grad = g
    opt.step()
    return opt


@pytest.mark.parametrize("opt_cls,kwargs", [(torch.optim.Adam, {}), (dash_fn.DASH, CONFIG)], ids=["Adam", "DASH"])
def test_state_dict_keeps_what_hooks_store_in_optimizer_state(opt_cls, kwargs):
    """A pre-hook's ``opt.state["x"] = 1`` reaches the post-hook and the dict, and a loaded
    dict puts it back into ``opt.state``, as torch.optim.Adam does."""
    opt = stepped(opt_cls, list(parameters().values()), lr=0.01, **kwargs)
    seen = []
    opt.register_state_dict_pre_hook(lambda o: o.state.__setitem__("x", 1))
    opt.register_state_dict_post_hook(lambda o, sd: seen.append(sd["state"].get("x")))
    saved = opt.state_dict()
    assert seen == [1] and saved["state"]["x"] == 1
    fresh = opt_cls(list(parameters().values()), lr=0.01, **kwargs)
    fresh.load_state_dict(saved)
    assert fresh.state["x"] == 1


def test_load_state_dict_takes_step_counters_as_numbers_or_float_tensors():
    """Older torch.optim dicts hold ``step`` as a Python number, newer ones as a float32
    tensor; both load, to the same state. A fractional count is refused."""
    opt = stepped(dash_fn.DASH, list(parameters().values()), lr=0.01, **CONFIG)
    for form in (int, lambda t: t.float()):
        saved = opt.state_dict()
        counters = lambda v, form=form: {"step": form(v["step"]), "skipped": form(v["skipped"])}
        saved["state"] = {k: {**v, **counters(v)} for k, v in saved["state"].items()}
        fresh = dash_fn.DASH(list(parameters().values()), lr=0.01, **CONFIG)
        fresh.load_state_dict(saved)
        assert_equal_states(state_of(fresh), state_of(opt))
    saved["state"][0] = {**saved["state"][0], "step": 1.5}
    with pytest.raises(ValueError, match="'step' must be a whole number, got 1.5"):
        fresh.load_state_dict(saved)


def test_one_element_tensor_lr_is_accepted_and_others_refused_as_torch_optim_does():
    runs = []
    for lr in (torch.tensor([0.01]), torch.tensor(0.01)):
        params = list(parameters().values())
        stepped(dash_fn.DASH, params, lr=lr, **CONFIG)
        runs.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    torch.optim.Adam(list(parameters().values()), lr=torch.tensor([0.01]))  # the form torch.optim takes
    for opt_cls in (torch.optim.Adam, dash_fn.DASH):  # the lr is checked before the params
        with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
            opt_cls(None, lr=torch.tensor([1e-3, 1e-3]))


def test_a_parameter_listed_twice_has_one_index_and_is_stepped_once():
    """torch.optim warns and numbers each distinct tensor once; DASH's state dict round-trips
    and the update is that of the parameter listed once. (Periodic schedule: under the
    staggered one the second listing takes block numbers of its own, which shifts the phases
    of the blocks after it.)"""

    def listed(opt_cls, twice):
        a, b = (torch.nn.Parameter(v) for v in mixed_params(shapes={"a": (20, 12), "b": (12,)}).values())
        params = [a, b, a] if twice else [a, b]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            options = {**CONFIG, "refresh_schedule": "periodic"} if opt_cls is dash_fn.DASH else {}
            opt = opt_cls(params, lr=0.01, **options)
        assert any("duplicate parameters" in str(w.message) for w in caught) == twice
        a.grad, b.grad = torch.ones_like(a), torch.full_like(b, 0.5)
        opt.step()
        return opt, (a.detach(), b.detach())

    adam, _ = listed(torch.optim.Adam, True)
    dash, values_twice = listed(dash_fn.DASH, True)
    saved = dash.state_dict()
    assert saved["param_groups"][0]["params"] == adam.state_dict()["param_groups"][0]["params"] == [2, 1, 2]
    assert sorted(saved["state"]) == sorted(adam.state_dict()["state"]) == [1, 2]
    _, values_once = listed(dash_fn.DASH, False)
    assert all(torch.equal(x, y) for x, y in zip(values_twice, values_once))
    fresh, _ = listed(dash_fn.DASH, True)
    fresh.load_state_dict(saved)
    assert_equal_states(state_of(fresh), state_of(dash))


def test_compiled_groups_of_different_shapes_have_graphs_of_their_own():
    """Per-layer learning rates: more groups of different shapes than Dynamo's recompile limit
    (lowered to 1 here, 8 by default) all compile under fullgraph, and match eager."""
    shapes = [{"w": (8 + i, 6), "b": (6 + i,)} for i in range(3)]
    runs = []
    for compile in (False, {"backend": "aot_eager"}):
        groups = [
            {"params": [torch.nn.Parameter(v) for v in mixed_params(shapes=s).values()], "lr": 0.01 * (i + 1)}
            for i, s in enumerate(shapes)
        ]
        opt = dash_fn.DASH(
            groups, compile=compile, block_size=16, solver="eigh", inv_root_freq=2, refresh_schedule="staggered"
        )
        with torch._dynamo.config.patch(recompile_limit=1):
            for t in range(1, 3):
                for group in groups:
                    for p, g in zip(group["params"], random_grads(dict(enumerate(group["params"])), t).values()):
                        p.grad = g
                opt.step()
        runs.append([p.detach().clone() for group in groups for p in group["params"]])
    for compiled, eager in zip(*runs[::-1]):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)


def test_more_compiled_groups_than_the_default_recompile_limit():
    """10 groups of different shapes (one lr per layer) at Dynamo's default limit of 8."""
    groups = [{"params": [torch.nn.Parameter(torch.randn(4 + i, 3))], "lr": 0.01} for i in range(10)]
    opt = dash_fn.DASH(groups, compile={"backend": "aot_eager"}, block_size=16, solver="eigh")
    before = [g["params"][0].detach().clone() for g in groups]
    for group in groups:
        group["params"][0].grad = torch.randn_like(group["params"][0])
    opt.step()
    assert all(not torch.equal(g["params"][0], b) for g, b in zip(groups, before))


def test_eps_that_looks_ported_from_adamw_warns_and_names_the_adam_epsilons():
    params = list(parameters().values())
    with pytest.warns(UserWarning, match=r"eps=1e-08 sets Shampoo's damping.*eps_graft.*adamw_eps"):
        dash_fn.DASH(params, eps=1e-8)
    with pytest.warns(UserWarning, match=r"param group: eps=1e-06"):
        dash_fn.DASH([{"params": params, "eps": 1e-6}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dash_fn.DASH(params)
        dash_fn.DASH(params, eps=1e-10)  # a damping of the usual size
        dash_fn.DASH(params, eps=1e-6, eps_graft=1e-8)  # the damping, meant as such
        dash_fn.DASH([{"params": params, "eps": 1e-6, "adamw_eps": 1e-8}])


def test_batched_weight_warning_suggests_a_form_the_adapter_takes():
    w = torch.nn.Parameter(torch.randn(4, 8, 16))
    w.grad = torch.randn_like(w)
    with pytest.warns(UserWarning, match="viewed as one") as caught:
        dash_fn.DASH([w], lr=0.01, block_size=8).step()
    message = str(caught[0].message)
    suggested = re.search(r'\{"params": \[\.\.\.\], "batch_dims": (\d+)\}', message)
    assert suggested, message
    opt = dash_fn.DASH([{"params": [w], "batch_dims": int(suggested[1])}], lr=0.01, block_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step()
    assert state_of(opt)["plan"].params[0].batch_dims == 1


def test_diagonal_helper_equals_torch_diagonal():
    from dash_fn.roots.identity import diagonal

    X = torch.randn(5, 7, 7)
    assert torch.equal(diagonal(X), X.diagonal(dim1=-2, dim2=-1))
    assert torch.equal(diagonal(X.mT), X.mT.diagonal(dim1=-2, dim2=-1))  # a non-contiguous stack


@pytest.mark.compat
@pytest.mark.inductor
def test_inductor_compiled_step_prints_no_torch_deprecation_warning():
    """Inductor's lowering of ``aten.diagonal`` calls ``torch._prims_common.check``, deprecated
    (a FutureWarning that compiled AdamW does not print): the step reads no diagonal that way."""
    params = [torch.nn.Parameter(torch.randn(6, 5)), torch.nn.Parameter(torch.randn(5))]
    opt = dash_fn.DASH(params, lr=0.01, compile=True, block_size=8, solver="eigh", inv_root_freq=2)
    # compiled afresh: a graph from Inductor's caches is not lowered again, and would not warn
    no_fx_cache = torch._inductor.config.patch(fx_graph_cache=False)
    no_aot_cache = torch._functorch.config.patch(enable_autograd_cache=False)
    with no_fx_cache, no_aot_cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, 3):  # a refresh step, then a plain one: both graphs
            for p, g in zip(params, random_grads(dict(enumerate(params)), t).values()):
                p.grad = g
            opt.step()
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]  # what users see by default
    assert not future, future


def test_per_parameter_state_is_as_the_readme_says():
    """The group's whole state under its first parameter, the others' entries empty, and each
    parameter's share in ``state_dict()["state"][i]`` as views of the live tensors."""
    params = list(parameters().values())
    opt = stepped(dash_fn.DASH, params, lr=0.01, **CONFIG)
    assert set(opt.state[params[0]]) == {"dash", "step"}
    assert all(not opt.state[p] for p in params[1:])
    share = opt.state_dict()["state"][1]  # "rect" (40, 21): blocks of 16
    block = share["rows_0_16_cols_0_16"]["A"]
    block.add_(1.0)  # a view: the live state moves with it
    assert torch.equal(opt.state_dict()["state"][1]["rows_0_16_cols_0_16"]["A"], block)


@pytest.mark.parametrize("thin_ratio", [4.0, math.inf])
def test_thin_weight_state_is_the_closed_form(thin_ratio):
    """A (m, n) weight with n <= b / 4 holds 2 + 2n/b floats per entry as thin blocks (A and Gt,
    and an n x n factor with its root per b x n block), 2 + 2b/n + 2n/b two-sided (a b x b left
    factor and its root too): 2.5 and 10.5 for an nn.Embedding(32000, 64) at b = 256 (docs/guide/memory.md)."""
    b, n = 32, 8
    config = dash_fn.DashConfig(block_size=b, solver="eigh", thin_ratio=thin_ratio)  # no start vectors
    state = dash_fn.init({"w": torch.zeros(4 * b, n)}, config)
    floats = sum(x.numel() for x in tensors(state).values() if x.is_floating_point())  # not the fallback counts
    expected = 2 + 2 * n / b if thin_ratio == 4.0 else 2 + 2 * b / n + 2 * n / b
    assert floats / (4 * b * n) == expected


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_another_optimizers_option_names_dashs_equivalent(name):
    """A keyword ported from AdamW, Muon or Distributed Shampoo gets a short message naming DASH's
    equivalent (or saying there is none), not the list of every field."""
    params = list(parameters().values())
    with pytest.raises(TypeError) as error:
        dash_fn.DASH(params, lr=1e-3, **{name: 0.9})
    message = str(error.value)
    assert message.startswith(f"DASH got {name}=, which is ") and "DashConfig fields" not in message
    assert len(message) < 400
    equivalents = {
        "betas": "beta_G",
        "momentum": "mu",
        "matmul_dtype": "precision=",
        "precondition_frequency": "inv_root_freq=",
    }
    assert equivalents.get(name, "") in message


def test_an_unknown_option_says_where_dashs_options_are():
    """Nothing near among DASH's options: one short line saying where they are, not the list."""
    with pytest.raises(TypeError) as error:
        dash_fn.DASH(list(parameters().values()), lerning_rate=1e-3)
    message = str(error.value)
    assert message.startswith("DASH got unknown option 'lerning_rate'; its options are lr, compile, process_group")
    assert "help(dash_fn.DashConfig)" in message and len(message) < 200


def test_the_compile_notice_is_said_once_per_process(monkeypatch):
    """Three compiled optimizers (as in the main job) log one notice, not three."""
    import logging

    from dash_fn import optim

    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("dash_fn")
    logger.addHandler(handler)
    monkeypatch.setattr(optim, "_compile_notice_given", False)
    try:
        for _ in range(3):
            params = list(parameters().values())
            opt = dash_fn.DASH(params, lr=1e-3, compile={"backend": "eager"})
            for p in params:
                p.grad = torch.ones_like(p)
            opt.step()
    finally:
        logger.removeHandler(handler)
    assert sum("first step compiles" in m for m in messages) == 1, messages


@pytest.mark.parametrize(
    "make",
    [
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=10),
        lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, base_lr=1e-3, max_lr=1e-2),
    ],
    ids=["OneCycleLR", "CyclicLR"],
)
def test_schedulers_that_cycle_momentum_are_refused_at_their_construction(make):
    """With their defaults OneCycleLR and CyclicLR would cycle a momentum DASH does not have:
    they refuse DASH when they are built (torch's message names cycle_momentum), before any
    forward or backward pass; with cycle_momentum=False they schedule the lr."""
    params = list(parameters().values())
    before = [p.detach().clone() for p in params]
    opt = dash_fn.DASH(params, lr=1e-3)
    with pytest.raises(ValueError, match="cycle_momentum"):
        make(opt)
    for p in params:
        p.grad = torch.ones_like(p)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=100, cycle_momentum=False)
    lrs = []
    for _ in range(3):
        opt.step()
        scheduler.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] < lrs[1] < lrs[2] and not any(torch.equal(p, b) for p, b in zip(params, before))


LR_SCHEDULERS = {
    "LambdaLR": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5**t),
    "MultiplicativeLR": lambda opt: torch.optim.lr_scheduler.MultiplicativeLR(opt, lambda t: 0.5),
    "StepLR": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1),
    "MultiStepLR": lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 2]),
    "ConstantLR": lambda opt: torch.optim.lr_scheduler.ConstantLR(opt),
    "LinearLR": lambda opt: torch.optim.lr_scheduler.LinearLR(opt),
    "ExponentialLR": lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5),
    "PolynomialLR": lambda opt: torch.optim.lr_scheduler.PolynomialLR(opt),
    "CosineAnnealingLR": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10),
    "CosineAnnealingWarmRestarts": lambda opt: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=10),
    "ReduceLROnPlateau": lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
}


@pytest.mark.parametrize("name", sorted(LR_SCHEDULERS))
def test_every_other_lr_scheduler_works_with_its_defaults(name):
    """torch.optim's schedulers with only their required arguments: three steps, each one the lr
    the scheduler set (ReduceLROnPlateau: a loss to watch)."""
    params = list(parameters().values())
    opt = dash_fn.DASH(params, lr=1e-2)
    scheduler = LR_SCHEDULERS[name](opt)
    for p in params:
        p.grad = torch.ones_like(p)
    for _ in range(3):
        opt.step()
        scheduler.step(1.0) if name == "ReduceLROnPlateau" else scheduler.step()
    assert 0 < opt.param_groups[0]["lr"] <= 1e-2 and all(torch.isfinite(p).all() for p in params)
