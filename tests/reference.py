"""A plain float64 per-block reference of docs/ALGORITHM.md: the oracle for dash_fn.step.

Written independently of dash_fn's code: no stacking, no shared helpers; loops over parameters
and blocks, one small dict of state per block, everything in float64. Only the DashConfig
(plain data) is shared. Root solvers: eigh with the four heuristics. Storage dtypes: each kept
kind is rounded to its dtype whenever it is assigned (and used as rounded). Thin blocks (long
side >= thin_ratio x short side) keep a full factor on their short side only (p = root_order) and
scale their long side by (d + eps)^(-1/p), d the grafting moment's sums along the short side.
Relative floor (eps_rel): eigenvalues (or diagonal entries) at or below eps_rel x the largest get
an inverse root of 0. grafting="rms": every block's direction has RMS graft_rms; "spectral": its
spectral norm (estimated as spectral_norm says) is graft_rms sqrt(max(rows, cols)). nesterov_G: the
gradient EMA is replaced by the look-ahead beta_G Gt_hat + (1 - beta_G) G wherever it is used.
preconditioner="eigenvalue_corrected" (SOAP, Vyas et al. 2024, eqs. of its Algorithm 3 with
Distributed Shampoo's first moment): a refresh replaces each factor's matrix by its eigenbasis
(eigenvectors by decreasing eigenvalue; or one orthogonal-iteration step by Gram-Schmidt from the
previous basis), G' = Q_L^T G Q_R, V = EMA(G'^2), P = Q_L [(Q_L^T Gt Q_R / cG) / (sqrt(V / cV)
+ eps_graft)] Q_R^T, no grafting, no diagonal side.
"""

from __future__ import annotations

import torch

f64 = torch.float64


def eigh_root(X: torch.Tensor, p: int, eps: float, heuristic: str, eps_rel: float = 0.0) -> torch.Tensor:
    """Inverse p-th root of one symmetric block, docs/ALGORITHM.md 5.1 (5.6 for eps_rel)."""
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
    if eps_rel > 0:
        top = float(lam.max())
        scale = torch.tensor(
            [0.0 if l <= eps_rel * top else x for l, x in zip(lam.tolist(), scale.tolist())], dtype=f64
        )
    return Q @ torch.diag(scale) @ Q.T


def eigenvectors_decreasing(X: torch.Tensor) -> torch.Tensor:
    """The eigenbasis of one symmetric block, columns by decreasing eigenvalue."""
    return torch.linalg.eigh(X)[1].flip(-1)


def gram_schmidt_step(X: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """One step of orthogonal iteration: Gram-Schmidt (twice, for float64 orthogonality) of the
    columns of X Q, in order."""
    Y = X @ Q
    out = torch.zeros_like(Y)
    for j in range(Y.shape[1]):
        v = Y[:, j].clone()
        for _ in range(2):
            v = v - out[:, :j] @ (out[:, :j].T @ v)
        out[:, j] = v / v.norm()
    return out


def rotate(blk: dict, X: torch.Tensor, back: bool = False) -> torch.Tensor:
    """``Q_L^T X Q_R`` with a block's eigenbases (``Q_L X Q_R^T`` with ``back``); a side
    without a factor is not rotated."""
    QL, QR = blk.get("Lbar"), blk.get("Rbar")
    if QL is not None:
        X = (QL if back else QL.T) @ X
    if QR is not None:
        X = X @ (QR.T if back else QR)
    return X


def spectral_norm(X: torch.Tensor, steps: int = 8) -> torch.Tensor:
    """docs/ALGORITHM.md 4 f's estimate of sigma_max(X): power iteration on X^T X from the
    squared column norms of X / max|X|, ``steps`` times, then ||X v|| with ||v|| = 1."""
    peak = float(X.abs().max())
    if peak == 0:
        return torch.zeros((), dtype=f64)
    Y = X / peak
    v = (Y * Y).sum(dim=0)
    for _ in range(steps):
        v = v / v.norm() if v.norm() > 0 else v
        v = Y.T @ (Y @ v)
        v = v / v.norm() if v.norm() > 0 else v
    return (Y @ v).norm() * peak


def split(length: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, length)) for start in range(0, length, size)]


class ReferenceDash:
    def __init__(self, params: dict, config, root=None, basis=None):
        self.c = config
        self.t = 0
        self.root = root or (lambda X, p: eigh_root(X, p, config.eps, config.eigh_heuristic, config.eps_rel))
        # p of matrix blocks: root_order; unset, inverse cube roots, or 4th under NDB (square roots only)
        self.p = config.root_order or (4 if config.solver == "ndb" else 3)
        self.corrected = config.preconditioner == "eigenvalue_corrected"
        self.basis = basis or (lambda X, Q: eigenvectors_decreasing(X))
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
                    self._new_block(r1 - r0, c1 - c0, (r0, r1, c0, c1), *self._thin(r1 - r0, c1 - c0))
                    for (r0, r1) in split(R, config.block_size)
                    for (c0, c1) in split(C, config.block_size)
                ]
            elif kind == "segments":
                n = W.numel()
                st["view"] = (n, 1)
                st["blocks"] = [
                    self._new_block(r1 - r0, 1, (r0, r1, 0, 1), True, False, p=2)
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
            if blk["A"].shape + ("L" in blk, "R" in blk) not in shapes:
                shapes.append(blk["A"].shape + ("L" in blk, "R" in blk))
        number = 0
        for shape in shapes:
            for blk in blocks:
                if blk["A"].shape + ("L" in blk, "R" in blk) == shape:
                    blk["phase"] = number % self.c.inv_root_freq
                    number += 1

    def _thin(self, r: int, c: int) -> tuple[bool, bool, int, str | None]:
        """(full left factor?, full right factor?, p, the diagonal side) of an r x c matrix block."""
        ratio, p = self.c.thin_ratio, self.p
        if r >= ratio * c:
            return False, True, p, "rows"
        if c >= ratio * r:
            return True, False, p, "cols"
        return True, True, p, None

    @staticmethod
    def _new_block(r, c, where, left, right, p, diagonal=None):
        b = {
            "where": where,
            "p": p,
            "diagonal": diagonal,
            "A": torch.zeros(r, c, dtype=f64),
            "Gt": torch.zeros(r, c, dtype=f64),
            "M": torch.zeros(r, c, dtype=f64),
        }
        if left:
            b["L"] = torch.zeros(r, r, dtype=f64)
            b["Lbar"] = torch.eye(r, dtype=f64)
        if right:
            b["R"] = torch.zeros(c, c, dtype=f64)
            b["Rbar"] = torch.eye(c, dtype=f64)
        return b

    def diagonal_root(self, d: torch.Tensor) -> torch.Tensor:
        """(d + eps)^(-1/p) entrywise, 0 where d <= eps_rel max(d) (where d = 0 at eps_rel = 0)."""
        floor, p = self.c.eps_rel * float(d.max()), self.p
        return torch.tensor([0.0 if x <= floor else (x + self.c.eps) ** (-1.0 / p) for x in d.tolist()], dtype=f64)

    def keep(self, field: str, x: torch.Tensor) -> torch.Tensor:
        """``x`` as stored under the config's storage dtype ``field`` (None: as it is)."""
        name = getattr(self.c, field)
        return x if name is None else x.to(getattr(torch, name)).to(f64)

    def staggered(self) -> bool:
        return self.c.refresh_schedule == "staggered"

    def refresh(self, t: int, blk) -> bool:
        s, f, w = self.c.start_prec_step, self.c.inv_root_freq, self.c.inv_root_warmup
        if s <= t < s + w:  # a warm-up step: every root
            return True
        if self.staggered():
            return t >= s and (t - s) % f == blk["phase"]
        return t == s or (t > s and t % f == 0)

    def preconditioned(self, t: int, blk) -> bool:
        """Whether the block's direction is Shampoo's (else Adam's): from start_prec_step on,
        and under the staggered schedule without a warm-up once the block has had its first
        refresh."""
        s = self.c.start_prec_step
        return t >= s + (blk["phase"] if self.staggered() and not self.c.inv_root_warmup else 0)

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
                sides = [k for k in ("L", "R") if k in blk]
                products = {"L": G @ G.T, "R": G.T @ G}
                for k in sides:
                    decay = c.beta_LR if c.beta_LR < 1 else 1.0
                    weight = 1 - c.beta_LR if c.beta_LR < 1 else 1.0
                    blk[k] = self.keep("factor_dtype", decay * blk[k] + weight * products[k])
                if self.refresh(t, blk):
                    for k in sides:
                        new = self.basis(blk[k], blk[k + "bar"]) if self.corrected else self.root(blk[k], blk["p"])
                        blk[k + "bar"] = self.keep("root_dtype", new)
                seen = rotate(blk, G) if self.corrected else G
                if c.grafting != "adagrad":
                    blk["A"] = self.keep("graft_dtype", c.beta_graft * blk["A"] + (1 - c.beta_graft) * seen * seen)
                    cA = 1 - c.beta_graft**t if c.bias_correction else 1.0
                else:
                    blk["A"] = self.keep("graft_dtype", blk["A"] + seen * seen)
                    cA = 1.0
                if c.beta_G > 0:
                    blk["Gt"] = self.keep("grad_ema_dtype", c.beta_G * blk["Gt"] + (1 - c.beta_G) * G)
                    cG = 1 - c.beta_G**t if c.bias_correction else 1.0
                else:
                    blk["Gt"] = G
                    cG = 1.0
                momentum = blk["Gt"]
                if c.nesterov_G:
                    momentum, cG = c.beta_G * blk["Gt"] / cG + (1 - c.beta_G) * G, 1.0
                if self.corrected:
                    P = rotate(blk, (rotate(blk, momentum) / cG) / (c.eps_graft + (blk["A"] / cA).sqrt()), back=True)
                    if c.mu > 0:
                        blk["M"] = c.mu * blk["M"] + P
                        P = P + c.mu * blk["M"] if c.nesterov is not False else blk["M"]  # None: Nesterov
                    new_view[r0:r1, c0:c1] = new_view[r0:r1, c0:c1] - lr * P
                    continue
                D = (momentum / cG) / (c.eps_graft + (blk["A"] / cA).sqrt())
                norm = spectral_norm if c.grafting == "spectral" else torch.linalg.norm
                if c.grafting == "rms":
                    n = c.graft_rms * D.numel() ** 0.5
                elif c.grafting == "spectral":
                    n = c.graft_rms * max(D.shape) ** 0.5
                else:
                    n = torch.linalg.norm(D)
                if c.grafting in ("rms", "spectral"):
                    D = n * D / (norm(D) + 1e-16)
                if not self.preconditioned(t, blk):
                    P = D
                else:
                    U = momentum
                    if "L" in blk:
                        U = blk["Lbar"] @ U
                    if "R" in blk:
                        U = U @ blk["Rbar"]
                    if blk["diagonal"] == "rows":  # d_i = sum_j A_ij: diag(G G^T)'s EMA
                        U = self.diagonal_root(blk["A"].sum(dim=1))[:, None] * U
                    elif blk["diagonal"] == "cols":
                        U = U * self.diagonal_root(blk["A"].sum(dim=0))[None, :]
                    P = n * U / (norm(U) + 1e-16)
                if c.mu > 0:
                    blk["M"] = c.mu * blk["M"] + P
                    P = P + c.mu * blk["M"] if c.nesterov is not False else blk["M"]  # None: Nesterov
                new_view[r0:r1, c0:c1] = new_view[r0:r1, c0:c1] - lr * P
            out[name] = new_view.reshape(W.shape).to(W.dtype)
        return out
