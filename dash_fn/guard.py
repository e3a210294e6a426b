"""The non-finite guard: a step whose gradients are not all finite changes nothing.

A NaN or Inf anywhere in the gradients (an overflowing micro-batch, a bad sample), or a
factor product ``G G^T`` that overflows, would enter the factor sums and the moments and
spoil every later step. With ``DashConfig(skip_nonfinite=True)`` (the default) ``step``
decides on the device, without a host sync, whether all of it is finite (``ok``, agreed by
every rank), and a step that is not changes nothing: parameters, factors, roots, moments,
momentum and the step counter keep their bits, and the state's ``skipped`` counter counts it.

Without host reads (compiled, or the accelerator strategy: :mod:`dash_fn.strategy`) nothing
branches on ``ok``: the updates keep their in-place form and their inputs are replaced by
identities when ``ok`` is false (decay factors by 1, added terms by -0.0, which leaves every
float, -0.0 included, bitwise unchanged), and the new parameters are selected with
``torch.where``. Eager on the CPU, where reading ``ok`` costs nothing, the step branches
instead and saves those passes. Either way, with all inputs finite the arithmetic is the
unguarded one, bit for bit. Eager on the CPU the factor EMAs of aligned blocks run inside
their products, so ``ok`` first comes from a bound on the blocks
(:func:`dash_fn.forms.products_bounded`), and only a step that fails it forms and checks the
products. Which of these forms a call takes is decided once, at its top (:mod:`dash_fn.forms`).

Where the guard acts. It wraps the step where it can: the host's verdict skips the whole step
(:func:`dash_fn.step`'s entry); on the device the inputs are masked once at the entry (the
gradient blocks, the factor products, the gradients), and the results are chosen once at the
exit (the parameters, the step counter). What it cannot wrap is the state: every EMA (factors,
moments, momentum, AdamW's) is updated in place, because a step keeps one copy of the state in
memory (buffer donation: no old state to fall back on) and may not read ``ok`` on the host (a
sync, or a break in a compiled graph). So each in-place update takes its decay through
:meth:`Guard.decay` (1 when skipped) and its added term through :meth:`Guard.masked` (-0.0 when
skipped: the entry's 0.0 would turn a stored -0.0 into 0.0), and the refresh its due flags
through :meth:`Guard.flags`: those are the only calls inside the stages.

A step that the caller marks as a refresh step (``refresh=True``) still refreshes the roots
when it is skipped, from the factors it left unchanged: so a refresh schedule counted on the
host (calls, skipped or not) loses no refresh to a skip and needs no read of ``ok``.

The learning rate is guarded too: a tensor ``lr`` (or a float a compiled step traces) that is
not a finite number >= 0 fails ``ok`` the same way (:func:`lr_in_range`), whatever
``skip_nonfinite`` says; a float is refused on the host before anything runs.

A run whose gradients keep overflowing stops learning. Where the host knows of a skip (eager on
the CPU) the ``dash_fn`` logger says so at WARNING when the count reaches 1, 10, 100, ...
(:func:`announce_skip`); elsewhere the count is read from ``state["skipped"]`` (the adapter's
``skipped_steps()``), as a host read would cost a sync.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .roots.identity import diagonal

_log = logging.getLogger("dash_fn")


def announce_skip(count: int) -> None:
    """Log at WARNING that ``count`` steps have been skipped, when ``count`` is 1, 10, 100, ...:
    once at the first skip, then at a growing interval."""
    if str(count).rstrip("0") != "1":
        return
    _log.warning(
        "dash_fn.step: %d step%s skipped so far: a gradient held a NaN or Inf, a factor product "
        "overflowed, or a tensor learning rate was not a finite number >= 0, and such a step changes "
        "nothing (parameters, state, step counter). A run whose gradients keep overflowing stops "
        "learning: check the loss scale and the learning rate (and its schedule). "
        'state["skipped"] counts them (DASH.skipped_steps()); skip_nonfinite=False lets them through. '
        "Said again at %d.",
        count,
        "" if count == 1 else "s",
        10 * count,
    )


def lr_in_range(lr, device: torch.device) -> torch.Tensor | None:
    """Whether a learning rate that the host has not checked is a finite number >= 0 (0-d
    bool): a tensor (its value lives on the device), or a float that a compiled step traces
    as a symbol. None for a float the host has checked (``dash_fn.inputs``). A step whose lr
    fails changes nothing and is counted, as a non-finite gradient's: a NaN lr would turn
    every weight NaN, a negative one step uphill."""
    if not isinstance(lr, torch.Tensor):
        if not torch.compiler.is_compiling():
            return None
        # arithmetic with the float, as the update does: Dynamo keeps it an input of the
        # graph (torch.as_tensor would specialize it: a recompile for every new value)
        lr = torch.zeros((), dtype=torch.float64, device=device) + lr
    return torch.isfinite(lr) & (lr >= 0)


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


@dataclass(frozen=True)
class Guard:
    """Whether a step counts, applied at the points the algorithm names: decays (:meth:`decay`),
    added terms (:meth:`masked`), results (:meth:`choose`).

    ``ok`` is a 0-d bool on the device, or None where the plain arithmetic runs (every input
    known to be finite, or the guard off), for which every method is the identity.
    ``skipped``: the step is known on the host to be skipped (eager on the CPU), so the caller
    changes nothing instead of masking."""

    ok: torch.Tensor | None = None
    skipped: bool = False

    def decay(self, factor: float, dtype: torch.dtype):
        """A decay factor that is 1 when the step is skipped."""
        if self.ok is None:
            return factor
        one = torch.ones((), dtype=dtype, device=self.ok.device)
        return torch.where(self.ok, torch.full((), factor, dtype=dtype, device=self.ok.device), one)

    def masked(self, x: torch.Tensor, identity: float) -> torch.Tensor:
        """``x``, or ``identity`` everywhere when the step is skipped."""
        if self.ok is None:
            return x
        return torch.where(self.ok, x, torch.full((), identity, dtype=x.dtype, device=x.device))

    def choose(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new`` when the step counts, else ``old``."""
        return new if self.ok is None else torch.where(self.ok, new, old)

    def count_skip(self, skipped: torch.Tensor) -> None:
        """Add 1 to the ``skipped`` counter when the step is skipped (on the device)."""
        if self.ok is not None:
            skipped.add_(~self.ok)

    def flags(self, due: torch.Tensor) -> torch.Tensor:
        """``due`` where the step counts, else False."""
        return due if self.ok is None else due & self.ok
