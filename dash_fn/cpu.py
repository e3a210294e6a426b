"""The CPU-only forms of the step: what the CPU strategies (:mod:`dash_fn.strategy`) run instead
of the device forms in :mod:`dash_fn.step` and :mod:`dash_fn.roots`.

Each computes what its device form computes (to within rounding, and block by block, so that a
rank holding part of a stack gets the bits of one process); each is here because it either
reads device values on the host (free on the CPU, a sync elsewhere) or uses a CPU kernel:

- :func:`fuses_factor_emas`, :func:`factor_operands`, :func:`factor_ema_in_product`: the
  factor EMA inside its product (``baddbmm``), guarded by a bound on the blocks read on the host;
- :func:`fused_adam_direction`: moments, gradient EMA and Adam direction in one pass (torch's
  fused Adam kernel);
- :func:`block_norm`: each block's direct Frobenius norm where it cannot overflow;
- :func:`eigh_root`, :func:`compiled_eigh_refresh`: the threaded eigh op, and the eager
  refresh (which reads the finiteness flags on the host) as one opaque op for compiled steps;
- :func:`all_true`: a host read of flags.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from . import guard
from .config import DashConfig
from .roots.eigh import pad_aligned, spectral_root
from .roots.identity import shifted
from .roots.matmul import aligned_width, stacked_matmul
from .storage import stored_dtype


def all_true(flags: torch.Tensor) -> bool:
    """Whether every flag holds, read on the host (eager CPU only: elsewhere a sync)."""
    return bool(flags.all())


# --- the factor EMA inside its product -------------------------------------------------------


def products_bounded(vectors: Sequence[torch.Tensor], blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether the AdamW ``vectors``' gradients are finite and every block stack's entries are
    so small that no factor product formed from it can overflow (0-d bool): one read of each.

    With n the longer side of a stack's blocks and ``|G_ij| <= sqrt(max / (4 n))`` (max: the
    dtype's largest finite value), each entry of ``G G^T`` and ``G^T G``, and each partial sum
    of one, is at most n max|G|^2 <= max / 4. A NaN or Inf fails the test (its max is not
    below the bound), as does a block merely large: the caller then checks the products
    themselves (:func:`dash_fn.guard.all_finite`)."""
    ok = guard.all_finite(vectors, ())
    for G in blocks:
        if G.numel():
            bound = math.sqrt(torch.finfo(G.dtype).max / (4 * max(G.shape[-2:])))
            low, high = torch.aminmax(G)  # one pass over G, where vector_norm(ord=inf) makes more
            ok = ok & (low >= -bound) & (high <= bound)
    return ok


def fuses_factor_emas(config: DashConfig, shard, vectors, blocks) -> bool:
    """Whether this step's factor EMAs run inside their products: always without the
    non-finite guard, else when no product can overflow (the bound agreed by every rank), so
    that a finite bound stands for the products' finiteness check; never into factors kept in
    a narrower dtype (:mod:`dash_fn.storage`), which are updated in the state dtype."""
    if stored_dtype(config, "F", shard.local.dtype) != shard.local.dtype:
        return False
    if not config.skip_nonfinite:
        return True
    return bool(shard.all_ranks(products_bounded(vectors, blocks)))


def factor_operands(a: torch.Tensor, b: torch.Tensor):
    """``(a, b)`` for :func:`factor_ema_in_product` when the product's rows are whole 64-byte
    lines, else the product ``a b`` itself (MKL rounds unaligned outputs by position, see
    :func:`dash_fn.roots.matmul.stacked_matmul`)."""
    if aligned_width(a.shape[-2], a.dtype) == a.shape[-2]:
        return a, b
    return stacked_matmul(a, b)


def factor_ema_in_product(F: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float) -> None:
    """``F <- beta F + (1 - beta) a b`` in one call: no product written, two passes over F saved."""
    F.baddbmm_(a, b, beta=beta, alpha=1 - beta if beta < 1 else 1.0)


# --- the Adam direction in one pass ------------------------------------------------------------


def fused_adam_applies(config: DashConfig, entry, G: torch.Tensor) -> bool:
    """Whether :func:`fused_adam_direction` serves this group: Adam grafting with a gradient
    EMA and bias correction (the defaults), blocks of whole 64-byte vectors, contiguous state
    in the state dtype.

    The kernel walks its tensors as flat arrays in vectors of 64 bytes with scalar code for the
    rest, which rounds differently: with whole vectors per block every entry takes the vector
    path wherever its block sits, so a rank holding part of the stack gets the bits of one
    process. The choice depends on the block shape only, never on the layout."""
    if not (config.grafting == "adam" and config.beta_G > 0 and config.bias_correction):
        return False
    block_entries = G.shape[-2] * G.shape[-1]
    whole_vectors = aligned_width(block_entries, G.dtype) == block_entries
    stored = [entry["A"], entry["Gt"]]
    return whole_vectors and all(x.is_contiguous() and x.dtype == G.dtype for x in stored)


def fused_adam_direction(
    config: DashConfig, entry, G: torch.Tensor, t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grafting moment, gradient EMA and Adam direction of one group in one pass of torch's fused
    Adam kernel (``torch.optim.Adam(fused=True)``'s), where the op-by-op form makes nine: with
    ``lr = -1`` on a zero "parameter" it leaves ``D = (Gt / cG) / (sqrt(A) / sqrt(cA) + eps)``,
    the same formula in the kernel's rounding (its EMA is a lerp). Returns ``(Gt, D)``."""
    Gt, D = entry["Gt"], torch.zeros_like(entry["A"])
    torch._fused_adam_(
        [D],
        [G.contiguous()],
        [Gt],
        [entry["A"]],
        [],
        [t],
        lr=-1.0,
        beta1=config.beta_G,
        beta2=config.beta_graft,
        weight_decay=0.0,
        eps=config.eps_graft,
        amsgrad=False,
        maximize=False,
    )
    return Gt, D


# --- block norms ----------------------------------------------------------------------------------

# a block norm in this range is taken directly: its squares neither overflow nor lose digits
# to underflow (what flushes below 1e-38 is under 1e-9 of a square sum above 1e-24)
DIRECT_NORM_RANGE = (1e-12, 1e18)


def block_norm(X: torch.Tensor, scaled_norm) -> torch.Tensor:
    """Each block's direct norm ``||X||`` where it lies in DIRECT_NORM_RANGE, ``scaled_norm``
    of the other blocks: one pass where the scaled form takes four (equal within rounding)."""
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
    low, high = DIRECT_NORM_RANGE
    outside = ((norm <= low) | (norm >= high)).flatten().nonzero().flatten()
    if outside.numel():
        norm[outside] = scaled_norm(X[outside])
    return norm


# --- eigh -------------------------------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None

# blocks a thread shifts, decomposes and reconstructs at once: 8 blocks of 256 (2 MiB) stay
# in cache between the shift, LAPACK's copy of its input and the reconstruction
CPU_CHUNK_ELEMENTS = 8 * 256 * 256


@torch.library.custom_op("dash_fn::cpu_eigh_root", mutates_args=())
def eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    """:func:`dash_fn.roots.eigh.eigh_inverse_root` of a CPU stack: the stack split over torch's
    threads, each thread shifting (``X + eps I``), padding (:func:`pad_aligned`), decomposing
    and reconstructing its own part, a few blocks at a time (:data:`CPU_CHUNK_ELEMENTS`), so
    that no pass over the whole stack precedes or follows the eighs.

    torch's batched CPU eigh runs LAPACK on one block after another, and LAPACK's own threads
    barely help at these sizes, while one single-threaded eigh per core runs them side by side
    (the figures: benchmarks/RESULTS.md). So the stack is cut into ``threads`` parts solved concurrently,
    with torch (and MKL) limited to one thread meanwhile, which is restored after. The
    reconstruction ``Q diag Q^T`` runs in the same thread, on eigenvectors still in its cache,
    and writes its part of the result (no concatenation). Each block's result does not depend
    on the split (its alignment is fixed, see :func:`pad_aligned`). An op opaque to
    torch.compile, so the thread count is read when it runs.
    """
    out = torch.empty_like(X)
    b = X.shape[-1]
    chunk = max(1, CPU_CHUNK_ELEMENTS // (b * b))

    def solve(part: slice) -> None:
        for lo in range(part.start, part.stop, chunk):
            blocks = slice(lo, min(lo + chunk, part.stop))
            padded = pad_aligned(shifted(X[blocks], eps))
            mu, Q = torch.linalg.eigh(padded)
            if padded.shape[-1] == b:
                spectral_root(mu, Q, p, eps, heuristic, out=out[blocks])
            else:  # X's root is the top-left corner
                out[blocks] = spectral_root(mu, Q, p, eps, heuristic)[..., :b, :b]

    threads = min(torch.get_num_threads(), X.shape[0])
    if threads <= 1:
        solve(slice(0, X.shape[0]))
        return out
    global _pool
    if _pool is None or _pool._max_workers < threads:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dash_fn_eigh")
    bounds = [round(i * X.shape[0] / threads) for i in range(threads + 1)]
    restore = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        list(_pool.map(solve, [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]))
    finally:
        torch.set_num_threads(restore)
    return out


@eigh_root.register_fake
def _eigh_root_fake(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    return torch.empty_like(X)


def compiled_eigh_refresh(
    factors: torch.Tensor, roots: torch.Tensor, p: int, config: DashConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dash_fn.roots.refresh_roots` with eigh, traced on the CPU: the eager refresh
    inside one op opaque to torch.compile, so that it reads the finiteness flags on the host
    (free on the CPU) and, with every factor finite, solves the whole stack at once with no
    substitution, selection or chunking, where a graph must run the masked form. Same bits:
    each block's root does not depend on them."""
    # eps as a tensor: a compiled step that met another eps before gets it as a symbolic
    # float, which the op's float argument cannot take
    return _eigh_refresh_op(factors, roots, p, torch.full((), config.eps, dtype=torch.float64), config.eigh_heuristic)


@torch.library.custom_op("dash_fn::cpu_eigh_refresh", mutates_args=())
def _eigh_refresh_op(
    factors: torch.Tensor, roots: torch.Tensor, p: int, eps: torch.Tensor, heuristic: str
) -> tuple[torch.Tensor, torch.Tensor]:
    from .roots import refresh_roots
    from .strategy import CPU

    return refresh_roots(
        factors, roots, p, DashConfig(solver="eigh", eps=eps.item(), eigh_heuristic=heuristic), None, CPU
    )


@_eigh_refresh_op.register_fake
def _(
    factors: torch.Tensor, roots: torch.Tensor, p: int, eps: torch.Tensor, heuristic: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(roots), factors.new_empty(factors.shape[:1], dtype=torch.bool)
