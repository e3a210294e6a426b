"""``DashConfig.precision``: every large product of a step with rounded operands and float32
accumulation (docs/ALGORITHM.md 5.5), against float64 and closed forms.

The oracles round operands independently of dash_fn: bfloat16 and float16 by torch's casts in
float64, TF32 by rounding the float64 mantissa to 11 significant bits (``torch.frexp``)."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

import dash_fn
from benchmarks.syncs import assert_one_graph_without_syncs
from conftest import mixed_params, random_grads
from dash_fn.preconditioners import config_products
from dash_fn.roots.matmul import PLAIN, Products, cpu_has_bf16_units, products_for
from dash_fn.strategy import simulated_accelerator

f64 = torch.float64
LOW = ("tf32", "bfloat16", "float16")
# the unit roundoff of each precision's operands (half an ulp of 1)
ROUNDOFF = {"tf32": 2.0**-11, "bfloat16": 2.0**-8, "float16": 2.0**-11}
# the native CPU kernel runs on any CPU (slowly where it has no bf16 units)
KERNELS = [(p, "emulated") for p in LOW] + [("bfloat16", "native_cpu")]

pytestmark = pytest.mark.filterwarnings("ignore:precision=")  # the emulation warning: tests/test_solvers.py


def rounded(x: torch.Tensor, precision: str) -> torch.Tensor:
    """``x`` rounded to ``precision``'s operands (nearest, ties to even), in float64."""
    x = x.to(f64)
    if precision == "tf32":  # 1 + 10 fraction bits: the mantissa in [0.5, 1) times 2^11, rounded
        mantissa, exponent = torch.frexp(x)
        return torch.ldexp(torch.round(mantissa * 2.0**11) / 2.0**11, exponent)
    return x.to(getattr(torch, precision)).to(f64)


def emulated(precision: str) -> Products:
    return Products(precision, "emulated")


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.to(f64) - ref) / torch.linalg.vector_norm(ref))


def operands(scale: float = 1.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(3, 24, 40, generator=gen), scale * torch.randn(3, 40, 16, generator=gen))


@pytest.mark.parametrize("precision,kernel", KERNELS)
def test_products_round_their_operands(precision, kernel):
    """Each kernel's error against float64 is of its precision's operands (n u |a||b|), far
    above float32's: a product that silently stays float32 fails. The emulation is exactly the
    float64 product of the rounded operands, up to float32 accumulation."""
    a, b = operands()
    got = Products(precision, kernel)(a, b)
    assert got.dtype == torch.float32
    err = rel_err(got, a.to(f64) @ b.to(f64))
    assert 0.05 * ROUNDOFF[precision] < err < 4 * ROUNDOFF[precision], err
    if kernel == "emulated":
        assert rel_err(got, rounded(a, precision) @ rounded(b, precision)) < 1e-6


@pytest.mark.parametrize("precision,kernel", KERNELS)
def test_products_accumulate_in_float32(precision, kernel):
    """``[1, 2^-11, ..., 2^-11] . 1`` over 2048 terms: every operand exact in every precision and
    the sum 2 - 2^-11 exact in float32; a 16-bit (or TF32) accumulator stalls at 1, where each
    2^-11 is at most half an ulp. The native CPU kernel rounds its result to bf16 once."""
    n = 2048
    a = torch.full((2, 1, n), 2.0**-11)
    a[:, 0, 0] = 1.0
    got = Products(precision, kernel)(a, torch.ones(2, n, 1))
    exact = 2 - 2.0**-11
    tolerance = 2.0**-8 * exact if kernel == "native_cpu" else 0.0
    assert (got - exact).abs().max() <= tolerance, got.flatten()


def test_float16_operands_are_scaled_into_range():
    """float16 alone flushes 1e-8 to zero and overflows at 65504; each block scaled by a power of
    two first keeps float16's relative precision at any scale, and an Inf still comes out."""
    for scale in (1e-8, 1e-4, 1e6):
        a, b = operands(scale)
        assert rel_err(Products("float16", "emulated")(a, b), a.to(f64) @ b.to(f64)) < 4 * ROUNDOFF["float16"], scale
    a, b = operands()
    a[1, 2, 3] = float("inf")
    out = Products("float16", "emulated")(a, b)
    assert not torch.isfinite(out[1]).all() and torch.isfinite(out[[0, 2]]).all()


@pytest.mark.inductor
@pytest.mark.parametrize(
    "precision,kernel", [("tf32", "emulated"), ("bfloat16", "emulated"), ("bfloat16", "native_cpu")]
)
def test_inductor_keeps_the_rounding(precision, kernel):
    """Compiled by Inductor, the products keep their rounding (a fused ``x.to(bf16).to(float32)``
    pair would be elided): the compiled product is the eager one, not the float32 product."""
    product = Products(precision, kernel)
    a, b = operands()
    compiled = torch.compile(lambda a, b: product(a * 1.0, b * 1.0), fullgraph=True, backend="inductor")
    got = compiled(a, b)
    assert rel_err(got, product(a, b).to(f64)) < 1e-6
    if kernel == "emulated":
        assert rel_err(got, rounded(a, precision) @ rounded(b, precision)) < 1e-6
    assert rel_err(got, a.to(f64) @ b.to(f64)) > 0.05 * ROUNDOFF[precision]


def test_auto_resolves_from_static_facts(monkeypatch):
    """auto: off the CPU, float16 under Shampoo's preconditioner and float32 under the
    eigenvalue-corrected one (the paired training runs); float32 on every CPU (so the suite keeps its
    bits); bfloat16 natively where the CPU has bf16 units; float64 stacks are never rounded;
    explicit float32 is the plain product on every device. (A CUDA device's facts are faked:
    this CPU build of torch has no CUDA kernels; tests/test_tensor_cores.py tests each fact.)"""
    from dash_fn.roots import matmul

    monkeypatch.setattr(matmul, "tensor_core_facts", lambda device: matmul.TensorCoreFacts("cuda", True, (9, 0)))
    monkeypatch.setattr(matmul, "_VERDICTS", {})  # the faked verdicts go with the test
    assert products_for("auto", torch.device("cuda")) == Products("float16", "tensor_core")
    corrected = dash_fn.DashConfig(preconditioner="eigenvalue_corrected")
    assert config_products(corrected, torch.device("cuda")) is PLAIN
    assert config_products(dash_fn.DashConfig(), torch.device("cuda")) == Products("float16", "tensor_core")
    assert products_for("tf32", torch.device("cuda")) == Products("tf32", "tensor_core")
    for device in ("cpu", "meta", "mps"):  # no 16-bit matrix units that auto would use: never emulated
        assert products_for("auto", torch.device(device)) is PLAIN
    native = Products("bfloat16", "native_cpu")
    assert products_for("bfloat16", torch.device("cpu")) == (native if cpu_has_bf16_units() else emulated("bfloat16"))
    assert products_for("float16", torch.device("cpu"), f64) is PLAIN
    assert products_for("float32", torch.device("cuda")) is PLAIN


# --- the step: every part multiplies in the precision ------------------------------------------


def one_block_step(config: dash_fn.DashConfig, seed: int = 0):
    """One refreshing step on an 8 x 12 matrix (one block, two sides): (W, G, W', state before,
    state after)."""
    gen = torch.Generator().manual_seed(seed)
    W = torch.randn(8, 12, generator=gen)
    G = torch.randn(8, 12, generator=gen) * 1e-3
    state = dash_fn.init({"w": W}, config)
    before = state.clone()
    refresh = True if config.refresh_schedule == "periodic" else None
    new, state = dash_fn.step({"w": W}, {"w": G}, state, lr=0.1, refresh=refresh)
    return W, G, new["w"], before, state


@pytest.mark.parametrize("precision", ["tf32", "float16"])
def test_factor_products_and_preconditioning_round_their_operands(precision):
    """After one step from zero factors, ``L = (1 - beta_LR) r(G) r(G)^T`` with r the rounding,
    and the update points along ``r(r(L^-1/p) r(G)) r(R^-1/p)`` (the roots as stored), not along
    the float32 products."""
    config = dash_fn.DashConfig(block_size=16, precision=precision, refresh_schedule="periodic")
    W, G, new, before, after = one_block_step(config)
    rG = rounded(G, precision)
    L, R = after["factors", "0", "F"][0], after["factors", "1", "F"][0]
    beta = config.beta_LR
    assert rel_err(L, (1 - beta) * rG @ rG.T) < 1e-6 and rel_err(R, (1 - beta) * rG.T @ rG) < 1e-6
    assert rel_err(L, (1 - beta) * G.to(f64) @ G.to(f64).T) > 0.05 * ROUNDOFF[precision]
    left, right = after["factors", "0", "Fbar"][0], after["factors", "1", "Fbar"][0]
    # float16 scales each operand by a power of two first: exact, so the same rounded values
    half = (rounded(left, precision) @ rG).float()
    U = rounded(half, precision) @ rounded(right, precision)
    step = (W - new).to(f64)
    direction = step / step.norm()
    assert rel_err(direction, U / U.norm()) < 1e-5
    plain = left.to(f64) @ G.to(f64) @ right.to(f64)
    assert rel_err(direction, plain / plain.norm()) > 0.05 * ROUNDOFF[precision]


def recorded_products(monkeypatch, config: dash_fn.DashConfig, accelerator: bool) -> Counter:
    """How many rounded products of each (a's block shape, b's block shape) one step on an
    8 x 12 block makes."""
    seen: Counter = Counter()
    call = Products.__call__

    def spy(self, a, b):
        if self.kernel != "plain":
            seen[tuple(a.shape[-2:]), tuple(b.shape[-2:])] += 1
        return call(self, a, b)

    monkeypatch.setattr(Products, "__call__", spy)
    with simulated_accelerator(accelerator):
        one_block_step(config)
    return seen


FACTORS = (((8, 12), (12, 8)), ((12, 8), (8, 12)))
TWO_SIDED = (((8, 8), (8, 12)), ((8, 12), (12, 12)))  # preconditioning, and the rotations
ITERATIONS = (((8, 8), (8, 8)), ((12, 12), (12, 12)))


@pytest.mark.sets_accelerator
@pytest.mark.parametrize("accelerator", [False, True])
@pytest.mark.parametrize("preconditioner", ["shampoo", "eigenvalue_corrected"])
def test_every_large_product_of_the_step_is_rounded(monkeypatch, preconditioner, accelerator):
    """float16 under both strategies: the factor products (one a side), the preconditioning
    products (one a side) or the rotations (into the bases and back, and the gradient EMA's
    move into the refreshed bases: four a side), and on the accelerator strategy coupled
    Newton's iteration or orthogonal iteration's products all run rounded; NDB (unstable in 16
    bits) runs none."""
    config = dash_fn.DashConfig(
        block_size=16, precision="float16", preconditioner=preconditioner, refresh_schedule="periodic"
    )
    seen = recorded_products(monkeypatch, config, accelerator)
    assert [seen[s] for s in FACTORS] == [1, 1], seen
    assert [seen[s] for s in TWO_SIDED] == ([1, 1] if preconditioner == "shampoo" else [4, 4]), seen
    assert all(seen[s] > 0 for s in ITERATIONS) == accelerator, seen  # eigh on the CPU strategy
    if preconditioner == "shampoo":
        ndb = recorded_products(monkeypatch, config.replace(solver="ndb", root_order=4), True)
        assert not any(ndb[s] for s in ITERATIONS), ndb


@pytest.mark.parametrize("precision", LOW)
def test_the_strategies_agree_under_each_precision(precision):
    """The CPU strategy and the accelerator strategy (simulated) run the same rounded products:
    after five steps their parameters agree to far below the precision's own effect (the
    distance to the float32 run)."""
    config = dash_fn.DashConfig(block_size=24, precision=precision, solver="cn", inv_root_freq=2, eps=1e-6)

    def train(config, accelerator):
        params = mixed_params()
        with simulated_accelerator(accelerator):
            state = dash_fn.init(params, config)
            for t in range(1, 6):
                params, state = dash_fn.step(params, random_grads(params, t), state, lr=1e-2)
        return params

    cpu, accelerator = train(config, False), train(config, True)
    full = train(config.replace(precision="float32"), False)
    start = mixed_params()
    for k in ("square", "rect", "conv"):  # the matrices (vectors take AdamW: no products)
        moved = (cpu[k] - start[k]).norm()
        assert (accelerator[k] - cpu[k]).norm() < 0.05 * (full[k] - cpu[k]).norm() + 1e-7 * moved, k
        assert (full[k] - cpu[k]).norm() > 1e-5 * moved, k


@pytest.mark.sets_accelerator
@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_a_16_bit_step_compiles_to_one_graph_without_syncs(precision):
    """float16 with coupled Newton (the GPU's solver), and bfloat16 (natively where this CPU has
    bf16 units): one graph, no host read, nothing CUDA graphs would skip, eager and compiled
    agree."""
    config = dash_fn.DashConfig(block_size=8, precision=precision, inv_root_freq=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_one_graph_without_syncs(
            config, mixed_params(shapes={"w": (24, 20), "thin": (2, 40), "b": (20,)}), random_grads
        )


@pytest.mark.parametrize("strategy", ["cpu", "accelerator"])
def test_the_guard_skips_a_step_whose_float16_products_overflow(strategy):
    """A gradient whose float32 factor products overflow (entries 1e20) is skipped under float16
    as under float32, on both strategies; entries of 1e5, above float16's range, are scaled into
    it and train."""
    config = dash_fn.DashConfig(block_size=16, precision="float16")
    W = torch.randn(8, 12)
    with simulated_accelerator(strategy == "accelerator"):
        state = dash_fn.init({"w": W}, config)
        new, state = dash_fn.step({"w": W}, {"w": torch.full((8, 12), 1e20)}, state, lr=0.1)
        assert torch.equal(new["w"], W) and int(state["skipped"]) == 1
        new, state = dash_fn.step({"w": W}, {"w": torch.randn(8, 12) * 1e5}, state, lr=0.1)
        assert torch.isfinite(new["w"]).all() and not torch.equal(new["w"], W)
        assert int(state["skipped"]) == 1
