"""The GPU default, float16 tensor-core products, executed on the CPU; and the devices that refuse them.

``DashConfig()`` resolves ``precision="auto"`` to ``torch.bmm(a16, b16, out_dtype=float32)`` on
CUDA and XPU. The CPU has no such kernel, so these tests run it through a stand-in with CUDA's
contract (benchmarks/tensor_core_stand_in.py): registered for the whole simulated accelerator pass
(tests/conftest.py), and for a test alone in the main pass. A device that refuses the kernel
(the facts of :class:`dash_fn.roots.matmul.TensorCoreFacts`, faked here) falls back to float32
under "auto" with one notice, and refuses an explicit 16-bit precision at ``init``.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

import dash_fn
from benchmarks.syncs import SyncCounter, inspecting_backend
from benchmarks.tensor_core_stand_in import process_stand_in, tensor_core_stand_in
from conftest import mixed_params, random_grads
from dash_fn import state as state_module
from dash_fn.roots import matmul
from dash_fn.roots.matmul import PLAIN, Products, TensorCoreFacts, products_for, tensor_core_refusal
from dash_fn.strategy import simulated_accelerator, simulating

CPU = torch.device("cpu")
FLOAT16_TENSOR_CORES = Products("float16", "tensor_core")


@pytest.fixture
def stand_in():
    """The stand-in, under the accelerator strategy: the process's in the simulated accelerator
    pass, else registered for this test alone."""
    if simulating():
        registered = process_stand_in()
        assert registered is not None, "tests/conftest.py registers the stand-in for the simulated accelerator pass"
        yield registered
        return
    with tensor_core_stand_in() as registered, simulated_accelerator():
        yield registered


@pytest.mark.accelerator
def test_auto_is_float16_on_tensor_cores_in_the_accelerator_pass():
    """In the simulated accelerator pass "auto" resolves as on a GPU, to float16 tensor-core
    products (tests/conftest.py registers the stand-in for the process); in the main pass,
    under the CPU strategy, to the CPU's float32."""
    assert products_for("auto", CPU) == (FLOAT16_TENSOR_CORES if simulating() else PLAIN)


@pytest.mark.accelerator
def test_the_default_step_runs_the_tensor_core_products_eager_and_compiled(stand_in):
    """DashConfig() as a GPU runs it: "auto" is float16 on tensor cores (not float32), every step
    calls the kernel, eager with no host sync after the first step and compiled (aot_eager,
    fullgraph) to one graph with nothing a CUDA graph would skip; finite, and the two agree
    to float16's rounding."""
    config = dash_fn.DashConfig(block_size=8, inv_root_freq=3)
    assert products_for(config.precision, CPU) == FLOAT16_TENSOR_CORES
    params = mixed_params(shapes={"w": (24, 20), "thin": (2, 40), "b": (20,)})
    graphs: list = []
    compiled = torch.compile(dash_fn.step, fullgraph=True, backend=inspecting_backend(graphs))
    runs = {}
    for name, step in (("eager", dash_fn.step), ("compiled", compiled)):
        state, current, counter, calls = dash_fn.init(params, config), params, SyncCounter(), []
        for t in range(1, 7):
            before = stand_in.calls
            # eager: the ops that would wait on a GPU, counted after the first step; compiled:
            # the graph's nodes (a dispatch mode cannot watch a compiled call)
            with counter if name == "eager" and t > 1 else contextlib.nullcontext():
                current, state = step(current, random_grads(current, t), state, lr=torch.tensor(1e-2))
            calls.append(stand_in.calls - before)
        assert all(n > 0 for n in calls), (name, calls)
        assert counter.syncs == [], (name, counter.syncs)
        assert all(torch.isfinite(x).all() for x in current.values()), name
        runs[name] = current
    assert len(graphs) == 1 and graphs[0][1] == [], graphs[0][1][:1]
    float16_node = sum(
        node.target is torch.ops.aten.bmm.dtype for node in graphs[0][0].graph.nodes if node.op == "call_function"
    )
    assert float16_node > 0
    for k in params:
        moved = (runs["eager"][k] - params[k]).norm()
        assert (runs["compiled"][k] - runs["eager"][k]).norm() <= 1e-3 * moved + 1e-7, k


def test_the_stand_in_keeps_cudas_contract():
    """The stand-in raises where CUDA's kernel raises and multiplies the 16-bit operands exactly
    with float32 accumulation: each product of two float16 numbers is exact in float32."""
    a, b = torch.randn(3, 4, 5).half(), torch.randn(3, 5, 6).half()
    with tensor_core_stand_in() as stand_in:
        got = torch.bmm(a, b, out_dtype=torch.float32)
        assert got.dtype == torch.float32 and stand_in.calls == 1
        want = a.double() @ b.double()
        assert (got.double() - want).abs().max() <= 1e-6 * want.abs().max()
        assert torch.bmm(a.bfloat16(), b.bfloat16(), out_dtype=torch.float32).dtype == torch.float32
        for args, message in [
            ((a[0], b[0]), "batch1 must be a 3D tensor"),
            ((a, b[:2]), "Expected size for first two dimensions of batch2"),
            ((a, b.bfloat16()), "must have the same dtype"),
            ((a.float(), b.float(), torch.float16), "out_dtype must be the same as input dtype or fp32"),
            ((a, b, torch.bfloat16), "out_dtype must be the same as input dtype or fp32"),
        ]:
            with pytest.raises(RuntimeError, match=message):
                torch.bmm(*args[:2], out_dtype=args[2] if len(args) > 2 else torch.float32)
    with pytest.raises(NotImplementedError, match="bmm.dtype"):  # gone with the block: CPU torch's own refusal
        torch.bmm(a, b, out_dtype=torch.float32)


GOOD = TensorCoreFacts("cuda", kernel=True, capability=(9, 0))


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (GOOD, None),
        (TensorCoreFacts("cuda", kernel=True, capability=(7, 0)), None),
        (TensorCoreFacts("cuda", kernel=True, capability=(6, 1)), "compute capability 6.1 has no tensor cores"),
        (TensorCoreFacts("cuda", kernel=True, capability=(9, 0), rocm_ck=True), "CK BLAS backend"),
        (TensorCoreFacts("cuda", kernel=True, capability=(9, 0), fp16_accumulation=True), "allow_fp16_accumulation"),
        (TensorCoreFacts("xpu", kernel=False), "no xpu kernel for torch.bmm"),
    ],
    ids=["h100", "volta", "pascal", "rocm-ck", "fp16-accumulation", "old-xpu-torch"],
)
def test_each_static_fact_decides_the_verdict(facts, reason):
    refusal = tensor_core_refusal(facts)
    assert refusal is None if reason is None else reason in refusal


@pytest.fixture
def faked_device(monkeypatch):
    """The meta device as a tensor-core device whose facts the test sets (``faked(facts)``):
    init and resolution take them as they would a GPU's."""
    monkeypatch.setattr(matmul, "TENSOR_CORE_DEVICES", (*matmul.TENSOR_CORE_DEVICES, "meta"))
    monkeypatch.setattr(state_module, "_noticed", set())

    def faked(facts: TensorCoreFacts):
        monkeypatch.setattr(matmul, "tensor_core_facts", lambda device: facts)
        matmul.forget_device_verdicts()

    yield faked
    matmul.forget_device_verdicts()


@pytest.fixture
def notices():
    """What the dash_fn logger says while the test runs (pytest's logging plugin is off:
    pyproject.toml)."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("dash_fn")
    logger.addHandler(handler)
    yield said
    logger.removeHandler(handler)


@pytest.mark.parametrize(
    "refusing",
    [
        TensorCoreFacts("cuda", kernel=True, capability=(6, 1)),
        TensorCoreFacts("cuda", kernel=True, capability=(9, 0), rocm_ck=True),
        TensorCoreFacts("cuda", kernel=True, capability=(9, 0), fp16_accumulation=True),
        TensorCoreFacts("xpu", kernel=False),
    ],
    ids=["pascal", "rocm-ck", "fp16-accumulation", "old-xpu-torch"],
)
def test_a_refusing_device_falls_back_to_float32_with_one_notice(faked_device, notices, refusing):
    """ "auto" on a device that refuses 16-bit products: float32, said once through the dash_fn
    logger however many states are made; an explicit 16-bit precision there: a ValueError at
    init naming the reason. The same device with good facts resolves to float16."""
    meta = torch.device("meta")
    params = {"w": torch.empty(24, 16, device=meta)}
    faked_device(GOOD)
    dash_fn.init(params, dash_fn.DashConfig(block_size=8))
    assert products_for("auto", meta) == FLOAT16_TENSOR_CORES
    faked_device(refusing)
    for _ in range(2):
        dash_fn.init(params, dash_fn.DashConfig(block_size=8))
    assert products_for("auto", meta) is PLAIN
    assert len(notices) == 1 and tensor_core_refusal(refusing) in notices[0]
    for precision in ("float16", "bfloat16"):
        with pytest.raises(ValueError, match=rf"precision='{precision}' needs 16-bit products .*: "):
            dash_fn.init(params, dash_fn.DashConfig(block_size=8, precision=precision))
    dash_fn.init(params, dash_fn.DashConfig(block_size=8, precision="float32"))  # no error, no notice
    assert len(notices) == 1


def test_the_verdict_is_taken_at_init_and_kept(faked_device, monkeypatch):
    """A fact that changes after init (a flag set mid-run) does not change what the steps
    multiply in: the verdict is the device's, taken once."""
    meta = torch.device("meta")
    faked_device(GOOD)
    dash_fn.init({"w": torch.empty(24, 16, device=meta)}, dash_fn.DashConfig(block_size=8))
    monkeypatch.setattr(matmul, "tensor_core_facts", lambda device: TensorCoreFacts("cuda", True, (6, 1)))
    assert products_for("auto", meta) == FLOAT16_TENSOR_CORES


@pytest.mark.sets_accelerator
def test_without_the_kernel_the_simulated_accelerator_trains_in_float32(notices, monkeypatch):
    """The accelerator strategy on a CPU whose torch lacks the kernel (no stand-in): "auto" is
    float32 with the notice, the steps run, and they equal the explicit float32 run bitwise."""
    matmul.forget_device_verdicts()
    monkeypatch.setattr(state_module, "_noticed", set())
    params = mixed_params(shapes={"w": (24, 20), "b": (20,)})
    runs = []
    with simulated_accelerator():
        for precision in ("auto", "float32"):
            state, current = dash_fn.init(params, dash_fn.DashConfig(block_size=8, precision=precision)), params
            for t in range(1, 5):
                current, state = dash_fn.step(current, random_grads(current, t), state, lr=1e-2)
            runs.append(current)
        assert products_for("auto", CPU) is PLAIN
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in params)
    assert len(notices) == 1 and "has no cpu kernel for torch.bmm" in notices[0]
    matmul.forget_device_verdicts()
