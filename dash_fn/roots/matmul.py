"""Products of the matmul solvers: low-precision operands, full-precision accumulation (ALGORITHM.md 5.5).

``matmul_dtype`` rounds the *operands* of a product; the accumulation and the result stay in
the working dtype (float32, or float64 for float64 stacks), and so do the iterates between
products. Two ways to get that, chosen by device from static facts (no data-dependent branch):

- CUDA/XPU with float32 work: ``torch.bmm(a16, b16, out_dtype=torch.float32)``, the 16-bit
  tensor-core product with float32 accumulation and a float32 result (``aten::bmm.dtype``,
  lowered by Inductor to ``_bmm_out_dtype_cuda``).
- Everywhere else (torch 2.13 has no CPU kernel for ``aten::bmm.dtype``, and CPU 16-bit
  ``bmm`` returns a 16-bit result, 20-400x slower than float32 on the development machines):
  round the operands, then multiply in the working dtype. The product of two bfloat16 or two
  float16 numbers is exact in float32, so this is the same arithmetic as the tensor-core
  product up to summation order: CPU runs show the numerics of 16-bit operands, not their speed.
"""

from __future__ import annotations

import torch

LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def rounded_matmul(a: torch.Tensor, b: torch.Tensor, matmul_dtype: str) -> torch.Tensor:
    """``a @ b`` for (K, n, n) stacks with both operands rounded to ``matmul_dtype``.

    ``"float32"`` means no rounding: the plain product in the working dtype (which follows
    torch's TF32 flag for float32).
    """
    low = LOW_PRECISION.get(matmul_dtype)
    if low is None:
        return a @ b
    if a.device.type in ("cuda", "xpu") and a.dtype == torch.float32:
        return torch.bmm(a.to(low), b.to(low), out_dtype=torch.float32)
    return a.to(low).to(a.dtype) @ b.to(low).to(b.dtype)
