"""Batched inverse p-th roots of stacks of symmetric PSD blocks, and the per-block fallback.

Every solver maps a (K, b, b) stack and an order p to a (K, b, b) stack of ``X^{-1/p}``
(of the solver's regularized X), block by block, with a fixed amount of work and no global RNG.
The matmul solvers (ndb, cn, chebyshev) have no host syncs and no data-dependent Python
branches, so they trace under ``torch.compile(fullgraph=True)`` and CUDA graphs capture them.
eigh traces too, but ``torch.linalg.eigh`` reads its error flags on the host once per call
(LAPACK's or cuSOLVER's ``info``): a sync on a GPU, which CUDA graphs cannot capture; the CPU
strategies run it as an op of their own (:mod:`dash_fn.roots.eigh_cpu`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import PRECONDITIONERS, DashConfig, check_solver_options, ndb_serves
from ..strategy import CPU, Strategy, for_device
from .chebyshev import chebyshev_inverse_root
from .cn import cn_inverse_root
from .eigh import eigh_inverse_root
from .eigh_cpu import eigh_root, start_workers
from .identity import identity_matrix
from .masking import finite_blocks
from .matmul import PLAIN, Products, products_for
from .ndb import ndb_inverse_root
from .scaling import SCALINGS


def _eigh(X: torch.Tensor, p: int, config: DashConfig, start: torch.Tensor | None, product: Products = PLAIN):
    """eigh's root as a solver (it multiplies nothing: ``product`` is unused)."""
    return eigh_inverse_root(X, p, eps=config.eps, heuristic=config.eigh_heuristic, eps_rel=config.eps_rel)


@dataclass(frozen=True)
class RootSolver:
    """A root solver as a refresh runs it.

    ``root``: fn(X, p, config, start_vectors, product=PLAIN) -> X^{-1/p}, the device form.
    ``reads``: the DashConfig fields it reads (its knobs; the one list of them), besides the
    scaling's where it is ``scaled`` (matrix iterations that need the spectrum in a known
    interval: :data:`dash_fn.roots.scaling.SCALINGS`). ``workspace``: the temporaries it holds at
    its peak, in blocks per block solved (with its output block), measured with
    benchmarks/peak_memory.py (tests/test_refresh_memory.py keeps them true). ``cpu_root``: its
    form on the CPU's own ops (fn(X, p, eps, heuristic, eps_rel)), and ``cpu_workers`` what that
    form starts before a step runs; None where the device form serves the CPU too."""

    root: Callable[..., torch.Tensor]
    reads: tuple[str, ...]
    workspace: int
    scaled: bool
    cpu_root: Callable[..., torch.Tensor] | None = None
    cpu_workers: Callable[[], None] | None = None

    def __call__(self, X: torch.Tensor, p: int, config: DashConfig, start, product=PLAIN) -> torch.Tensor:
        """The device form: ``X^{-1/p}`` of a stack."""
        return self.root(X, p, config, start, product)


SOLVERS: dict[str, RootSolver] = {
    "eigh": RootSolver(_eigh, ("eps", "eps_rel", "eigh_heuristic"), 5, False, eigh_root, start_workers),
    "cn": RootSolver(cn_inverse_root, ("eps", "eps_rel", "newton_steps", "cn_tol", "cn_masking"), 8, True),
    "ndb": RootSolver(ndb_inverse_root, ("eps", "eps_rel", "newton_steps", "ndb_tol", "ndb_masking"), 12, True),
    "chebyshev": RootSolver(chebyshev_inverse_root, ("cheb_degree", "cheb_eps"), 7, True),
}


def fields_read(config: DashConfig, solver: str) -> tuple[str, ...]:
    """The DashConfig fields a root solver reads under the config's scaling: its own knobs
    and, for a scaled solver, the scaling's (every other solver knob does nothing there)."""
    entry = SOLVERS[solver]
    return entry.reads + (SCALINGS[config.scaling].reads if entry.scaled else ())


def resolve_solver(config: DashConfig, strategy: Strategy) -> str:
    """The root solver a config runs under a strategy: ``auto`` picks eigh where the CPU's ops
    serve (LAPACK beats the matmul iterations there) and, under the accelerator strategy, a
    matmul-only iteration (eigh syncs there once per call, cuSOLVER's error check, and so cannot
    be captured by CUDA graphs): NDB for roots of a power-of-two order (its square roots compose
    them) and coupled Newton for any other order. (A preconditioner's refresh may solve for
    something else: :func:`dash_fn.preconditioners.resolve_solver`.)"""
    if config.solver != "auto":
        return config.solver
    if strategy.cpu_ops:
        return "eigh"
    return "ndb" if ndb_serves(config.resolved_root_order) else "cn"


def prepare(config: DashConfig, solver: str, strategy: Strategy) -> None:
    """Check that ``solver`` (what ``auto`` picks) serves the config (:func:`check_solver_options`)
    and start what its form needs before a step runs: the CPU eigh op's threads."""
    check_solver_options(config, solver)
    workers = SOLVERS[solver].cpu_workers if solver in SOLVERS else None
    if workers is not None and strategy.cpu_ops:
        workers()


def solve(
    solver: str, X: torch.Tensor, p: int, config: DashConfig, start, strategy: Strategy, products: Products = PLAIN
) -> torch.Tensor:
    """``X^{-1/p}`` of a stack by the named solver, in the strategy's form (the CPU's own op
    where its ops serve and the solver has one: eigh's threaded op, :mod:`dash_fn.roots.eigh_cpu`),
    its products in ``products``' precision where it serves the solver (:meth:`Products.of`)."""
    entry = SOLVERS[solver]
    if entry.cpu_root is not None and strategy.cpu_ops:
        return entry.cpu_root(X, p, config.eps, config.eigh_heuristic, config.eps_rel)
    return entry.root(X, p, config, start, products.of(solver))


def uses_start_vectors(config: DashConfig, solver: str) -> bool:
    """Whether the solver scales by power iteration, which needs stored start vectors."""
    return solver in SOLVERS and SOLVERS[solver].scaled and SCALINGS[config.scaling].vectors(config) > 0


def start_vectors(size: int, config: DashConfig, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Deterministic unit start vectors (size, k) for power iteration (docs/ALGORITHM.md 6).

    Drawn from N(0, 1) by a private generator seeded from (scaling_seed, size), in float64 on
    the CPU, so every device, rank and run gets the same vectors and the global RNG is untouched.

    Args:
        size: the block size b.
        config: its ``pim_vectors`` (k, or 1 under "pi") and ``scaling_seed`` are used.
        dtype: the result's dtype.
        device: the result's device (default: the CPU).

    Returns:
        A (size, k) tensor of unit columns.
    """
    k = SCALINGS[config.scaling].vectors(config)
    generator = torch.Generator().manual_seed(config.scaling_seed * 1_000_003 + size)
    V = torch.randn(size, k, generator=generator, dtype=torch.float64)
    V = V / V.norm(dim=0, keepdim=True)
    return V.to(dtype=dtype, device=device)


def inverse_root(
    stack: torch.Tensor, p: int, config: DashConfig = DashConfig(), start: torch.Tensor | None = None
) -> torch.Tensor:
    """``X^{-1/p}`` for every block of a (K, b, b) stack of symmetric PSD matrices.

    Uses ``config.solver`` with its settings (``auto`` picks by the stack's device) and
    ``config.precision`` for its products (dash_fn.roots.matmul): with the default
    ``precision="auto"`` that is float16 tensor-core products (float32 accumulation) on CUDA and
    XPU, and float32 elsewhere; pass ``DashConfig(precision="float32")`` for float32. ``start``
    are power-iteration start vectors (b, k); by default the deterministic ones of
    ``start_vectors``. The result has the input's shape and dtype. A block on which an
    iterative solver diverged (its residual far above 1, or a Chebyshev polynomial
    extrapolated far outside its interval) comes back as NaN: the failure flag on which the
    step keeps the previous root.

    Args:
        stack: a (K, b, b) tensor of symmetric positive semi-definite matrices.
        p: the root's order, an integer >= 1 (NDB: a power of two).
        config: the solver and its settings; ``preconditioner`` must be "shampoo".
        start: (b, k) power-iteration start vectors, or None for ``start_vectors``'.

    Returns:
        A (K, b, b) tensor: ``X^{-1/p}`` of every block, NaN where a solver diverged.

    Raises:
        ValueError: ``stack`` is not (K, b, b), ``p`` is not a positive integer, the solver
            cannot take ``p``, or the config is eigenvalue-corrected.
    """
    if stack.ndim != 3 or stack.shape[-1] != stack.shape[-2]:
        raise ValueError(f"inverse_root expects a (K, b, b) stack, got shape {tuple(stack.shape)}")
    if not isinstance(p, int) or p < 1:
        raise ValueError(f"inverse_root: p must be a positive integer, got {p!r}")
    if not PRECONDITIONERS[config.preconditioner].computes_roots:
        raise ValueError(
            f"inverse_root computes roots, which preconditioner={config.preconditioner!r} does not: its config must "
            "have preconditioner='shampoo'"
        )
    strategy = for_device(stack.device)
    solver = resolve_solver(config, strategy)
    if start is None and uses_start_vectors(config, solver):
        start = start_vectors(stack.shape[-1], config, stack.dtype, stack.device)
    return solve(solver, stack, p, config, start, strategy, products_for(config.precision, stack.device, stack.dtype))


# Temporaries below this many bytes are never cut up: small chunks would starve a GPU, and each
# chunk is one more unrolled copy of the solver in a compiled graph, whose compile time grows
# with its ops (tests/test_graph_size.py). A GPU holds this much many times over.
SMALL_WORKSPACE = 2**30


def chunk_blocks(count: int, block_bytes: int, solver: str) -> int:
    """Blocks solved at once so that the solver's temporaries stay within one stack of
    ``count`` blocks (or within SMALL_WORKSPACE, whichever is larger)."""
    allowed = max(count * block_bytes, SMALL_WORKSPACE)
    return max(1, min(count, allowed // (SOLVERS[solver].workspace * block_bytes)))


def refresh_roots(
    factors: torch.Tensor,
    roots: torch.Tensor,
    p: int,
    config: DashConfig,
    start: torch.Tensor | None,
    strategy: Strategy | None = None,
    products: Products = PLAIN,
    due: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New roots for a factor stack, keeping a block's old root where its refresh fails.
    The matmul solvers multiply in ``products``' precision. ``due``
    (None: every block) says which blocks the caller will keep: a form that may read it on the
    host solves nothing when none is (traced eigh on the CPU; the caller selects by it anyway).

    docs/ALGORITHM.md 7.2: a block with a non-finite factor is solved as I (so it cannot spoil
    anything) and, like a block whose new root is non-finite, keeps its previous root.
    Returns (roots, a (K,) bool mask of the blocks that fell back) without any host sync
    (``strategy``, by default the one of the factors' device, may allow host reads).

    The stack is solved in chunks (:func:`chunk_blocks`), each written into the result, so
    that a refresh holds at most about two stacks (the result and one chunk's temporaries), or
    the result and SMALL_WORKSPACE, whichever is larger.
    eigh eagerly on the CPU with every factor finite solves the whole stack at once: there is
    no substitution stack, and the eigh op works a few blocks at a time in its threads, so the
    refresh holds its output and at most the fallback's selection (and saves the copy).
    Traced on the CPU, eigh runs this eager refresh inside one opaque op
    (:func:`_traced_cpu_eigh_refresh`).
    """
    strategy = strategy or for_device(factors.device)
    solver = resolve_solver(config, strategy)
    cpu_form = SOLVERS[solver].cpu_root is not None and strategy.cpu_ops
    if cpu_form and not strategy.host_reads:
        # eps and eps_rel as a tensor: a compiled step that met other values before gets them
        # as symbolic floats, which the op's float arguments cannot take
        eps = torch.tensor([config.eps, config.eps_rel], dtype=torch.float64)
        return _traced_cpu_eigh_refresh(factors, roots, p, eps, config.eigh_heuristic, due)
    count, size = factors.shape[0], factors.shape[-1]
    chunk = chunk_blocks(count, size * size * factors.element_size(), solver)
    finite_factor = finite_blocks(factors)
    if chunk >= count or (cpu_form and strategy.holds(finite_factor)):
        return _refresh_chunk(factors, roots, finite_factor, p, config, start, solver, strategy, products)
    out = torch.empty_like(roots)
    fell_back = []
    for a in range(0, count, chunk):
        new, failed = _refresh_chunk(
            factors[a : a + chunk],
            roots[a : a + chunk],
            finite_factor[a : a + chunk],
            p,
            config,
            start,
            solver,
            strategy,
            products,
        )
        out[a : a + chunk] = new
        fell_back.append(failed)
        del new  # before the next chunk's temporaries
    return out, torch.cat(fell_back)


def _refresh_chunk(
    factors,
    roots,
    finite_factor,
    p: int,
    config: DashConfig,
    start,
    solver: str,
    strategy: Strategy,
    products: Products,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's roots: non-finite factors solved as I, failed blocks keeping their old root
    (with host reads, the substitution and selection passes only where a flag is false)."""
    safe = factors
    if not strategy.holds(finite_factor):  # (no identity block made when every factor is finite)
        identity = identity_matrix(factors.shape[-1], factors.dtype, factors.device)
        safe = torch.where(finite_factor[:, None, None], factors, identity)
    new = solve(solver, safe, p, config, start, strategy, products)
    ok = finite_factor & finite_blocks(new)
    return strategy.select(ok[:, None, None], new, roots).contiguous(), ~ok


@torch.library.custom_op("dash_fn::cpu_eigh_refresh", mutates_args=())
def _traced_cpu_eigh_refresh(
    factors: torch.Tensor, roots: torch.Tensor, p: int, eps: torch.Tensor, heuristic: str, due: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`refresh_roots` with eigh, traced on the CPU: the eager refresh inside one op
    opaque to torch.compile, so that it reads the finiteness flags on the host (free on the
    CPU) and, with every factor finite, solves the whole stack at once with no substitution,
    selection or chunking, where a graph must run the masked form; and a staggered slice that
    is not ``due`` is not solved at all (eager steps skip it too). Same bits: each block's root
    does not depend on them."""
    if due is not None and not bool(due.any()):
        return roots.clone(), torch.zeros(roots.shape[:1], dtype=torch.bool)
    config = DashConfig(solver="eigh", eps=eps[0].item(), eps_rel=eps[1].item(), eigh_heuristic=heuristic)
    return refresh_roots(factors, roots, p, config, None, CPU)


@_traced_cpu_eigh_refresh.register_fake
def _(
    factors: torch.Tensor, roots: torch.Tensor, p: int, eps: torch.Tensor, heuristic: str, due: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(roots), factors.new_empty(factors.shape[:1], dtype=torch.bool)
