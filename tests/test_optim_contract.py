"""dash_fn.DASH keeps the contract that torch.optim's optimizers keep.

Written from what torch.optim promises (and what PyTorch's generic optimizer tests check, with
the error inputs of ``torch.testing._internal.common_optimizers``): state-dict round trips,
hooks, param-group edits, the forms of lr, parameters without gradients, closures, deepcopy and
pickle. Where the contract is generic, each test runs ``torch.optim.Adam`` beside DASH as the
oracle of what an optimizer does.
"""

import copy
import io
import json
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

import dash_fn
from conftest import assert_equal_states, tensors

SMALL = dict(block_size=8, solver="eigh", inv_root_freq=2)  # blocks and strips; refreshes every other step
OPTIMIZERS = {"Adam": (torch.optim.Adam, {}), "DASH": (dash_fn.DASH, SMALL)}
each_optimizer = pytest.mark.parametrize("name", list(OPTIMIZERS))


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def make(name: str, params, **kwargs) -> torch.optim.Optimizer:
    opt_cls, defaults = OPTIMIZERS[name]
    return opt_cls(params, **{"lr": 0.01, **defaults, **kwargs})


def train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, start: int = 0) -> list[float]:
    """``steps`` steps on fixed batches (batch t for step t), through a closure; the losses."""
    losses = []
    for t in range(start, start + steps):
        gen = torch.Generator().manual_seed(t)
        x, y = torch.randn(16, 6, generator=gen), torch.randn(16, 3, generator=gen)

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            return loss

        losses.append(opt.step(closure).item())
    return losses


def weights(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def assert_same_state(name: str, got: torch.optim.Optimizer, want: torch.optim.Optimizer) -> None:
    if name == "DASH":
        for g, w in zip(got.param_groups, want.param_groups):
            assert_equal_states(got.state[g["params"][0]]["dash"], want.state[w["params"][0]]["dash"])
    else:
        for p, q in zip(got.param_groups[0]["params"], want.param_groups[0]["params"]):
            assert all(torch.equal(got.state[p][k], want.state[q][k]) for k in want.state[q])


# Run in a process of its own: importing torch.testing._internal changes process-wide state for
# PyTorch's own suite (it disables setting torch.backends flags, which Lightning's
# deterministic mode does, and loads a hypothesis profile).
ERROR_CHECK = """
import json, re, warnings
import dash_fn
from torch.testing._internal.common_optimizers import OptimizerErrorEnum, get_error_inputs_for_all_optims

results = []
for error in get_error_inputs_for_all_optims("cpu", None):
    given = error.optimizer_error_input
    assert error.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            dash_fn.DASH(given.params, **given.kwargs)
            raised = None
        except Exception as e:
            raised = e
    messages = [str(w.message) for w in caught if isinstance(w.message, error.error_type)]
    if issubclass(error.error_type, Warning):
        ok = raised is None and any(re.search(error.error_regex, m) for m in messages)
    else:
        ok = isinstance(raised, error.error_type) and re.search(error.error_regex, str(raised)) is not None
    results.append({"desc": given.desc, "ok": bool(ok), "got": repr(raised) if raised else messages})
print(json.dumps(results))
"""


def test_errors_of_every_torch_optimizer():
    """PyTorch's error inputs for all optimizers (``common_optimizers``): for each, DASH raises
    the same exception with the same message, or warns the same warning."""
    run = subprocess.run([sys.executable, "-c", ERROR_CHECK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(results) >= 6 and not [r for r in results if not r["ok"]], results


@each_optimizer
def test_state_dict_round_trip_resumes_bitwise(name):
    """Stop after 3 steps, save (through torch.save and torch.load(weights_only=True)), load
    into a new optimizer of a copy of the model: the next steps equal the uninterrupted run."""
    net = model()
    opt = make(name, net.parameters())
    train(net, opt, 3)
    buffer = io.BytesIO()
    torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    want = train(net, opt, 3, start=3)

    resumed = model(seed=1)
    resumed.load_state_dict(saved["model"])
    opt2 = make(name, resumed.parameters())
    opt2.load_state_dict(saved["opt"])
    assert train(resumed, opt2, 3, start=3) == want
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed), weights(net)))
    assert_same_state(name, opt2, opt)


@each_optimizer
def test_load_state_dict_copies_and_restores_hyper_parameters(name):
    """The saved groups' hyper-parameters (a scheduler's lr) replace the optimizer's, and (DASH)
    the loaded state shares no memory with the dict: a step does not change the dict."""
    net = model()
    opt = make(name, net.parameters(), lr=0.02)
    train(net, opt, 2)
    saved = opt.state_dict()
    snapshot = copy.deepcopy(saved)
    net2 = model(seed=1)
    opt2 = make(name, net2.parameters(), lr=0.5)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["lr"] == 0.02
    train(net2, opt2, 1)  # moves opt2's state in place, and with it the dict's if they shared memory
    flat = lambda sd: [
        x for e in sd["state"].values() for x in torch.utils._pytree.tree_leaves(e) if isinstance(x, torch.Tensor)
    ]
    # torch.optim's load keeps a tensor that needs no cast (Tensor.to), so Adam's state and the
    # dict may share memory; DASH promises they never do
    assert all(torch.equal(a, b) for a, b in zip(flat(saved), flat(snapshot))) or name == "Adam"


@each_optimizer
def test_state_dict_of_an_unstepped_optimizer_loads(name):
    opt = make(name, model().parameters())
    saved = opt.state_dict()
    assert saved["state"] == {} and saved["param_groups"][0]["params"] == list(range(4))
    opt2 = make(name, model().parameters())
    opt2.load_state_dict(saved)
    assert not any(opt2.state.values())


def test_load_state_dict_of_an_older_version_keeps_new_keys():
    """A checkpoint written before a group key existed loads; the key keeps this optimizer's
    value (torch.optim's rule for keys added since, e.g. ``foreach``)."""
    net = model()
    opt = make("DASH", net.parameters(), eps_power_iter=1e-5)
    train(net, opt, 2)
    saved = opt.state_dict()
    del saved["param_groups"][0]["eps_power_iter"]
    opt2 = make("DASH", model().parameters(), eps_power_iter=1e-5)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["eps_power_iter"] == 1e-5


def test_load_state_dict_refuses_another_optimizers_dict():
    net = model()
    adam = make("Adam", net.parameters())
    train(net, adam, 1)
    with pytest.raises(ValueError, match=r"holds .*betas.*: the state_dict of another optimizer"):
        make("DASH", model().parameters()).load_state_dict(adam.state_dict())


@each_optimizer
def test_hooks_run_in_order_and_can_be_removed(name):
    """Step pre/post hooks (per optimizer and global), state-dict and load-state-dict hooks
    with prepend, each removable by its handle."""
    net = model()
    opt = make(name, net.parameters())
    calls = []
    handles = [
        opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre")),
        opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post")),
        register_optimizer_step_pre_hook(lambda o, args, kwargs: calls.append("global pre")),
        opt.register_state_dict_pre_hook(lambda o: calls.append("sd pre")),
        opt.register_state_dict_post_hook(lambda o, sd: sd.__setitem__("tag", 1)),
        opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load pre 2")),
        opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load pre 1"), prepend=True),
        opt.register_load_state_dict_post_hook(lambda o: calls.append("load post")),
    ]
    try:
        train(net, opt, 1)
        saved = opt.state_dict()
        opt.load_state_dict(saved)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == ["global pre", "pre", "post", "sd pre", "load pre 1", "load pre 2", "load post"]
    assert saved["tag"] == 1
    calls.clear()
    train(net, opt, 1)
    opt.load_state_dict(opt.state_dict())
    assert calls == []


@each_optimizer
def test_load_state_dict_pre_hook_may_edit_the_dict(name):
    net = model()
    opt = make(name, net.parameters())
    train(net, opt, 1)

    def halve_lr(o, sd):
        sd = copy.deepcopy(sd)
        sd["param_groups"][0]["lr"] /= 2
        return sd

    opt.register_load_state_dict_pre_hook(halve_lr)
    opt.load_state_dict(opt.state_dict())
    assert opt.param_groups[0]["lr"] == 0.005


@each_optimizer
def test_param_group_edits_take_effect_at_the_next_step(name):
    """A new lr written into a group (what schedulers do) and a group added after some steps
    (its parameters start from a fresh state) behave as in a run built that way."""
    net, twin = model(), model()
    opt = make(name, [{"params": net[0].parameters()}])
    train(net, opt, 2)
    opt.param_groups[0]["lr"] = 0.03
    opt.add_param_group({"params": net[2].parameters(), "lr": 0.02})
    frozen = weights(net)
    twin.load_state_dict(net.state_dict())
    opt_twin = make(name, [{"params": twin[0].parameters(), "lr": 0.03}, {"params": twin[2].parameters(), "lr": 0.02}])
    if name == "DASH":  # the first group's state carries over; compare it alone
        opt_twin.state[twin[0].weight] = copy.deepcopy(opt.state[net[0].weight])
    else:
        for p, q in zip(net[0].parameters(), twin[0].parameters()):
            opt_twin.state[q] = copy.deepcopy(opt.state[p])
    assert train(net, opt, 2, start=2) == train(twin, opt_twin, 2, start=2)
    assert all(torch.equal(a, b) for a, b in zip(weights(net), weights(twin)))
    assert not all(torch.equal(a, b) for a, b in zip(weights(net), frozen))


@each_optimizer
def test_lr_scheduler_and_reduce_on_plateau_set_the_groups_lr(name):
    net = model()
    opt = make(name, net.parameters(), lr=0.04)
    step_lr = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.1, patience=0)
    for _ in range(2):
        train(net, opt, 1)
        step_lr.step()
    plateau.step(1.0)
    plateau.step(2.0)  # no improvement: lr * 0.1
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)


@pytest.mark.parametrize(
    "lr",
    [0.01, torch.tensor(0.01, dtype=torch.float64), torch.tensor([0.01], dtype=torch.float64)],
    ids=["float", "0-d", "1-element"],
)
def test_lr_forms_give_the_same_steps(lr):
    """A float, a 0-d tensor and a 1-element tensor of the same value step alike; a scheduler
    updates a tensor lr in place, as torch.optim's schedulers do."""
    runs = []
    for form in (0.01, lr):
        net = model()
        opt = make("DASH", net.parameters(), lr=copy.deepcopy(form))
        scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
        for t in range(3):
            train(net, opt, 1, start=t)
            scheduler.step()
        runs.append(weights(net))
        if isinstance(form, torch.Tensor):
            assert opt.param_groups[0]["lr"].shape == form.shape and float(opt.param_groups[0]["lr"]) == pytest.approx(
                0.01 / 8
            )
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


@each_optimizer
def test_parameters_without_gradients_are_left_alone(name):
    """All grads None: nothing moves and no state is made; a layer frozen after some steps (its
    moments are not zero): it keeps its values while the others step."""
    net = model()
    opt = make(name, net.parameters())
    before = weights(net)
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(weights(net), before)) and not any(opt.state.values())
    train(net, opt, 2)
    before = weights(net)
    net[0].requires_grad_(False)
    train(net, opt, 2, start=2)
    after = weights(net)
    assert all(torch.equal(a, b) for a, b in zip(after[:2], before[:2]))
    assert not any(torch.equal(a, b) for a, b in zip(after[2:], before[2:]))


@each_optimizer
def test_closure_runs_once_with_gradients_and_its_loss_is_returned(name):
    net = model()
    opt = make(name, net.parameters())
    calls = []
    x, y = torch.randn(8, 6), torch.randn(8, 3)

    def closure():
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        return loss

    with torch.no_grad():
        loss = opt.step(closure)
    assert calls == [True] and loss.requires_grad
    assert opt.step() is None  # no closure: None, grads as they are


@each_optimizer
def test_zero_grad_sets_to_none_or_zero(name):
    net = model()
    opt = make(name, net.parameters())
    train(net, opt, 1)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())


@each_optimizer
def test_deepcopy_and_pickle_give_independent_optimizers(name):
    """A deep copy (and a pickled copy) has the same groups and state, shares no tensor with
    the original, and steps alike; stepping it leaves the original as it was."""
    net = model()
    opt = make(name, net.parameters())
    train(net, opt, 2)
    copies = [copy.deepcopy((net, opt)), pickle.loads(pickle.dumps((net, opt)))]
    before = copy.deepcopy(opt.state_dict())
    want = train(net, opt, 2, start=2)
    for net_copy, opt_copy in copies:
        assert [g["lr"] for g in opt_copy.param_groups] == [g["lr"] for g in opt.param_groups]
        assert train(net_copy, opt_copy, 2, start=2) == want
        assert_same_state(name, opt_copy, opt)
    net2, opt2 = copy.deepcopy((net, opt))
    saved_before = copy.deepcopy(opt.state_dict())
    train(net2, opt2, 1, start=4)
    leaves = lambda sd: [
        x for e in sd["state"].values() for x in torch.utils._pytree.tree_leaves(e) if isinstance(x, torch.Tensor)
    ]
    assert all(torch.equal(a, b) for a, b in zip(leaves(opt.state_dict()), leaves(saved_before)))
    assert before["param_groups"] == opt.state_dict()["param_groups"]


def test_named_parameters_are_kept_in_the_groups_as_torch_optim_keeps_them():
    net = model()
    adam, dash = make("Adam", net.named_parameters()), make("DASH", net.named_parameters())
    assert (
        dash.param_groups[0]["param_names"]
        == adam.param_groups[0]["param_names"]
        == [n for n, _ in net.named_parameters()]
    )
    assert dash.state_dict()["param_groups"][0]["param_names"] == adam.state_dict()["param_groups"][0]["param_names"]


def test_repr_names_the_optimizer_and_its_groups():
    text = repr(make("DASH", model().parameters(), lr=0.02))
    assert text.startswith("DASH (") and "Parameter Group 0" in text and "lr: 0.02" in text and "block_size: 8" in text


def test_state_leaves_are_tensors_as_torch_optim_saves_them():
    """Every leaf of ``state_dict()["state"]`` is a tensor, a number, a string or a list of
    them (what ``torch.load(weights_only=True)`` reads), as in torch.optim."""
    net = model()
    opt = make("DASH", net.parameters())
    train(net, opt, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        leaves = torch.utils._pytree.tree_leaves(opt.state_dict())
    assert all(isinstance(x, (torch.Tensor, int, float, str, bool, type(None))) for x in leaves)
    assert any(isinstance(x, torch.Tensor) for x in tensors(opt.state[net[0].weight]["dash"]).values())
