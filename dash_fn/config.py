"""DashConfig: every knob of the optimizer, validated once at construction.

Defaults follow docs/ALGORITHM.md section 9. The config is a frozen dataclass so that it can be
stored in the state as non-tensor data, hashed, and treated as a constant by torch.compile.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .foreign import unknown_option_message

SOLVERS = ("eigh", "cn", "ndb", "chebyshev", "qr", "auto")
SCALINGS = ("fro", "pi", "pim")
EIGH_HEURISTICS = ("shampoo", "abs", "abs_add", "relu")
GRAFTINGS = ("adam", "adagrad", "rms", "spectral")


@dataclass(frozen=True)
class Choice:
    """What a preconditioner accepts (its mechanics: :mod:`dash_fn.preconditioners`): the
    ``solvers`` its refresh takes ("auto" among them), the ``graftings`` that apply, and
    whether it ``computes_roots`` (then root_order and eps_rel concern it, and each root
    solver's own constraints apply)."""

    solvers: tuple[str, ...]
    graftings: tuple[str, ...]
    computes_roots: bool
    why_graftings: str = ""


PRECONDITIONERS = {
    "shampoo": Choice(("eigh", "cn", "ndb", "chebyshev", "auto"), GRAFTINGS, computes_roots=True),
    "eigenvalue_corrected": Choice(
        ("eigh", "qr", "auto"),
        ("adam", "adagrad"),
        computes_roots=False,
        why_graftings="Adam's second moment in the eigenbasis sets each entry's scale",
    ),
}
ONE_DIM = ("adamw", "shampoo")
REFRESH_SCHEDULES = ("staggered", "periodic")
DTYPES = ("float32", "bfloat16", "float16")
PRECISIONS = ("auto", "float32", "tf32", "bfloat16", "float16")  # dash_fn.roots.matmul
STORAGE_FIELDS = ("factor_dtype", "root_dtype", "grad_ema_dtype", "graft_dtype")


@dataclass(frozen=True)
class DashConfig:
    """Hyper-parameters of DASH (block Shampoo with stacked blocks).

    Matrix parameters are cut into ``block_size`` x ``block_size`` blocks; each block keeps two
    Kronecker factors ``L = EMA(G G^T)`` and ``R = EMA(G^T G)`` whose inverse p-th roots
    precondition Nesterov's look-ahead of the gradient EMA, ``U = L^{-1/p} G R^{-1/p}`` (p = 3
    by default, 4 under NDB and with ``root_order=4``), and the result is grafted onto the norm of
    the Adam direction of the same block. The math, with every field
    in a table, is in docs/ALGORITHM.md (section 9 for the fields); field names match its
    symbols. Section numbers below refer to that document.

    The choices that matter, below in their sections: ``block_size``, ``preconditioner``,
    ``solver``, ``root_order``, ``inv_root_freq`` (and ``inv_root_warmup``), ``precision``,
    ``weight_decay``, the betas ``beta_G``, ``beta_LR``, ``beta_graft`` and ``grafting``. The
    rest are each solver's knobs and numerical guards: a solver reads only its own
    (``dash_fn.preconditioners.fields_read(config, solver)`` lists them, "auto" resolving per
    device: eigh on the CPU, where ``newton_steps``, ``cn_*``, ``ndb_*``, ``cheb_*``,
    ``qr_steps`` and the scaling fields do nothing).

    Blocking:
        - ``block_size`` = 256, int >= 1: blocks are at most B x B, vector segments at most B
          long (2.2, 2.3). Fixes the state's layout. (The paper uses 1024: docs/ALGORITHM.md
          9, "Defaults against the reference and the paper", says why 256 is the default.)

    Preconditioner:
        - ``preconditioner`` = "shampoo": "shampoo" (each block's gradient EMA multiplied by its
          factors' inverse roots, grafted onto Adam's norm) or "eigenvalue_corrected" (Adam run
          in the eigenbasis of each block's factors, SOAP's form, no grafting: 4 k). In the
          second, ``solver`` computes the eigenbases ("eigh", "qr" or "auto"), the grafting
          moment (``beta_graft``, ``eps_graft``, "adam" or "adagrad") is Adam's second moment
          in the eigenbasis; ``eps_rel`` and ``root_order`` do not apply (it computes no
          roots) and the fixed-norm graftings are refused.
        - ``qr_steps`` = 1, int >= 1: orthogonal iterations ``Q <- qr(F Q)`` per refresh of the
          "qr" basis solver, warm-started from the block's previous basis (5.7).

    Roots and solvers:
        - ``solver`` = "auto": "eigh", "cn" (coupled Newton), "ndb" (Newton-Denman-Beavers),
          "chebyshev", or "auto" (eigh on the CPU; on other devices cn, or ndb where
          the root order is a power of two) (5). Under
          ``preconditioner="eigenvalue_corrected"``: "eigh", "qr" or "auto" (eigh on the
          CPU, qr on other devices: eigh syncs there, 5.7).
        - ``newton_steps`` = 10, int >= 1: iterations of CN and of each NDB call.
        - ``inv_root_freq`` = 10, int >= 1: roots refreshed at step start_prec_step and every
          inv_root_freq-th step after it (4 d).
        - ``inv_root_warmup`` = 0, int >= 0: the first inv_root_warmup steps from
          start_prec_step refresh every root, then the schedule takes over (4 d): the factors
          change fastest while they form, and no block waits for its phase. Under the
          staggered schedule a warm-up step is a second program, picked on the host like a
          periodic refresh step (``refresh=`` of ``dash_fn.step``).
        - ``refresh_schedule`` = "staggered": "staggered" refreshes 1/inv_root_freq of every
          factor stack on every step (each root as stale at most, every step the same
          program: one graph), "periodic" every root at those steps (a refresh step costs
          several plain ones; two programs picked on the host). The same math eager or
          compiled, on every device (4 d, ``dash_fn.schedule``).
        - ``start_prec_step`` = 1, int >= 1 or math.inf: steps before it are Adam; math.inf
          never preconditions.
        - ``eps`` = 1e-10, >= 0: eigh, CN and NDB invert ``X + eps I``.
        - ``eigh_heuristic`` = "shampoo": "shampoo", "abs", "abs_add" or "relu", eigh's map
          from eigenvalues to the inverted spectrum (5.1).
        - ``eps_rel`` = 1e-5, in [0, 1): a floor relative to each factor's spectrum (5.6). eigh
          takes a pseudo-inverse root: eigenvalues at or below ``eps_rel * lambda_max`` map to
          0 (as a thin block's diagonal factor); CN and NDB invert ``X + eps I + eps_rel
          lambda_hat I``, lambda_hat the scale's own estimate of lambda_max. Chebyshev's own
          relative shift (``cheb_eps``) floors its roots' spectrum at least as high where
          eps_rel <= cheb_eps (a larger eps_rel is refused); a thin block's diagonal side takes
          the floor under every solver. 0 turns the floor off (the paper's).
        - ``root_order`` = None, None or int >= 1: p of a matrix block's roots, each side
          preconditioned by ``X^{-1/p}`` (a thin block's diagonal side too); one-sided vector
          segments keep p = 2. None is 3, except under ``solver="ndb"``, which composes square
          roots and so takes powers of two only: 4 there, Shampoo's and the paper's
          (``resolved_root_order`` gives p). eigh, CN and Chebyshev take any p (5.6).
        - ``cn_tol`` = 1e-6, > 0, and ``cn_masking`` = True: a CN block stops changing once
          max|M - I| < cn_tol (fixed trip count, no host sync).
        - ``ndb_tol`` = 1e-6, > 0, and ``ndb_masking`` = False: the same for NDB, on max|ZY - I|.
        - ``cheb_degree`` = 60, int >= 2, and ``cheb_eps`` = 1e-3, > 0: Chebyshev degree d
          (d - 1 products) and relative shift delta: the root of ``X + delta s I`` (5.4).

    Scaling:
        For the matmul solvers only; eigh needs none.

        - ``scaling`` = "pim": "fro" (s = ||X||_F), "pi" (power iteration) or "pim" (power
          iteration from several start vectors, largest estimate) (6).
        - ``scaling_const`` = 2.0, > 0: s = scaling_const * lambda_hat under pi and pim.
        - ``pi_steps`` = 10, int >= 1: power iterations.
        - ``pim_vectors`` = 16, int >= 1: start vectors of pim.
        - ``eps_power_iter`` = 1e-6, >= 0: damping, iterate on ``X + eps_power_iter I``.
        - ``scaling_dtype`` = "float32": "float32" or "float64"; scales are computed in the
          wider of this and the state dtype.
        - ``scaling_seed`` = 0, int >= 0: seed of the deterministic start vectors.

    Moments and grafting:
        - ``beta_G`` = 0.9, in [0, 1): gradient EMA; 0 uses the raw gradient (and keeps no EMA).
        - ``beta_LR`` = 0.95, in [0, 1]: factor EMA; 1 sums the factors (AdaGrad-style).
        - ``beta_graft`` = 0.95, in [0, 1): second-moment EMA of Adam grafting.
        - ``grafting`` = "adam": each block's direction takes the norm of the Adam direction
          with an EMA ("adam") or a sum ("adagrad") as second moment; or a fixed norm: a
          per-entry RMS ``graft_rms`` ("rms"), or the spectral norm ``graft_rms
          sqrt(max(rows, cols))`` ("spectral"), Muon's ``match_rms_adamw`` norm for a
          whole matrix (4 f; the moment is then kept as under "adam", for the direction
          before a block's first root and for thin blocks' diagonals).
        - ``graft_rms`` = 0.2, > 0: the per-entry RMS that sets the fixed norms.
        - ``eps_graft`` = 1e-8, > 0: eps of the Adam direction whose norm is grafted.
        - ``nesterov_G`` = True: precondition Nesterov's look-ahead of the gradient EMA,
          ``beta_G * Gt_hat + (1 - beta_G) G`` (Gt_hat bias-corrected), instead of the EMA
          itself (4 e; Muon's momentum form; False: the EMA, the paper's). With beta_G = 0
          there is no EMA to look ahead of, and the gradient is preconditioned either way.
        - ``bias_correction`` = True: bias-correct the gradient EMA and the grafting moment.
        - ``mu`` = 0.0, in [0, 1): momentum on the grafted directions (0: none, no state).
        - ``nesterov`` = None: the form of that momentum: None is Nesterov's wherever
          ``mu > 0``; True or False chooses, and needs ``mu > 0`` (with ``mu = 0`` it would
          change nothing, so it is refused).

    Decay:
        - ``weight_decay`` = 0.0, >= 0: decoupled weight decay (as torch.optim.AdamW) of
          matrices, and of vectors while weight_decay_1d is None.
        - ``weight_decay_1d`` = None, None or >= 0: decoupled decay of vectors; None follows
          weight_decay (see ``vector_decay``), 0.0 leaves biases and norms undecayed.

    Thin blocks:
        - ``thin_ratio`` = 4.0, > 1 or math.inf: a block whose long side is at least this many
          times its short side (an embedding's or a thin projection's, at the block size)
          keeps a full factor on its short side only; its long side is preconditioned by a
          diagonal factor read from the grafting moment, at no extra state (2.5, which gives
          the state per parameter). math.inf keeps every block two-sided. Fixes the state's
          layout.

    Vectors:
        - ``one_dim`` = "adamw": vectors by "adamw" (elementwise) or "shampoo" (one-sided
          Shampoo segments of block_size). Fixes the state's layout.
        - ``adamw_beta1`` = 0.9 and ``adamw_beta2`` = 0.95, in [0, 1), and ``adamw_eps`` =
          1e-8, > 0: AdamW's betas and eps for vectors.

    Precision:
        - ``precision`` = "auto": the operands of the step's large matrix products (factor
          products, root and basis iterations, preconditioning products, eigenvalue-corrected
          rotations): "float32", "tf32", "bfloat16" or "float16", with float32 accumulation
          and float32 state either way; or "auto", per device and preconditioner: on GPUs
          "float16" for Shampoo's preconditioner and "float32" for the eigenvalue-corrected one
          (each preconditioner's ``auto_precision``, ``dash_fn.preconditioners``; CUDA and
          XPU), "float32" elsewhere, CPUs included (results then differ across hardware by 16-bit rounding). A GPU that
          refuses float16 products with float32 results (compute capability below 7.0, ROCm's
          CK BLAS backend, ``allow_fp16_accumulation``, a torch without the kernel) takes
          float32 under "auto", with one notice through the ``dash_fn`` logger, and an
          explicit "float16" or "bfloat16" there is a ValueError at ``init``. A part unstable in a precision keeps
          float32 (NDB below float32; coupled Newton and Chebyshev under bfloat16). On a CPU,
          bfloat16 runs natively where it has bf16 units (AMX, AVX-512 BF16); a precision the
          device lacks is emulated: its numerics, not its speed (5.5, dash_fn.roots.matmul).

    Storage:
        None keeps the state dtype, float32 for float32 parameters (3.5).

        - ``factor_dtype``, ``root_dtype``, ``grad_ema_dtype``, ``graft_dtype`` = None: None,
          "float32", "bfloat16" or "float16", the dtype in which the factors ``F``, the
          inverse roots ``Fbar``, the gradient EMA ``Gt`` and the grafting moment ``A`` are
          kept. Computed in the state dtype, rounded once when written: "bfloat16" roots and
          gradient EMA halve those kinds (docs/ALGORITHM.md 3.5 says which tolerate it).
          Fixes the state's layout.

    Distributed:
        - ``comm_dtype`` = None: None (directions travel in the state dtype, exactly) or
          "bfloat16" (half the traffic, rounded alike on every rank) (8.3).
        - ``fsdp_blocks`` = "exact": on DTensors (FSDP2, tensor parallel), "exact" cuts blocks as
          one process does (bitwise equal to it, one all-to-all each way); "aligned" cuts them as
          one process would cut each tensor-parallel piece (nothing crosses a tensor-parallel
          edge that cuts a parameter evenly; bitwise equal at any data-parallel size with the
          same tensor-parallel degree, and to one process where every piece is a multiple of
          ``block_size``); "local" cuts them at every piece's edges (no communication, results
          depend on the layout) (8.4).

    Robustness:
        - ``skip_nonfinite`` = True: a step whose gradients hold a NaN or Inf, or whose factor
          products overflow, changes nothing (parameters, state, step counter) and is counted
          in ``state["skipped"]``, decided on the device (7.5); False lets it through.

    The defaults' exponent, floor and look-ahead are the scaling study's: together they ended
    below tuned Muon at its three model sizes, at about the step cost of Shampoo's exponent and
    the plain EMA (docs/ALGORITHM.md 11). ``DashConfig.paper()`` is the DASH paper's
    recommended setting (ndb, pim, inverse 4th roots every step, eps 0, no floor, no look-ahead,
    one-sided Shampoo vectors); ``DashConfig.tuned()`` refreshes the roots every 3 steps instead
    of 10; ``config.replace(**changes)`` returns a validated copy. Every field is validated in
    ``__post_init__``: an invalid value raises ``ValueError`` naming the field and the allowed
    range.
    """

    block_size: int = 256
    preconditioner: str = "shampoo"
    qr_steps: int = 1
    solver: str = "auto"
    scaling: str = "pim"
    newton_steps: int = 10
    inv_root_freq: int = 10
    inv_root_warmup: int = 0
    refresh_schedule: str = "staggered"
    start_prec_step: float = 1  # an int >= 1, or math.inf for "never precondition"
    eps: float = 1e-10
    eigh_heuristic: str = "shampoo"
    eps_rel: float = 1e-5
    root_order: int | None = None
    cn_tol: float = 1e-6
    cn_masking: bool = True
    ndb_tol: float = 1e-6
    ndb_masking: bool = False
    cheb_degree: int = 60
    cheb_eps: float = 1e-3
    scaling_const: float = 2.0
    pi_steps: int = 10
    pim_vectors: int = 16
    eps_power_iter: float = 1e-6
    scaling_dtype: str = "float32"
    scaling_seed: int = 0
    beta_G: float = 0.9
    beta_LR: float = 0.95
    beta_graft: float = 0.95
    grafting: str = "adam"
    graft_rms: float = 0.2
    eps_graft: float = 1e-8
    nesterov_G: bool = True
    bias_correction: bool = True
    mu: float = 0.0
    nesterov: bool | None = None  # None: the Nesterov form wherever mu > 0; a bool needs mu > 0
    weight_decay: float = 0.0
    weight_decay_1d: float | None = None  # None: vectors decay with weight_decay, as in torch.optim
    thin_ratio: float = 4.0
    one_dim: str = "adamw"
    adamw_beta1: float = 0.9
    adamw_beta2: float = 0.95
    adamw_eps: float = 1e-8
    comm_dtype: str | None = None  # distributed directions travel in the state dtype, or "bfloat16"
    fsdp_blocks: str = "exact"  # DTensor pieces: blocks as one process, or at tensor-parallel edges, or at piece edges
    precision: str = "auto"
    factor_dtype: str | None = None  # storage dtypes (dash_fn.storage); None: the state dtype
    root_dtype: str | None = None
    grad_ema_dtype: str | None = None
    graft_dtype: str | None = None
    skip_nonfinite: bool = True  # a step with a NaN/Inf gradient (or an overflowing factor product) changes nothing

    def __new__(cls, *args, **fields):
        # an unknown keyword gets one short line (another optimizer's option: DASH's
        # equivalent; a misspelling: the nearest field) before the dataclass's __init__ would
        # answer with the list of every field
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise TypeError(unknown_option_message("DashConfig", unknown, FIELDS, "its fields are in help(DashConfig)"))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        _check_int(self, "block_size", 1)
        _check_int(self, "newton_steps", 1)
        _check_int(self, "inv_root_freq", 1)
        _check_int(self, "inv_root_warmup", 0)
        _check_int(self, "cheb_degree", 2)
        _check_int(self, "pi_steps", 1)
        _check_int(self, "pim_vectors", 1)
        _check_int(self, "scaling_seed", 0)
        if self.root_order is not None:
            _check_int(self, "root_order", 1)
        _check_int(self, "qr_steps", 1)
        s = self.start_prec_step
        if not (s == math.inf or (_is_int(s) and s >= 1)):
            raise ValueError(f"DashConfig.start_prec_step must be an integer >= 1 or math.inf, got {s!r}")
        _check_choice(self, "preconditioner", tuple(PRECONDITIONERS))
        _check_choice(self, "solver", SOLVERS)
        _check_choice(self, "refresh_schedule", REFRESH_SCHEDULES)
        _check_choice(self, "scaling", SCALINGS)
        _check_choice(self, "eigh_heuristic", EIGH_HEURISTICS)
        _check_choice(self, "grafting", GRAFTINGS)
        _check_choice(self, "one_dim", ONE_DIM)
        _check_choice(self, "precision", PRECISIONS)
        _check_choice(self, "scaling_dtype", ("float32", "float64"))
        _check_choice(self, "comm_dtype", (None, "bfloat16"))
        for name in STORAGE_FIELDS:
            _check_choice(self, name, (None, *DTYPES))
        _check_choice(self, "fsdp_blocks", ("exact", "aligned", "local"))
        t = self.thin_ratio
        if not (t == math.inf or (isinstance(t, (int, float)) and not isinstance(t, bool) and 1 < t < math.inf)):
            raise ValueError(f"DashConfig.thin_ratio must be a number > 1 or math.inf, got {t!r}")
        for name in ("eps", "eps_power_iter", "weight_decay", "mu"):
            _check_float(self, name, 0.0, math.inf, "[0, inf)")
        if self.weight_decay_1d is not None:
            _check_float(self, "weight_decay_1d", 0.0, math.inf, "[0, inf) or None")
        for name in ("cn_tol", "ndb_tol", "cheb_eps", "scaling_const", "graft_rms", "eps_graft", "adamw_eps"):
            _check_float(self, name, 0.0, math.inf, "(0, inf)", low_open=True)
        for name in ("beta_G", "beta_graft", "adamw_beta1", "adamw_beta2", "eps_rel"):
            _check_float(self, name, 0.0, 1.0, "[0, 1)", high_open=True)
        _check_float(self, "beta_LR", 0.0, 1.0, "[0, 1]")
        if self.mu >= 1.0:
            raise ValueError(f"DashConfig.mu must be in [0, 1), got {self.mu!r}")
        for name in ("cn_masking", "ndb_masking", "bias_correction", "nesterov_G", "skip_nonfinite"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"DashConfig.{name} must be a bool, got {getattr(self, name)!r}")
        if self.nesterov is not None and not isinstance(self.nesterov, bool):
            raise ValueError(f"DashConfig.nesterov must be None or a bool, got {self.nesterov!r}")
        if self.nesterov is not None and self.mu == 0:
            raise ValueError(
                f"DashConfig: nesterov={self.nesterov} chooses the form of the heavy-ball momentum mu, which is 0, so "
                "it would change nothing: set mu > 0 with it (e.g. mu=0.9), or leave nesterov out. (Muon's and SGD's "
                "Nesterov momentum is DASH's nesterov_G, the look-ahead of the gradient EMA beta_G, on by default)"
            )
        check_solver_options(self, self.solver)

    def replace(self, **changes) -> DashConfig:
        """A copy with some fields changed (validated again).

        Args:
            **changes: fields and their new values.

        Returns:
            The new config.

        Raises:
            TypeError: a name that is not a field.
            ValueError: a value outside its field's range.
        """
        return dataclasses.replace(self, **changes)

    @property
    def resolved_root_order(self) -> int:
        """p of a matrix block's roots: ``root_order``, or for None 3 (4 under solver "ndb")."""
        if self.root_order is not None:
            return self.root_order
        return 4 if self.solver == "ndb" else 3

    @property
    def vector_decay(self) -> float:
        """The decoupled weight decay of vectors: ``weight_decay_1d``, or ``weight_decay`` when None."""
        return self.weight_decay if self.weight_decay_1d is None else self.weight_decay_1d

    @classmethod
    def paper(cls, **changes) -> DashConfig:
        """The DASH paper's recommended setting: blocks of 1024, NDB with power-iteration
        scaling, inverse 4th roots refreshed every step, eps 0 and no relative floor, the
        gradient EMA itself (no look-ahead), vectors under one-sided Shampoo, float32 products
        (then ``changes``).

        Args:
            **changes: fields set after the preset's.

        Returns:
            The config.

        Raises:
            TypeError: a name that is not a field.
            ValueError: a value outside its field's range.
        """
        return cls(
            **{
                "block_size": 1024,
                "solver": "ndb",
                "scaling": "pim",
                "inv_root_freq": 1,
                "eps": 0.0,
                "eps_rel": 0.0,
                "root_order": 4,
                "nesterov_G": False,
                "one_dim": "shampoo",
                "precision": "float32",
                **changes,
            }
        )

    @classmethod
    def tuned(cls, **changes) -> DashConfig:
        """The defaults with roots refreshed every 3 steps instead of 10 (then ``changes``): the
        scaling study's first combination (benchmarks/RESULTS.md, "Update rules"), lower than
        the defaults at the smallest size and level with them at the larger two, for 10/3 times
        the refresh work.

        Args:
            **changes: fields set after the preset's.

        Returns:
            The config.

        Raises:
            TypeError: a name that is not a field.
            ValueError: a value outside its field's range.
        """
        return cls(**{"inv_root_freq": 3, **changes})


FIELDS = tuple(f.name for f in dataclasses.fields(DashConfig))


def check_solver_options(config: DashConfig, solver: str) -> None:
    """Raise ValueError where ``solver`` (as resolved) cannot serve the config's root_order or
    eps_rel ("auto" is checked once the device picks it)."""
    problem = _unsupported(config, solver)
    if problem is not None:
        raise ValueError(f"DashConfig: {problem}")


def _unsupported(config: DashConfig, solver: str) -> str | None:
    name = config.preconditioner
    choice = PRECONDITIONERS[name]
    if solver not in choice.solvers:
        serves = [other for other, c in PRECONDITIONERS.items() if solver in c.solvers]
        return f"preconditioner {name!r} takes solver {choice.solvers}, not {solver!r}" + (
            f" (which serves preconditioner {', '.join(map(repr, serves))})" if serves else ""
        )
    if config.grafting not in choice.graftings:
        return (
            f"preconditioner {name!r} takes no grafting ({choice.why_graftings}); grafting={config.grafting!r} "
            f"must be one of {choice.graftings}"
        )
    if not choice.computes_roots:
        return None  # eps_rel and root_order do not apply
    p = config.resolved_root_order
    if solver == "ndb" and not ndb_serves(p):
        return f"solver 'ndb' takes roots of a power-of-two order (>= 2), not root_order={p}; use eigh, cn or chebyshev"
    if solver == "chebyshev" and config.eps_rel > config.cheb_eps:
        return (
            f"solver 'chebyshev' shifts by cheb_eps={config.cheb_eps:g} relative to its scale, which floors the "
            f"spectrum only up to that: eps_rel={config.eps_rel:g} must not exceed it"
        )
    return None


def ndb_serves(root_order: int) -> bool:
    """Whether NDB computes roots of this order: powers of two from 2 (it composes square roots)."""
    return root_order >= 2 and root_order & (root_order - 1) == 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(config: DashConfig, name: str, low: int) -> None:
    value = getattr(config, name)
    if not _is_int(value) or value < low:
        raise ValueError(f"DashConfig.{name} must be an integer >= {low}, got {value!r}")


def _check_choice(config: DashConfig, name: str, choices: tuple) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"DashConfig.{name} must be one of {choices}, got {value!r}")


def _check_float(config, name, low, high, allowed, low_open=False, high_open=False) -> None:
    value = getattr(config, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        raise ValueError(f"DashConfig.{name} must be a finite number in {allowed}, got {value!r}")
