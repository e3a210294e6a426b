"""Products of the matmul solvers: low-precision operands, full-precision accumulation (docs/ALGORITHM.md 5.5).

``matmul_dtype`` rounds the *operands* of a product; the accumulation and the result stay in
the working dtype (float32, or float64 for float64 stacks), and so do the iterates between
products. Two ways to get that, chosen by device from static facts (no data-dependent branch):

- CUDA/XPU with float32 work: ``torch.bmm(a16, b16, out_dtype=torch.float32)``, the 16-bit
  tensor-core product with float32 accumulation and a float32 result (``aten::bmm.dtype``,
  lowered by Inductor to ``_bmm_out_dtype_cuda``).
- Everywhere else (torch has no CPU kernel for ``aten::bmm.dtype``, and CPU 16-bit ``bmm``
  returns a 16-bit result, far slower than float32):
  round the operands, then multiply in the working dtype. The product of two bfloat16 or two
  float16 numbers is exact in float32, so this is the same arithmetic as the tensor-core
  product up to summation order: CPU runs show the numerics of 16-bit operands, not their speed.
  The rounding is the opaque op ``dash_fn::round_to``: Inductor elides a fused
  ``x.to(bfloat16).to(float32)`` pair (it computes 16-bit values in float32 inside kernels),
  which would silently turn the emulation back into a float32 product.
"""

from __future__ import annotations

import torch

LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ALIGN_BYTES = 64


def aligned_width(n: int, dtype: torch.dtype, line_bytes: int = ALIGN_BYTES) -> int:
    """``n`` rounded up so that ``n`` elements of ``dtype`` fill whole lines (64 bytes by default)."""
    multiple = max(1, line_bytes // dtype.itemsize)
    return -(-n // multiple) * multiple


def stacked_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for stacks of blocks, giving each block the same bits wherever it sits.

    CPU (MKL) batched products of some small shapes (measured: 5 or 7 output columns with 16
    or more inner columns, and mat-vec) round a block differently depending on where its
    output lands relative to 64-byte lines, so the same block got different bits in stacks of
    different lengths, and a rank holding part of a stack did not match one process. Padding
    ``b`` with zero columns to whole 64-byte rows puts every output block on a line boundary;
    the extra columns are zero work to drop. Sizes already aligned (all full blocks) pass through.
    """
    n = b.shape[-1]
    width = aligned_width(n, b.dtype)
    if width == n:
        return a @ b
    wide = torch.nn.functional.pad(b, (0, width - n))
    return (a @ wide)[..., :n].contiguous()


@torch.library.custom_op("dash_fn::round_to", mutates_args=())
def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``dtype`` (round to nearest even, 16-bit range) and cast back."""
    return x.to(dtype).to(x.dtype)


@round_to.register_fake
def _round_to_fake(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_like(x)


def rounded_matmul(a: torch.Tensor, b: torch.Tensor, matmul_dtype: str) -> torch.Tensor:
    """``a @ b`` for (K, n, n) stacks with both operands rounded to ``matmul_dtype``.

    ``"float32"`` means no rounding: the plain product in the working dtype (which follows
    torch's TF32 flag for float32).
    """
    low = LOW_PRECISION.get(matmul_dtype)
    if low is None:
        return stacked_matmul(a, b)
    if a.device.type in ("cuda", "xpu") and a.dtype == torch.float32:
        return torch.bmm(a.to(low), b.to(low), out_dtype=torch.float32)
    return stacked_matmul(round_to(a, low), round_to(b, low))
