"""A CPU stand-in for the tensor-core product ``torch.bmm(a16, b16, out_dtype=torch.float32)``.

torch registers ``aten::bmm.dtype`` for CUDA (and XPU in newer releases) but not for the CPU, so
the code that a GPU runs under ``precision="auto"`` (dash_fn.roots.matmul, kernel
"tensor_core") cannot execute here. This module registers a CPU kernel with CUDA's contract, for
the simulated accelerator pass (tests/conftest.py), its tests and the GPU check's dry run, never
for the library:

- the checks of CUDA's ``_bmm_out_dtype_cuda`` (aten/src/ATen/native/cuda/Blas.cpp): 3-D
  operands, matching batch and inner sizes, one dtype for both, and an ``out_dtype`` equal to
  it or float32 for float16 and bfloat16 operands, each raising a ``RuntimeError`` as CUDA does;
- cuBLAS's refusal of float16 operands with a float32 result under
  ``torch.backends.cuda.matmul.allow_fp16_accumulation`` (``bgemm_internal<at::Half, float>``);
- the arithmetic of a tensor core: the 16-bit operands, exact in float32, multiplied with
  float32 accumulation into a float32 result (summation order aside), each block's bits
  independent of its stack (dash_fn.roots.matmul.stacked_matmul).

The Inductor lowering a GPU compiles cannot be checked here: Inductor refuses ``out_dtype`` off
CUDA and XPU ("out_dtype is only supported for CUDA or XPU"), so CPU tests trace the op with
aot_eager, and only a GPU run (benchmarks/gpu_check.py) compiles it with Inductor.
"""

from __future__ import annotations

import contextlib

import torch

from dash_fn.roots.matmul import forget_device_verdicts, stacked_matmul


class StandIn:
    """The registered kernel and how often it ran (``calls``)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch1: torch.Tensor, batch2: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if batch1.dim() != 3:
            raise RuntimeError("batch1 must be a 3D tensor")
        if batch2.dim() != 3:
            raise RuntimeError("batch2 must be a 3D tensor")
        bs, rows, inner = batch1.shape
        if batch2.shape[0] != bs or batch2.shape[1] != inner:
            raise RuntimeError(
                f"Expected size for first two dimensions of batch2 tensor to be: [{bs}, {inner}] but got: "
                f"[{batch2.shape[0]}, {batch2.shape[1]}]."
            )
        if batch1.dtype != batch2.dtype:
            raise RuntimeError("batch1 and batch2 must have the same dtype")
        low = batch1.dtype in (torch.float16, torch.bfloat16)
        if not (out_dtype == batch1.dtype or (out_dtype == torch.float32 and low)):
            raise RuntimeError("out_dtype must be the same as input dtype or fp32 for fp16/bf16 inputs")
        if batch1.dtype == torch.float16 and out_dtype == torch.float32 and fp16_accumulation():
            raise RuntimeError(
                "bgemm_internal<at::Half, float>: float output with reduced precision (fp16) accumulation is not "
                "supported (torch.backends.cuda.matmul.allow_fp16_accumulation)"
            )
        self.calls += 1
        return stacked_matmul(batch1.float(), batch2.float()).to(out_dtype)


def fp16_accumulation() -> bool:
    return bool(getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", False))


@contextlib.contextmanager
def tensor_core_stand_in():
    """Within the block, the CPU runs ``aten::bmm.dtype`` (a :class:`StandIn`, yielded); the
    devices' verdicts on 16-bit products are taken afresh inside and after it."""
    stand_in = StandIn()
    library = torch.library.Library("aten", "IMPL")
    library.impl("bmm.dtype", stand_in, "CPU")
    forget_device_verdicts()
    try:
        yield stand_in
    finally:
        library._destroy()
        forget_device_verdicts()


_for_the_process: list = []  # the open context of register_for_the_process: the registration lives while it does


def process_stand_in() -> StandIn | None:
    """The stand-in registered for the process (by :func:`register_for_the_process`), or None."""
    return _for_the_process[0][1] if _for_the_process else None


def register_for_the_process() -> StandIn:
    """Register the stand-in until the process ends (the simulated accelerator pass), once."""
    if not _for_the_process:
        context = tensor_core_stand_in()
        _for_the_process.append((context, context.__enter__()))
    return _for_the_process[0][1]
