"""The forms in which a step's operations run: chosen once, at the top of a call, from its
strategy (:mod:`dash_fn.strategy`), and never changing the math.

:mod:`dash_fn.step` writes the algorithm once and calls the operations below wherever their form
depends on the device. Two sets:

- :class:`DeviceForms` (the accelerator strategy, and steps traced on the CPU): no host reads
  and no branch on data, so a step never waits on the device and its graph is one straight
  line; the non-finite guard masks (:class:`dash_fn.guard.Guard`).
- :class:`HostForms` (eager on the CPU, where reading a device value costs nothing): the same
  operations in the CPU's own kernels and with shortcuts read on the host: factor EMAs inside
  their products (``baddbmm``), moments and Adam direction in torch's fused Adam kernel, a
  block's direct norm where it cannot overflow, a non-finite step skipped instead of masked,
  a staggered slice that is not due skipped.

Each host form computes what its device form computes, to within rounding, block by block, so
that a rank holding part of a stack gets the bits of one process. Both multiply in the config's
precision, in the device's kernel (:class:`dash_fn.roots.matmul.Products`, also chosen once).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import guard
from .config import DashConfig
from .grafting import GRAFTINGS
from .guard import Guard
from .roots.matmul import PLAIN, Products, aligned_width
from .roots.scaling import frobenius_scale
from .storage import ema_, stored_dtype
from .strategy import Strategy

# a block norm in this range is taken directly: its squares neither overflow nor lose digits
# to underflow (what flushes below 1e-38 is under 1e-9 of a square sum above 1e-24)
DIRECT_NORM_RANGE = (1e-12, 1e18)


def factor_sides(group, G: torch.Tensor) -> list:
    """``(factor slice, a, b)`` with ``a b`` the block's factor product: ``G G^T`` and, two-sided,
    ``G^T G``."""
    return [(side, a, b) for side, a, b in [(group.left, G, G.mT), (group.right, G.mT, G)] if side]


class DeviceForms:
    """Sync-free forms: what an accelerator runs, and every traced step."""

    # (no default for products: torch 2.11's Dynamo cannot wrap a default that is an object of
    # ours when it inlines a constructor)
    def __init__(self, strategy: Strategy, products: Products):
        self.strategy = strategy
        self.products = products

    def holds(self, flags: torch.Tensor) -> bool:
        """Whether every flag is known, without a sync, to hold (:meth:`Strategy.holds`)."""
        return self.strategy.holds(flags)

    def select(self, flags: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``torch.where(flags, new, old)``, or ``new`` where the flags are known to hold."""
        return self.strategy.select(flags, new, old)

    def products_and_guard(
        self, config: DashConfig, shard, vectors, blocks, lr_ok: torch.Tensor | None
    ) -> tuple[list, Guard]:
        """Each group's factor products ``[(factor slice, X)]`` (b) and the step's guard, on
        every rank: ``lr_ok`` (:func:`dash_fn.guard.lr_in_range`; None: nothing to check) and,
        with ``skip_nonfinite``, whether the AdamW ``vectors``' gradients and every product are
        finite (:func:`dash_fn.guard.all_finite`)."""
        products = [
            [(side, self.products.of("factors")(a, b)) for side, a, b in factor_sides(group, G)]
            for group, G in zip(shard.local.groups, blocks)
        ]
        checks = [lr_ok] if lr_ok is not None else []
        if config.skip_nonfinite:
            checks.append(guard.all_finite(vectors, [X for sides in products for _, X in sides]))
        if not checks:
            return products, Guard()
        ok = checks[0] if len(checks) == 1 else checks[0].to(checks[1].device) & checks[1]
        return products, Guard(shard.all_ranks(ok))

    def factor_ema(self, F: torch.Tensor, X, beta: float, guard: Guard, dtype: torch.dtype) -> None:
        """``F <- beta F + (1 - beta) X`` (b), the decay gated by the guard (``beta = 1``: sums)."""
        if beta < 1:
            # one write to the slice: Inductor turns each in-place op on a slice into a masked
            # scatter over the whole stack, and two of them per side into a nest of masked
            # loads (same bits as F.mul_(beta).add_(X, alpha)); a narrow F is widened for the
            # arithmetic and rounded once, when written
            F.copy_(torch.add(F.to(dtype) * guard.decay(beta, dtype), X, alpha=1 - beta))
        elif F.dtype == dtype:
            F.add_(X)
        else:
            F.copy_(F.to(dtype) + X)

    def adam_direction(self, config: DashConfig, entry, G: torch.Tensor, corrections: dict, t, guard: Guard):
        """Grafting moment (c), gradient EMA (e) and Adam direction (f) of one group's blocks:
        returns ``(Gt, D)`` (``Gt`` is G itself without a gradient EMA); decays gated by the
        guard. (The eigenvalue-corrected preconditioner, 4 k, passes G rotated into its bases.)"""
        dtype = G.dtype
        # squares as G * G, not addcmul: AOTAutograd decomposes addcmul into an fma, which rounds
        # otherwise, and the compiled step would not give eager's bits; a narrow A or Gt is
        # updated in the state dtype and rounded when stored (dash_fn.storage)
        if GRAFTINGS[config.grafting].sums:
            A = ema_(entry["A"], 1.0, G * G, 1.0)
        else:
            A = ema_(entry["A"], guard.decay(config.beta_graft, dtype), G * G, 1 - config.beta_graft)
        Gt, cG = G, None
        if config.beta_G > 0:
            decay = guard.decay(config.beta_G, dtype)
            Gt, cG = ema_(entry["Gt"], decay, guard.masked(G, -0.0), 1 - config.beta_G), corrections["G"]
        if config.nesterov_G and config.beta_G > 0:  # the look-ahead beta Gt_hat + (1 - beta) G (no EMA: G)
            Gt = torch.add((Gt if cG is None else Gt / cG) * config.beta_G, G, alpha=1 - config.beta_G)
            cG = None
        # D = (Gt / cG) / (sqrt(A) / sqrt(cA) + eps), op for op, in place on its two temporaries
        denom = A.sqrt()
        if corrections["A"] is not None:
            denom.div_(corrections["A"])
        denom.add_(config.eps_graft)
        D = Gt / denom if cG is None else (Gt / cG).div_(denom)
        return Gt, D

    def block_norm(self, X: torch.Tensor) -> torch.Tensor:
        """Frobenius norm of each block, (N, 1, 1), without overflow or underflow."""
        return frobenius_scale(X)

    def slice_to_solve(self, positions: torch.Tensor, due: torch.Tensor) -> torch.Tensor | None:
        """The staggered slice's positions to solve (all of them: the caller selects by ``due``)."""
        return positions

    def descend(self, X: torch.Tensor, update: torch.Tensor, lr) -> torch.Tensor:
        """``X - lr update`` (i)."""
        return X - lr * update


class HostForms(DeviceForms):
    """Eager on the CPU: the CPU's kernels and shortcuts read on the host (the module doc)."""

    def products_and_guard(
        self, config: DashConfig, shard, vectors, blocks, lr_ok: torch.Tensor | None
    ) -> tuple[list, Guard]:
        """As the device form, but where no product can overflow (or unguarded) the factor EMAs
        run inside their products: the product's operands ``(a, b)`` stand for it (rows of
        whole 64-byte lines; else MKL rounds by position, :func:`stacked_matmul`); and a
        step that is not finite, or whose ``lr_ok`` fails, is known here, so it is skipped
        rather than masked. (A precision below float32 multiplies in its own kernel, outside
        the EMA.)"""
        if lr_ok is not None and not bool(shard.all_ranks(lr_ok)):
            return [], Guard(skipped=True)  # a skipped step reads no products
        if (
            self.products is PLAIN
            and stored_dtype(config, "F", shard.local.dtype) == shard.local.dtype
            and (not config.skip_nonfinite or bool(shard.all_ranks(products_bounded(vectors, blocks))))
        ):
            products = [
                [(side, (a, b) if _whole_lines(a) else PLAIN(a, b)) for side, a, b in factor_sides(group, G)]
                for group, G in zip(shard.local.groups, blocks)
            ]
            return products, Guard()
        products, checked = super().products_and_guard(config, shard, vectors, blocks, None)
        if checked.ok is None or bool(checked.ok):
            return products, Guard()
        return products, Guard(skipped=True)

    def factor_ema(self, F: torch.Tensor, X, beta: float, guard: Guard, dtype: torch.dtype) -> None:
        """As the device form; from the product's operands in one ``baddbmm`` (no product
        written, two passes over F saved)."""
        if isinstance(X, tuple):
            F.baddbmm_(*X, beta=beta, alpha=1 - beta if beta < 1 else 1.0)
        else:
            super().factor_ema(F, X, beta, guard, dtype)

    def adam_direction(self, config: DashConfig, entry, G: torch.Tensor, corrections: dict, t, guard: Guard):
        """As the device form; in one pass of torch's fused Adam kernel where it applies
        (:func:`fused_adam_applies`), where the op-by-op form makes nine:
        with ``lr = -1`` on a zero "parameter" the kernel leaves ``D = (Gt / cG) / (sqrt(A) /
        sqrt(cA) + eps)``, the same formula in the kernel's rounding (its EMA is a lerp)."""
        if guard.ok is not None or not fused_adam_applies(config, entry, G):
            return super().adam_direction(config, entry, G, corrections, t, guard)
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

    def block_norm(self, X: torch.Tensor) -> torch.Tensor:
        """Each block's direct norm where it lies in DIRECT_NORM_RANGE, the scaled one of the
        others: one pass where the scaled form takes four (equal within rounding)."""
        norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
        low, high = DIRECT_NORM_RANGE
        outside = ((norm <= low) | (norm >= high)).flatten().nonzero().flatten()
        if outside.numel():
            norm[outside] = frobenius_scale(X[outside])
        return norm

    def slice_to_solve(self, positions: torch.Tensor, due: torch.Tensor) -> torch.Tensor | None:
        """None when the slice is not due; else its positions without the padding (which
        repeats the last one), so that no block is solved twice."""
        if not bool(due.all()):
            return None
        return positions[: int((positions != positions[-1]).sum()) + 1]

    def descend(self, X: torch.Tensor, update: torch.Tensor, lr) -> torch.Tensor:
        """``X + (-lr) update`` in one pass (lr is a number, or readable for free; CPU kernels
        fuse the multiply-add, as Inductor's code does)."""
        return torch.add(X, update, alpha=-float(lr))


def forms_for(strategy: Strategy, products: Products = PLAIN) -> DeviceForms:
    """The forms a call under ``strategy`` runs, multiplying with ``products``."""
    return HostForms(strategy, products) if strategy.host_reads else DeviceForms(strategy, products)


def _whole_lines(a: torch.Tensor) -> bool:
    """Whether the product ``a a^T``'s rows are whole 64-byte lines."""
    return aligned_width(a.shape[-2], a.dtype) == a.shape[-2]


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


def fused_adam_applies(config: DashConfig, entry, G: torch.Tensor) -> bool:
    """Whether the fused Adam kernel serves this group: an EMA grafting moment, a gradient EMA
    (without Nesterov's look-ahead, the paper's form) and bias correction, blocks of whole 64-byte
    vectors, contiguous state in the state dtype.

    The kernel walks its tensors as flat arrays in vectors of 64 bytes with scalar code for the
    rest, which rounds differently: with whole vectors per block every entry takes the vector
    path wherever its block sits, so a rank holding part of the stack gets the bits of one
    process. The choice depends on the block shape only, never on the layout."""
    if GRAFTINGS[config.grafting].sums or config.nesterov_G or not (config.beta_G > 0 and config.bias_correction):
        return False
    block_entries = G.shape[-2] * G.shape[-1]
    whole_vectors = aligned_width(block_entries, G.dtype) == block_entries
    stored = [entry["A"], entry["Gt"]]
    return whole_vectors and all(x.is_contiguous() and x.dtype == G.dtype for x in stored)
