"""dash_fn: DASH (Distributed Accelerated Shampoo) as a pure functional optimizer for PyTorch.

state = dash_fn.init(params, dash_fn.DashConfig(...))
params, state = dash_fn.step(params, grads, state, lr=lr)

What a user trains with is here; utilities around training are in ``dash_fn.utils``.
"""

from . import utils
from .checkpoint import load_state, save_state, state_from_dict, state_to_dict
from .config import DashConfig
from .optim import DASH
from .roots import inverse_root
from .state import init
from .step import is_refresh_step, step

__all__ = [
    "DashConfig",
    "init",
    "step",
    "is_refresh_step",
    "DASH",
    "save_state",
    "load_state",
    "state_to_dict",
    "state_from_dict",
    "inverse_root",
    "utils",
]
__version__ = "0.1.0"
