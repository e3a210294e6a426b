"""The non-finite guard: a step whose gradients are not all finite changes nothing.

A NaN or Inf anywhere in the gradients (an overflowing micro-batch, a bad sample), or a
factor product ``G G^T`` that overflows, would enter the factor sums and the moments and
spoil every later step. With ``DashConfig(skip_nonfinite=True)`` (the default) ``step``
decides on the device, without a host sync, whether all of it is finite (``ok``, agreed by
every rank), and a step that is not changes nothing: parameters, factors, roots, moments,
momentum and the step counter keep their bits, and the state's ``skipped`` counter counts it.

Compiled, or on an accelerator, nothing branches on ``ok``: the updates keep their in-place
form and their inputs are replaced by identities when ``ok`` is false (decay factors by 1,
added terms by -0.0, which leaves every float, -0.0 included, bitwise unchanged), and the new
parameters are selected with ``torch.where``. Eager on the CPU, where reading ``ok`` costs
nothing, the step branches instead and saves those passes. Either way, with all inputs finite
the arithmetic is the unguarded one, bit for bit. Eager on the CPU the factor EMAs of aligned
blocks run inside their products, so ``ok`` first comes from a bound on the blocks
(:func:`products_bounded`), and only a step that fails it forms and checks the products.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .roots.identity import diagonal


def all_finite(vectors: Sequence[torch.Tensor], products: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether the AdamW ``vectors``' gradients and every factor product are finite (0-d bool).

    Every entry of a block G enters the diagonal of its left product G G^T as a square (row
    sums of squares), so a NaN or Inf in G, or a row whose sum of squares overflows, shows
    there, and a column's in G^T G; off-diagonal entries are bounded by the diagonal ones
    (Cauchy-Schwarz). So the diagonals are all that is read of the block gradients."""
    checks = [torch.isfinite(g).all() for g in vectors if g.numel()]
    checks += [torch.isfinite(diagonal(X)).all() for X in products if X.numel()]
    if not checks:
        device = next((x.device for x in [*vectors, *products]), None)
        return torch.ones((), dtype=torch.bool, device=device)
    return torch.stack(checks).all()


def products_bounded(vectors: Sequence[torch.Tensor], blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether the AdamW ``vectors``' gradients are finite and every block stack's entries are
    so small that no factor product formed from it can overflow (0-d bool): one read of each.

    With n the longer side of a stack's blocks and ``|G_ij| <= sqrt(max / (4 n))`` (max: the
    dtype's largest finite value), each entry of ``G G^T`` and ``G^T G``, and each partial sum
    of one, is at most n max|G|^2 <= max / 4. A NaN or Inf fails the test (its max is not
    below the bound), as does a block merely large: the caller then checks the products
    themselves (:func:`all_finite`)."""
    ok = all_finite(vectors, ())
    for G in blocks:
        if G.numel():
            bound = math.sqrt(torch.finfo(G.dtype).max / (4 * max(G.shape[-2:])))
            low, high = torch.aminmax(G)  # one pass; 10x faster than vector_norm(ord=inf) on CPU
            ok = ok & (low >= -bound) & (high <= bound)
    return ok


def decided_on_host(ok: torch.Tensor) -> bool:
    """Whether the step may read ``ok`` on the host and branch: eager on the CPU, where the
    read is free (compiled or on an accelerator the step decides on the device instead)."""
    return not torch.compiler.is_compiling() and ok.device.type == "cpu"


def gate(ok: torch.Tensor | None, factor: float, dtype: torch.dtype):
    """A decay factor that is 1 when the step is skipped (``factor`` itself when unguarded)."""
    if ok is None:
        return factor
    return torch.where(ok, torch.full((), factor, dtype=dtype, device=ok.device), torch.ones((), dtype=dtype, device=ok.device))


def masked(ok: torch.Tensor | None, x: torch.Tensor, identity: float) -> torch.Tensor:
    """``x``, or ``identity`` everywhere when the step is skipped."""
    return x if ok is None else torch.where(ok, x, torch.full((), identity, dtype=x.dtype, device=x.device))


def choose(ok: torch.Tensor | None, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` when the step counts, else ``old``."""
    return new if ok is None else torch.where(ok, new, old)
