import os

# Inductor's compile cache lives in the checkout (its .cache/, which git ignores), one folder per
# ATEN_CPU_CAPABILITY, for these processes and every subprocess they start. Set before dash_fn is
# imported: importing it sets the variable to torch's default, a /tmp folder that every checkout
# and environment on the machine would share. Inductor's cache key leaves ATEN_CPU_CAPABILITY
# out: a kernel compiled under one capability and reused under another returned NaN or corrupted
# the heap (docs/CONTRIBUTING.md, "Inductor's cache").
_capability = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".cache", f"inductor-{_capability}")
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def root_on_path(env: dict[str, str] | None = None) -> dict[str, str]:
    """A subprocess's environment (``os.environ`` unless given) with the checkout's root first on
    PYTHONPATH: the scripts and workers the tests launch import the benchmarks and examples
    packages from there (pytest's ``pythonpath`` setting reaches this process only)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


import pytest  # noqa: E402
import torch  # noqa: E402

from dash_fn.strategy import simulating  # noqa: E402

# The tests use small blocks, where OpenMP threads only add scheduling stalls (up to 300x on a
# loaded 2-core machine, measured); one thread makes their run time predictable.
torch.set_num_threads(1)

# The multi-process equality tests (DDP, FSDP2) launch one world size a strategy: 3 ranks (uneven
# shares) in the main pass, 2 in the accelerator pass (docs/CONTRIBUTING.md); ownership is the same under
# both.
DISTRIBUTED_WORLD_SIZE = 2 if simulating() else 3

if simulating():
    # The simulated accelerator pass (and the multi-process workers it launches, which import this
    # module): the CPU runs torch.bmm(a16, b16, out_dtype=float32) as a GPU does, so "auto"
    # resolves to float16 and the tensor-core code executes (benchmarks/tensor_core_stand_in.py).
    from benchmarks.tensor_core_stand_in import register_for_the_process

    register_for_the_process()

MIXED_SHAPES = {"square": (64, 64), "rect": (100, 37), "conv": (3, 5, 7, 7), "bias": (256,), "vec": (7,), "scalar": ()}


def selected_scenarios(request) -> list[str]:
    """The ``scenario`` parameters of the session's selected tests in the module that use the
    fixture asking, so that its worker runs just those (``-m compat``, ``-k``); empty when any
    selected test there reads more than one scenario's results (the worker then runs them all)."""
    wanted = set()
    for item in request.session.items:
        if item.module is not request.module or request.fixturename not in item.fixturenames:
            continue
        scenario = getattr(item, "callspec", None) and item.callspec.params.get("scenario")
        if scenario is None:
            return []
        wanted.add(scenario)
    return sorted(wanted)


def mixed_params(dtype=torch.float32, seed=0, shapes=MIXED_SHAPES):
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for k, s in shapes.items()}


def random_grads(params, step, scale=1.0, seed=0):
    """Deterministic gradients with some structure (low rank + noise) so factors are anisotropic."""
    gen = torch.Generator().manual_seed(1000 * seed + step)
    out = {}
    for k, W in params.items():
        g = torch.randn(W.shape, generator=gen, dtype=torch.float64)
        if W.ndim >= 2:
            flat = g.reshape(W.shape[0], -1)
            u = torch.randn(flat.shape[0], 1, generator=gen, dtype=torch.float64)
            v = torch.randn(1, flat.shape[1], generator=gen, dtype=torch.float64)
            g = (flat + 3 * u @ v).reshape(W.shape)
        out[k] = (scale * g).to(W.dtype)
    return out


def tensors(state):
    """The tensor leaves of a dash_fn state, by nested key."""
    return {k: v for k, v in state.exclude("config", "plan", "shard").items(include_nested=True, leaves_only=True)}


def assert_equal_states(got, want):
    """Bitwise equality of two dash_fn states, key by key."""
    got, want = tensors(got), tensors(want)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global RNG state: a draw without a generator repeats."""
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _reset_dynamo():
    """Every test compiles from scratch: no recompile-limit or counter leakage between tests."""
    torch._dynamo.reset()
    yield
