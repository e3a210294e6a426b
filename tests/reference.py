"""A plain float64 per-block reference of docs/ALGORITHM.md: the oracle for dash_fn.step.

Written independently of dash_fn's code: no stacking, no shared helpers; loops over parameters
and blocks, one small dict of state per block, everything in float64. Only the DashConfig
(plain data) is shared. Root solvers: eigh with the four heuristics.
"""

from __future__ import annotations

import torch

f64 = torch.float64


def eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str) -> torch.Tensor:
    """Inverse p-th root of one symmetric block, docs/ALGORITHM.md 5.1."""
    n = X.shape[0]
    mu, Q = torch.linalg.eigh(X + eps * torch.eye(n, dtype=f64))
    lam = mu - eps
    if heuristic == "shampoo":
        d = mu - min(float(lam.min()), 0.0)
        scale = d ** (-1.0 / p)
    elif heuristic == "abs":
        scale = mu.abs() ** (-1.0 / p)
    elif heuristic == "abs_add":
        scale = (lam.abs() + eps) ** (-1.0 / p)
    elif heuristic == "relu":
        scale = torch.tensor([0.0 if l < eps else float(m) ** (-1.0 / p) for l, m in zip(lam, mu)], dtype=f64)
    return Q @ torch.diag(scale) @ Q.T


def split(length: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, length)) for start in range(0, length, size)]


class ReferenceDash:
    def __init__(self, params: dict, config, root=None):
        self.c = config
        self.t = 0
        self.root = root or (lambda X, p: eigh_root(X, p, config.eps, config.eigh_heuristic))
        self.state = {}
        for name, W in params.items():
            squeezed = [d for d in W.shape if d != 1]
            if W.numel() == 0:
                kind = "empty"
            elif len(squeezed) >= 2:
                kind = "matrix"
            else:
                kind = "segments" if config.one_dim == "shampoo" else "adamw"
            st = {"kind": kind}
            if kind == "matrix":
                R = squeezed[0]
                C = W.numel() // R
                st["view"] = (R, C)
                st["blocks"] = [
                    self._new_block(r1 - r0, c1 - c0, (r0, r1, c0, c1), two_sided=True)
                    for (r0, r1) in split(R, config.block_size)
                    for (c0, c1) in split(C, config.block_size)
                ]
            elif kind == "segments":
                n = W.numel()
                st["view"] = (n, 1)
                st["blocks"] = [
                    self._new_block(r1 - r0, 1, (r0, r1, 0, 1), two_sided=False)
                    for (r0, r1) in split(n, config.block_size)
                ]
            elif kind == "adamw":
                st["m"] = torch.zeros(W.numel(), dtype=f64)
                st["v"] = torch.zeros(W.numel(), dtype=f64)
            self.state[name] = st
        self._number_blocks()

    def _number_blocks(self):
        """The staggered schedule's block numbers: blocks of one shape (in parameter order,
        row-major) after those of the shapes met before it; a block's phase is its number mod f."""
        blocks = [blk for st in self.state.values() for blk in st.get("blocks", [])]
        shapes = []
        for blk in blocks:
            if blk["A"].shape + ("R" in blk,) not in shapes:
                shapes.append(blk["A"].shape + ("R" in blk,))
        number = 0
        for shape in shapes:
            for blk in blocks:
                if blk["A"].shape + ("R" in blk,) == shape:
                    blk["phase"] = number % self.c.inv_root_freq
                    number += 1

    @staticmethod
    def _new_block(r, c, where, two_sided):
        b = {
            "where": where,
            "L": torch.zeros(r, r, dtype=f64),
            "Lbar": torch.eye(r, dtype=f64),
            "A": torch.zeros(r, c, dtype=f64),
            "Gt": torch.zeros(r, c, dtype=f64),
            "M": torch.zeros(r, c, dtype=f64),
        }
        if two_sided:
            b["R"] = torch.zeros(c, c, dtype=f64)
            b["Rbar"] = torch.eye(c, dtype=f64)
        return b

    def staggered(self) -> bool:
        """The schedule of an eager step: "auto" is periodic on the CPU strategy, staggered on
        the accelerator strategy (simulated here on CPU tensors)."""
        if self.c.refresh_schedule == "auto":
            from dash_fn.strategy import simulating

            return simulating()
        return self.c.refresh_schedule == "staggered"

    def refresh(self, t: int, blk) -> bool:
        s, f = self.c.start_prec_step, self.c.inv_root_freq
        if self.staggered():
            return t >= s and (t - s) % f == blk["phase"]
        return t == s or (t > s and t % f == 0)

    def preconditioned(self, t: int, blk) -> bool:
        """Whether the block's direction is Shampoo's (else Adam's): from start_prec_step on,
        and under the staggered schedule once the block has had its first refresh."""
        s = self.c.start_prec_step
        return t >= s + (blk["phase"] if self.staggered() else 0)

    def step(self, params: dict, grads: dict, lr: float) -> dict:
        c = self.c
        self.t += 1
        t = self.t
        out = {}
        for name, W in params.items():
            st = self.state[name]
            W64 = W.to(f64).clone()
            g = grads[name].to(f64)
            if st["kind"] == "empty":
                out[name] = W.clone()
                continue
            if st["kind"] == "adamw":
                w = W64.reshape(-1)
                gv = g.reshape(-1)
                st["m"] = c.adamw_beta1 * st["m"] + (1 - c.adamw_beta1) * gv
                st["v"] = c.adamw_beta2 * st["v"] + (1 - c.adamw_beta2) * gv * gv
                mhat = st["m"] / (1 - c.adamw_beta1**t)
                vhat = st["v"] / (1 - c.adamw_beta2**t)
                w = w * (1 - lr * (c.weight_decay if c.weight_decay_1d is None else c.weight_decay_1d)) - lr * mhat / (
                    c.adamw_eps + vhat.sqrt()
                )
                out[name] = w.reshape(W.shape).to(W.dtype)
                continue
            view = W64.reshape(st["view"])
            gview = g.reshape(st["view"])
            decay = (
                c.weight_decay
                if st["kind"] == "matrix"
                else (c.weight_decay if c.weight_decay_1d is None else c.weight_decay_1d)
            )
            new_view = view * (1 - lr * decay)
            for blk in st["blocks"]:
                r0, r1, c0, c1 = blk["where"]
                G = gview[r0:r1, c0:c1]
                two_sided = "R" in blk
                if c.beta_LR < 1:
                    blk["L"] = c.beta_LR * blk["L"] + (1 - c.beta_LR) * G @ G.T
                    if two_sided:
                        blk["R"] = c.beta_LR * blk["R"] + (1 - c.beta_LR) * G.T @ G
                else:
                    blk["L"] = blk["L"] + G @ G.T
                    if two_sided:
                        blk["R"] = blk["R"] + G.T @ G
                if c.grafting == "adam":
                    blk["A"] = c.beta_graft * blk["A"] + (1 - c.beta_graft) * G * G
                    cA = 1 - c.beta_graft**t if c.bias_correction else 1.0
                else:
                    blk["A"] = blk["A"] + G * G
                    cA = 1.0
                if self.refresh(t, blk):
                    p = 4 if two_sided else 2
                    blk["Lbar"] = self.root(blk["L"], p)
                    if two_sided:
                        blk["Rbar"] = self.root(blk["R"], p)
                if c.beta_G > 0:
                    blk["Gt"] = c.beta_G * blk["Gt"] + (1 - c.beta_G) * G
                    cG = 1 - c.beta_G**t if c.bias_correction else 1.0
                else:
                    blk["Gt"] = G
                    cG = 1.0
                D = (blk["Gt"] / cG) / (c.eps_graft + (blk["A"] / cA).sqrt())
                n = torch.linalg.norm(D)
                if not self.preconditioned(t, blk):
                    P = D
                else:
                    U = blk["Lbar"] @ blk["Gt"]
                    if two_sided:
                        U = U @ blk["Rbar"]
                    P = n * U / (torch.linalg.norm(U) + 1e-16)
                if c.mu > 0:
                    blk["M"] = c.mu * blk["M"] + P
                    P = P + c.mu * blk["M"] if c.nesterov else blk["M"]
                new_view[r0:r1, c0:c1] = new_view[r0:r1, c0:c1] - lr * P
            out[name] = new_view.reshape(W.shape).to(W.dtype)
        return out
