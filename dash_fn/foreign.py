"""Other optimizers' option names, with what DASH takes instead: the message a user porting from
torch.optim.AdamW, Muon or Distributed Shampoo gets for a keyword DASH does not know."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

# name -> (whose name it is, DASH's equivalent or why there is none)
FOREIGN: dict[str, tuple[str, str]] = {
    "betas": (
        "torch.optim.Adam(W)'s",
        "DASH's Adam betas are beta_G (the gradient EMA, Adam's beta1, default 0.9) and beta_graft (the "
        "grafting moment, Adam's beta2, default 0.95) for matrices, adamw_beta1 and adamw_beta2 (0.9, 0.95) "
        "for vectors; beta_LR (0.95) is the Kronecker factors' EMA",
    ),
    "momentum": (
        "SGD's and Muon's",
        "DASH's heavy-ball momentum on the grafted direction is mu (default 0.0, Nesterov form with "
        "nesterov=True); beta_G (0.9) is the gradient EMA that Muon's momentum corresponds to",
    ),
    "amsgrad": ("torch.optim.Adam(W)'s", "DASH has no AMSGrad: leave it out"),
    "foreach": (
        "torch.optim's",
        "DASH always runs batched kernels on stacked blocks: leave it out",
    ),
    "fused": ("torch.optim's", "for a fused step pass compile=True (torch.compile of the whole step)"),
    "capturable": (
        "torch.optim's",
        "DASH's step makes no host sync off the CPU already; pass compile={'mode': 'reduce-overhead'} for CUDA graphs",
    ),
    "maximize": ("torch.optim's", "DASH has no maximize: minimize the negated objective"),
    "differentiable": ("torch.optim's", "DASH's step is not differentiable: leave it out"),
    "matmul_dtype": (
        "an earlier dash_fn's",
        "it became precision= ('float32', 'tf32', 'bfloat16', 'float16' or 'auto'), which covers every large product",
    ),
    "ns_steps": (
        "Muon's",
        "DASH computes inverse roots, not Newton-Schulz orthogonalization: see solver= and newton_steps=",
    ),
    "adjust_lr_fn": ("Muon's", "DASH grafts Adam's step size (grafting='adam'); grafting='spectral' is Muon's norm"),
    "max_preconditioner_dim": ("Distributed Shampoo's", "DASH's is block_size= (default 256)"),
    "precondition_frequency": ("Distributed Shampoo's", "DASH's is inv_root_freq= (default 10)"),
    "start_preconditioning_step": ("Distributed Shampoo's", "DASH's is start_prec_step= (default 1)"),
    "epsilon": ("Distributed Shampoo's", "DASH's damping is eps= (default 1e-10), Adam's epsilon eps_graft="),
    "grafting_config": ("Distributed Shampoo's", "DASH's is grafting= ('adam', 'adagrad', 'rms' or 'spectral')"),
    "use_bias_correction": ("Distributed Shampoo's", "DASH's is bias_correction= (default True)"),
    "preconditioner_config": ("Distributed Shampoo's", "DASH's are solver=, root_order= and preconditioner="),
}


def unknown_option_message(where: str, names: Iterable[str], known: Sequence[str], listed: str) -> str:
    """What ``where`` says of its unknown options ``names``, in one short line: the first that
    is another optimizer's gets DASH's equivalent; else the first gets the nearest of ``known``
    (a misspelling) or, with none near, ``listed``: where the options are described."""
    names = sorted(names)
    foreign = [name for name in names if name in FOREIGN]
    if foreign:
        owner, instead = FOREIGN[foreign[0]]
        return f"{where} got {foreign[0]}=, which is {owner} option: {instead}"
    near = difflib.get_close_matches(names[0], known, n=1)
    if near:
        return f"{where} got unknown option {names[0]!r}; did you mean {near[0]!r}?"
    return f"{where} got unknown option {names[0]!r}; {listed}"
