"""dash_fn: DASH (Distributed Accelerated Shampoo) as a pure functional optimizer for PyTorch.

state = dash_fn.init(params, dash_fn.DashConfig(...))
params, state = dash_fn.step(params, grads, state, lr=lr)
"""

from .checkpoint import atomic_save, load_state, save_state
from .config import DashConfig
from .cpu_memory import retain_freed_cpu_memory
from .distributed.dcp import load_state_dict, state_dict
from .optim import DASH
from .roots import inverse_root, start_vectors
from .state import init, mark_static
from .step import is_refresh_step, step

__all__ = [
    "DashConfig",
    "init",
    "step",
    "is_refresh_step",
    "inverse_root",
    "start_vectors",
    "DASH",
    "save_state",
    "load_state",
    "atomic_save",
    "state_dict",
    "load_state_dict",
    "retain_freed_cpu_memory",
    "mark_static",
]
__version__ = "0.1.0"
