"""Checkpoints: resume equals the uninterrupted run bitwise; bad files and mismatches raise
clear errors and change nothing."""

import math

import pytest
import torch

import dash_fn
from conftest import assert_equal_states, mixed_params, random_grads, tensors
from dash_fn.roots import SOLVERS

# also run under the simulated accelerator strategy, and on the oldest and newest supported torch
# (docs/CONTRIBUTING.md)
pytestmark = [pytest.mark.accelerator, pytest.mark.compat]

# Roots refresh at steps 1 (t = start_prec_step) and 3 (inv_root_freq = 3): resuming after
# step 2 crosses the schedule, with roots computed before and after the checkpoint.
CONFIG = dict(block_size=16, inv_root_freq=3, mu=0.5, weight_decay=0.01)
STEPS, RESUME = 4, 2
SHAPES = {"square": (32, 32), "rect": (40, 21), "conv": (3, 4, 3, 3), "bias": (40,), "vec": (7,), "scalar": ()}
MATRICES, VECTORS = ["square", "rect", "conv"], ["bias", "vec", "scalar"]


def model_values():
    return mixed_params(shapes=SHAPES)


def parameters(values=None):
    return {k: torch.nn.Parameter(v.clone()) for k, v in (values or model_values()).items()}


def make_optimizer(params, **config):
    """Two groups with their own lr and decay, and a scheduler on top."""
    groups = [
        {"params": [params[k] for k in MATRICES], "lr": 0.02},
        {"params": [params[k] for k in VECTORS], "weight_decay_1d": 0.1},
    ]
    opt = dash_fn.DASH(groups, lr=0.01, **{**CONFIG, **config})
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t))


def train(params, opt, scheduler, steps):
    for t in steps:
        grads = random_grads(params, t)
        for k, p in params.items():
            p.grad = grads[k].clone()
        opt.step()
        scheduler.step()


def dash_states(opt):
    return [opt.state[g["params"][0]]["dash"] for g in opt.param_groups]


def snapshot(opt):
    """Everything load_state_dict could change: group dicts and state tensors, copied."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    entries = [opt.state.get(g["params"][0]) for g in opt.param_groups]
    return groups, [{k: v.clone() for k, v in tensors(e["dash"]).items()} if e else None for e in entries]


def assert_unchanged(opt, before):
    groups, states = snapshot(opt)
    assert groups == before[0]
    for got, want in zip(states, before[1]):
        assert (got is None) == (want is None)
        assert got is None or (got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want))


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_optimizer_resume_equals_uninterrupted_run_bitwise(solver, tmp_path):
    whole = parameters()
    whole_opt, scheduler = make_optimizer(whole, solver=solver)
    train(whole, whole_opt, scheduler, range(1, STEPS + 1))

    first = parameters()
    opt, scheduler = make_optimizer(first, solver=solver)
    train(first, opt, scheduler, range(1, RESUME + 1))
    path = tmp_path / "run.pt"
    torch.save(
        {
            "model": {k: p.detach() for k, p in first.items()},
            "optim": opt.state_dict(),
            "sched": scheduler.state_dict(),
        },
        path,
    )
    del first, opt, scheduler

    checkpoint = torch.load(path, weights_only=True)
    resumed = parameters(checkpoint["model"])
    opt, scheduler = make_optimizer(resumed, solver=solver)
    scheduler.load_state_dict(checkpoint["sched"])
    opt.load_state_dict(checkpoint["optim"])
    train(resumed, opt, scheduler, range(RESUME + 1, STEPS + 1))

    for k in whole:
        assert torch.equal(resumed[k].detach(), whole[k].detach()), k
    for got, want in zip(dash_states(opt), dash_states(whole_opt)):
        assert_equal_states(got, want)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in whole_opt.param_groups]


@pytest.mark.parametrize("solver", [s for s in ("eigh", "ndb") if s in SOLVERS])  # without and with start vectors
def test_functional_resume_equals_uninterrupted_run_bitwise(solver, tmp_path):
    config = dash_fn.DashConfig(**CONFIG, solver=solver, one_dim="shampoo")

    def run(params, state, steps):
        for t in steps:
            params, state = dash_fn.step(
                params, random_grads(params, t), state, lr=0.01, refresh=dash_fn.is_refresh_step(config, t)
            )
        return params, state

    whole, whole_state = run(model_values(), dash_fn.init(model_values(), config), range(1, STEPS + 1))
    params, state = run(model_values(), dash_fn.init(model_values(), config), range(1, RESUME + 1))
    dash_fn.save_state(tmp_path / "state.pt", state)
    loaded = dash_fn.load_state(tmp_path / "state.pt", params=params, config=config)
    assert loaded["config"] == config and loaded["plan"] == state["plan"]
    params, state = run(params, loaded, range(RESUME + 1, STEPS + 1))
    for k in whole:
        assert torch.equal(params[k], whole[k]), k
    assert_equal_states(state, whole_state)


def test_state_file_holds_primitives_and_tensors_only(tmp_path):
    params = model_values()
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=16, solver="ndb", start_prec_step=math.inf))
    dash_fn.save_state(tmp_path / "state.pt", state)
    blob = torch.load(tmp_path / "state.pt", weights_only=True)
    assert (blob["format"], blob["version"]) == ("dash_fn.state", 4)
    assert blob["config"]["start_prec_step"] == math.inf and blob["config"]["solver"] == "ndb"
    entry = blob["state"]["square"]
    assert (entry["shape"], entry["dtype"], entry["batch_dims"]) == ([32, 32], "float32", 0)
    assert sorted(entry["rows_16_32_cols_0_16"]) == ["A", "Gt", "L", "L_fallbacks", "Lbar", "R", "R_fallbacks", "Rbar"]
    assert ("start_vectors", "16") in tensors(state)
    assert not any("start_vectors" in key for entry in blob["state"].values() for key in entry)
    assert_equal_states(dash_fn.load_state(tmp_path / "state.pt"), state)  # start vectors regenerated
    assert list(tmp_path.iterdir()) == [tmp_path / "state.pt"]  # no temporary file left


def test_loaded_state_shares_no_memory_with_the_source():
    params = parameters()
    opt, _ = make_optimizer(params, solver="eigh")
    train(params, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0), range(1, 3))
    other = parameters({k: p.detach() for k, p in params.items()})
    other_opt, _ = make_optimizer(other, solver="eigh")
    other_opt.load_state_dict(opt.state_dict())  # in memory: same device, same dtypes
    before = snapshot(opt)
    train(other, other_opt, torch.optim.lr_scheduler.LambdaLR(other_opt, lambda t: 1.0), range(3, 4))
    assert_unchanged(opt, before)


def test_adapter_functional_and_file_forms_are_one_format(tmp_path):
    """A parameter's entry is the same in DASH.state_dict(), dash_fn.state_to_dict and a state
    file: the same keys, the same tensors (the module doc of dash_fn.checkpoint)."""
    params = parameters()
    opt, scheduler = make_optimizer(params, solver="eigh")
    train(params, opt, scheduler, range(1, 3))
    adapter = opt.state_dict()["state"]
    index = 0
    for state in dash_states(opt):
        functional = dash_fn.state_to_dict(state)["state"]
        dash_fn.save_state(tmp_path / "state.pt", state)
        saved = torch.load(tmp_path / "state.pt", weights_only=True)["state"]
        assert list(saved) == list(functional)
        for name, entry in functional.items():
            for other in (adapter[index], saved[name]):
                assert other.keys() == entry.keys()
                for key, value in entry.items():
                    if isinstance(value, dict):
                        assert other[key].keys() == value.keys()
                        assert all(torch.equal(other[key][f], value[f]) for f in value), (name, key)
                    elif isinstance(value, torch.Tensor):
                        assert torch.equal(other[key], value), (name, key)
                    else:
                        assert other[key] == value, (name, key)
            index += 1
    assert index == len(adapter)


@pytest.fixture
def stepped():
    """Parameters, an optimizer of them after two steps, and the state dict of a longer run."""
    params = parameters()
    opt, scheduler = make_optimizer(params, solver="eigh")
    train(params, opt, scheduler, range(1, 3))
    source_params = parameters()
    source, source_scheduler = make_optimizer(source_params, solver="eigh")
    train(source_params, source, source_scheduler, range(1, 4))
    return params, opt, source.state_dict()


def rejects(opt, state_dict, match):
    before = snapshot(opt)
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(state_dict)
    assert_unchanged(opt, before)


def test_load_state_dict_rejects_another_model_and_changes_nothing(stepped):
    params, opt, state_dict = stepped
    shapes = {**SHAPES, "rect": (40, 22)}
    other = {k: torch.nn.Parameter(torch.zeros(s)) for k, s in shapes.items()}
    other_opt, _ = make_optimizer(other, solver="eigh")
    rejects(other_opt, state_dict, r"param_groups\[0\]: parameter '1' has shape \(40, 22\) but \(40, 21\)")
    fewer, _ = make_optimizer({**params, "scalar": torch.nn.Parameter(torch.zeros(()))}, solver="eigh")
    fewer.param_groups[1]["params"].pop()
    rejects(fewer, state_dict, r"param_groups\[1\] has 3 parameters in the checkpoint, 2 here")
    rejects(opt, {**state_dict, "param_groups": state_dict["param_groups"][:1]}, "1 param groups, this optimizer 2")


def test_load_state_dict_rejects_another_layout_and_bad_entries(stepped):
    params, opt, state_dict = stepped
    coarser, _ = make_optimizer(parameters(), solver="eigh", block_size=32)
    rejects(coarser, state_dict, r"param_groups\[0\]: block_size is 32 here but 16 in the checkpoint")
    broken = {**state_dict, "state": dict(state_dict["state"])}  # the second group's entry is damaged
    broken["state"][4] = {k: v for k, v in broken["state"][4].items() if k != "v"}
    rejects(opt, broken, r"param_groups\[1\]: parameter '1': lacks tensor 'v'")
    broken["state"][4] = {**state_dict["state"][4], "step": state_dict["state"][4]["step"] + 1}
    rejects(opt, broken, r"param_groups\[1\]: parameter '1' is at step 4 but '0' at 3")
    broken = {
        **state_dict,
        "state": {
            **state_dict["state"],
            1: {k: v for k, v in state_dict["state"][1].items() if k != "rows_16_32_cols_0_16"},
        },
    }
    rejects(opt, broken, r"param_groups\[0\]: the checkpoint lacks block 'rows_16_32_cols_0_16' of parameter '1'")
    adam = torch.optim.AdamW(params.values())
    adam.step()
    rejects(opt, {**state_dict, "state": adam.state_dict()["state"]}, "not a dash_fn state")


def test_load_state_rejects_another_model_or_config(tmp_path):
    params = model_values()
    config = dash_fn.DashConfig(block_size=16, solver="eigh")
    dash_fn.save_state(tmp_path / "state.pt", dash_fn.init(params, config))
    cases = [
        ({**params, "extra": torch.zeros(3)}, config, "no state for parameter 'extra'"),
        ({k: v for k, v in params.items() if k != "vec"}, config, "state for parameter 'vec', which the model lacks"),
        ({**params, "rect": torch.zeros(21, 40)}, config, r"parameter 'rect' has shape \(21, 40\) but \(40, 21\)"),
        (
            {**params, "bias": torch.zeros(40, dtype=torch.float64)},
            config,
            "parameter 'bias' has dtype torch.float64 but torch.float32",
        ),
        (params, config.replace(weight_decay=0.1), "config.weight_decay is 0.1 here but 0.0 in the checkpoint"),
    ]
    for model, cfg, match in cases:
        with pytest.raises(ValueError, match=match):
            dash_fn.load_state(tmp_path / "state.pt", params=model, config=cfg)


def test_damaged_or_foreign_files_raise_clear_errors(tmp_path):
    state = dash_fn.init(model_values(), dash_fn.DashConfig(block_size=16, solver="eigh"))
    refresh = dash_fn.is_refresh_step(state["config"], 1)
    dash_fn.step(model_values(), random_grads(model_values(), 1), state, lr=0.01, refresh=refresh)
    good = tmp_path / "good.pt"
    dash_fn.save_state(good, state)
    data = good.read_bytes()

    def load(content, name="bad.pt"):
        (tmp_path / name).write_bytes(content)
        return dash_fn.load_state(tmp_path / name)

    for cut in (0, 100, len(data) // 2, len(data) - 10):
        with pytest.raises(ValueError, match="truncated, corrupted or not a torch.save file"):
            load(data[:cut])
    A = state["groups", "0", "A"].numpy().tobytes()
    at = data.find(A)
    assert at > 0
    flipped = bytearray(data)
    flipped[at + len(A) // 2] ^= 0x10
    with pytest.raises(ValueError, match="checksum does not match"):
        load(bytes(flipped))
    with pytest.raises(ValueError, match="checksum does not match"):
        load(data.replace(b"eigh", b"eigj", 1))  # metadata is covered too

    blob = torch.load(good, weights_only=True)
    for change, match in [
        ({"format": "other"}, "not a dash_fn state"),
        ({"version": 3}, "version 3; this dash_fn reads version 4 .*unreleased development versions"),
        ({"checksum": None}, "checksum does not match"),
    ]:
        torch.save({**blob, **change}, tmp_path / "changed.pt")
        with pytest.raises(ValueError, match=match):
            dash_fn.load_state(tmp_path / "changed.pt")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(ValueError, match="not a dash_fn state"):
        dash_fn.load_state(tmp_path / "tensor.pt")
    torch.save({k: v for k, v in blob.items() if k != "checksum"}, tmp_path / "unchecked.pt")
    with pytest.raises(ValueError, match="no checksum"):
        dash_fn.load_state(tmp_path / "unchecked.pt")


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    params = model_values()
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=16, solver="eigh"))
    path = tmp_path / "state.pt"
    dash_fn.save_state(path, state)
    good = path.read_bytes()

    def crash(obj, f):  # torch.save writing half a file, to a file object or a name
        (f if hasattr(f, "write") else open(f, "wb")).write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        dash_fn.save_state(path, state)
    assert path.read_bytes() == good and list(tmp_path.iterdir()) == [path]


def test_a_saved_config_lacking_a_field_is_refused(tmp_path):
    """dash_fn was never released: a saved config without a field (thin_ratio, from before
    thin blocks existed) is not read with a guessed default, neither in a file nor in a
    state_to_dict dict; the error names the field."""
    params = model_values()
    state = dash_fn.init(params, dash_fn.DashConfig(block_size=16, solver="eigh"))
    saved = dash_fn.state_to_dict(state)
    del saved["config"]["thin_ratio"]
    with pytest.raises(ValueError, match="config lacks field 'thin_ratio'"):
        dash_fn.state_from_dict(state, saved)
    from dash_fn.checkpoint import _checksum

    dash_fn.save_state(tmp_path / "state.pt", state)
    blob = torch.load(tmp_path / "state.pt", weights_only=True)
    del blob["config"]["thin_ratio"]
    blob["checksum"] = _checksum(blob)
    torch.save(blob, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="config lacks field 'thin_ratio'"):
        dash_fn.load_state(tmp_path / "old.pt", params=params)


@pytest.mark.parametrize("steps", [0, 1], ids=["fresh", "stepped"])
def test_another_optimizers_state_dict_is_refused_with_or_without_state(stepped, steps):
    """A torch.optim.AdamW state_dict, fresh (no state: nothing but its group's keys tells)
    or stepped, and an SGD one: refused before anything changes, naming the foreign keys,
    so that AdamW's eps (1e-8) never becomes Shampoo's damping nor its weight_decay ours."""
    params, opt, _ = stepped
    groups = [{"params": group["params"]} for group in opt.param_groups]
    for other in (torch.optim.AdamW(groups), torch.optim.SGD(groups, lr=0.1, momentum=0.9, nesterov=True)):
        for _ in range(steps):
            for p in params.values():
                p.grad = torch.ones_like(p)
            other.step()
        rejects(opt, other.state_dict(), r"param_groups\[0\] holds .*: the state_dict of another optimizer")


def test_a_state_dict_saved_with_nesterov_beside_no_momentum_loads():
    """Before nesterov took None it defaulted to True, which changed nothing with mu = 0; such
    saved configs load (adapter and functional) as None, the same steps."""
    params = parameters()
    opt, _ = make_optimizer(params, solver="eigh", mu=0.0)
    state_dict = opt.state_dict()
    for group in state_dict["param_groups"]:
        group["nesterov"] = True
    opt.load_state_dict(state_dict)
    assert [group["nesterov"] for group in opt.param_groups] == [None, None]
    state = dash_fn.init(model_values(), dash_fn.DashConfig(block_size=16, solver="eigh"))
    saved = dash_fn.state_to_dict(state)
    saved["config"]["nesterov"] = True
    assert dash_fn.state_from_dict(state, saved)["config"].nesterov is None
