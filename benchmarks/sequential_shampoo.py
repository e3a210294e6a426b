"""The per-block baseline: block Shampoo as Distributed Shampoo runs it, one block at a time.

Written from docs/ALGORITHM.md section 4 for the benchmarks: the same math as dash_fn.step (Adam
grafting, factor EMAs, gradient EMA, roots from the same solver functions) but a Python loop
over blocks with one small kernel per block and operation, as a per-parameter, per-block
optimizer does. It covers matrix parameters only (the benchmark layers have no vectors).
"""

from __future__ import annotations

import torch

import dash_fn
from dash_fn.roots import SOLVERS, start_vectors, uses_start_vectors
from dash_fn.roots.matmul import products_for


class SequentialShampoo:
    def __init__(self, params: dict[str, torch.Tensor], config: dash_fn.DashConfig):
        self.config = config
        device = next(iter(params.values())).device
        self.products = products_for(config.precision, device)
        self.t = 0
        self.blocks = {}
        B = config.block_size
        self.start = {}
        for name, W in params.items():
            R, C = W.shape[0], W.numel() // W.shape[0]
            entries = []
            for r0 in range(0, R, B):
                for c0 in range(0, C, B):
                    r, c = min(B, R - r0), min(B, C - c0)
                    zeros = lambda *s, device=W.device: torch.zeros(s, device=device)
                    entries.append(
                        {
                            "where": (r0, r0 + r, c0, c0 + c),
                            "L": zeros(r, r),
                            "R": zeros(c, c),
                            "A": zeros(r, c),
                            "Gt": zeros(r, c),
                            "Lbar": torch.eye(r, device=W.device),
                            "Rbar": torch.eye(c, device=W.device),
                        }
                    )
                    for size in (r, c):
                        if uses_start_vectors(config, config.solver) and size not in self.start:
                            self.start[size] = start_vectors(size, config, device=W.device)
            self.blocks[name] = entries

    def _root(self, X: torch.Tensor) -> torch.Tensor:
        """The block's inverse root of the config's order, its products in the config's precision,
        as dash_fn's step takes them: the same math, one block at a time."""
        p, c = self.config.resolved_root_order, self.config
        return SOLVERS[c.solver](X[None], p, c, self.start.get(X.shape[-1]), self.products.of(c.solver))[0]

    @torch.no_grad()
    def step(self, params: dict, grads: dict, lr: float, refresh: bool) -> dict:
        c = self.config
        self.t += 1
        bc_G = 1 - c.beta_G**self.t
        bc_A = 1 - c.beta_graft**self.t
        out = {}
        for name, W in params.items():
            new = W.clone()
            view = new.view(W.shape[0], -1)
            G2 = grads[name].view(W.shape[0], -1)
            for blk in self.blocks[name]:
                r0, r1, c0, c1 = blk["where"]
                G = G2[r0:r1, c0:c1]
                blk["L"].mul_(c.beta_LR).add_(self.products(G[None], G.T[None])[0], alpha=1 - c.beta_LR)
                blk["R"].mul_(c.beta_LR).add_(self.products(G.T[None], G[None])[0], alpha=1 - c.beta_LR)
                blk["A"].mul_(c.beta_graft).addcmul_(G, G, value=1 - c.beta_graft)
                blk["Gt"].lerp_(G, 1 - c.beta_G)
                if refresh:
                    blk["Lbar"] = self._root(blk["L"])
                    blk["Rbar"] = self._root(blk["R"])
                D = (blk["Gt"] / bc_G) / ((blk["A"] / bc_A).sqrt() + c.eps_graft)
                U = self.products(self.products(blk["Lbar"][None], blk["Gt"][None]), blk["Rbar"][None])[0]
                view[r0:r1, c0:c1] -= (lr * D.norm() / (U.norm() + 1e-16)) * U
            out[name] = new
        return out
