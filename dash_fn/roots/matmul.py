"""The step's matrix products: their precision (``DashConfig.precision``, docs/ALGORITHM.md 5.5),
and stacked products that give each block the same bits wherever it sits in its stack.

One setting covers every large product of a step: the factor products ``G G^T`` and ``G^T G``,
the root and basis iterations, the preconditioning products ``L^{-1/p} G R^{-1/p}`` and the
eigenvalue-corrected rotations. It rounds their *operands*: "float32" (none), "tf32" (10
fraction bits, float32's range), "bfloat16" (7 fraction bits, float32's range) or "float16"
(10 fraction bits, range 6e-5 to 65504). Accumulation, results and every stored tensor stay in
the working dtype; small products (power iteration's mat-vecs) stay there too.

A part of the step that a precision cannot serve keeps float32 operands (:data:`STAYS_FLOAT32`):
the Newton iterations amplify their own rounding where a 7-bit fraction is too coarse.

``"auto"`` picks from static facts: on CUDA and XPU, the ``auto_precision`` of the
preconditioner (:mod:`dash_fn.preconditioners`: float16 for Shampoo's, float32 for the
eigenvalue-corrected one) where the
device serves 16-bit products with float32 results (:func:`tensor_core_refusal`: a GPU below
compute capability 7.0, ROCm's CK BLAS backend, cuBLAS's fp16-accumulation flag or a torch
without the kernel for the device refuse; "auto" is float32 there, with one notice through the
``dash_fn`` logger); elsewhere (CPUs included) "float32". ``init`` takes the verdict once per
device and process, and every step reads it. Its results therefore differ across hardware by
16-bit rounding, as TF32's do; an explicit "float32" gives the same bits on one machine type
with one torch build (CPU instruction sets sum in other orders; on GPUs, torch's TF32 setting
applies to float32 products).

The kernel of a precision is a fact of the device, chosen once per call
(:func:`products_for`), never per product and never from data:

- CUDA (and XPU for 16 bits): tensor-core products. 16-bit: ``torch.bmm(a16, b16,
  out_dtype=float32)`` (float32 accumulation and result); "tf32": the float32 product with
  TF32 allowed for that call only (the op :func:`tf32_bmm`; torch's process-wide flag is
  restored after it).
- A CPU with bf16 matrix instructions, "bfloat16": oneDNN's native bf16 product (float32
  accumulation); torch has no CPU bf16 product with a float32 result, so the result is rounded
  to bf16 once and widened.
- Everywhere else: exact emulation. The operands are rounded (the opaque op
  :func:`round_to`: Inductor elides a fused ``x.to(bf16).to(float32)`` pair) and multiplied in
  float32. The product of two 16-bit or TF32 numbers is exact in float32, so this is the
  tensor-core arithmetic up to summation order: the numerics of the precision, not its speed.

float16 operands are scaled per block by a power of two that brings each block's largest
entry into [1, 2) before rounding, and the product is scaled back: float16's range would
otherwise flush gradients below 6e-8 to zero and lose digits below 6e-5. A block with an
Inf or NaN keeps it (scale 1), so the non-finite guard still sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..strategy import simulating

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


LOW = {"bfloat16": torch.bfloat16, "float16": torch.float16}

# "auto" off the CPU is each preconditioner's auto_precision (dash_fn.preconditioners): the
# fastest precision whose final training loss held within 0.005 of float32's on every seed of
# the paired runs at both sizes (benchmarks/RESULTS.md, "Precision of the products"). On CPUs
# it is float32: bfloat16, the only precision with CPU units, did not hold, and float32 keeps
# the CPU's results the same bits on every CPU.
# Where "auto" may leave float32: devices whose 16-bit products run on matrix units. Elsewhere
# (CPUs, MPS, the meta device of a layout) a 16-bit "auto" would only be emulated. The simulated
# accelerator strategy (dash_fn.strategy) counts the CPU among them, so that the tests run the
# tensor-core code where no GPU is (with a stand-in CPU kernel of aten::bmm.dtype, tests/).
TENSOR_CORE_DEVICES = ("cuda", "xpu")
FIRST_TENSOR_CORE_CAPABILITY = (7, 0)  # Volta: CUDA devices below it multiply 16 bits no faster

# The parts of a step, and those that keep float32 operands under a precision, with the reason.
# The rule: an iteration keeps float32 where the precision moves its result by more than 5% of
# the float32 iteration's on blocks of condition 1e4 (benchmarks/precision_numerics.py; the
# figures are in benchmarks/RESULTS.md, "Precision").
PARTS = ("factors", "precondition", "rotate", "cn", "ndb", "chebyshev", "qr", "eigh")
STAYS_FLOAT32: dict[str, dict[str, str]] = {
    "bfloat16": {
        "cn": "coupled Newton's C^p M products amplify a 7-bit fraction's rounding (bf16 CN diverges in the paper)",
        "ndb": "NDB's coupled Y, Z products drift apart under 16-bit rounding (the paper ran NDB in float32)",
        "chebyshev": "the Clenshaw recurrence's 60 products accumulate a 7-bit fraction's rounding",
    },
    "float16": {
        "ndb": "NDB's coupled Y, Z products drift apart under a 10-bit fraction (the paper ran NDB in float32)",
    },
    "tf32": {
        "ndb": "NDB's coupled Y, Z products drift apart under a 10-bit fraction (the paper ran NDB in float32)",
    },
}

TF32_FRACTION_DROP = 13  # float32 keeps 23 fraction bits, TF32 10


def _bf16_units() -> bool:
    capabilities = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return bool(capabilities.get("amx_bf16") or capabilities.get("avx512_bf16"))


# read once, at import: a static fact, and a constant to torch.compile (which cannot trace the query)
BF16_UNITS = _bf16_units()


def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AMX tiles or AVX-512 BF16 dot products)."""
    return BF16_UNITS


def has_tensor_cores(device: torch.device) -> bool:
    """Whether ``device`` is one whose 16-bit products would run on matrix units: CUDA and XPU,
    and the CPU under the simulated accelerator strategy."""
    return device.type in TENSOR_CORE_DEVICES or (device.type == "cpu" and simulating())


@dataclass(frozen=True)
class TensorCoreFacts:
    """The static facts that decide whether a device serves ``torch.bmm(a16, b16,
    out_dtype=float32)``: ``kernel``, torch registers that op for the device's dispatch key (CUDA
    always; XPU from some release on; the CPU only where a test registers a stand-in);
    ``capability``, a CUDA device's compute capability (None elsewhere); ``rocm_ck``, ROCm with
    the CK BLAS backend (whose batched Half-in, float-out GEMM raises); ``fp16_accumulation``,
    ``torch.backends.cuda.matmul.allow_fp16_accumulation`` (cuBLAS's Half-in, float-out batched
    GEMM raises under it)."""

    device_type: str
    kernel: bool
    capability: tuple[int, int] | None = None
    rocm_ck: bool = False
    fp16_accumulation: bool = False


def tensor_core_facts(device: torch.device) -> TensorCoreFacts:
    """The :class:`TensorCoreFacts` of ``device``, read from torch (host calls; never traced)."""
    key = {"cuda": "CUDA", "xpu": "XPU"}.get(device.type, "CPU")
    kernel = torch._C._dispatch_has_kernel_for_dispatch_key("aten::bmm.dtype", key)
    capability = None
    rocm_ck = False
    if device.type == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(device)
        if torch.version.hip is not None:
            rocm_ck = getattr(torch.backends.cuda.preferred_blas_library(), "name", "") == "Ck"
    fp16_accumulation = bool(getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", False))
    return TensorCoreFacts(device.type, kernel, capability, rocm_ck, fp16_accumulation)


def tensor_core_refusal(facts: TensorCoreFacts) -> str | None:
    """Why a device with these facts cannot serve the 16-bit products, or None where it can."""
    if not facts.kernel:
        return f"torch {torch.__version__} has no {facts.device_type} kernel for torch.bmm(..., out_dtype=float32)"
    if facts.capability is not None and facts.capability < FIRST_TENSOR_CORE_CAPABILITY:
        major, minor = facts.capability
        return f"compute capability {major}.{minor} has no tensor cores (they start at 7.0)"
    if facts.rocm_ck:
        return "ROCm's CK BLAS backend refuses the batched float16-in, float32-out GEMM"
    if facts.fp16_accumulation:
        return (
            "torch.backends.cuda.matmul.allow_fp16_accumulation is set, under which cuBLAS refuses float16 "
            "products with float32 results"
        )
    return None


# The verdict of each device (type, index, simulated), taken once, at the first ``init`` there:
# the step reads it (a compiled step cannot call torch's dispatcher queries), so a setting
# changed during training never changes what the step multiplies in.
_VERDICTS: dict[tuple[str, int | None, bool], str | None] = {}


def device_refusal(device: torch.device) -> str | None:
    """The refusal of ``device`` (:func:`tensor_core_refusal`), None where it serves 16-bit
    products; taken once per device and process (``init`` takes it first)."""
    key = (device.type, device.index, simulating())
    if key not in _VERDICTS:
        _VERDICTS[key] = (
            tensor_core_refusal(tensor_core_facts(device)) if has_tensor_cores(device) else "no tensor cores"
        )
    return _VERDICTS[key]


def forget_device_verdicts() -> None:
    """Drop the verdicts taken so far (tests that fake a device's facts, or register a stand-in)."""
    _VERDICTS.clear()


def resolve_precision(precision: str, device: torch.device, auto: str = "float16") -> str:
    """The precision a config's setting means on ``device``: "auto" resolved (to ``auto``, the
    preconditioner's choice, on a device with tensor cores that serve it; else float32),
    others as given."""
    if precision != "auto":
        return precision
    if auto == "float32" or not has_tensor_cores(device):
        return "float32"
    return "float32" if device_refusal(device) else auto


@torch.library.custom_op("dash_fn::round_to", mutates_args=())
def round_to(x: torch.Tensor, precision: str) -> torch.Tensor:
    """``x`` rounded to ``precision``'s operands (round to nearest even) and kept in x's dtype."""
    if precision == "tf32":  # drop 13 fraction bits of a float32, rounding to nearest even
        bits = x.view(torch.int32)
        odd = (bits >> TF32_FRACTION_DROP) & 1
        rounded = (bits + ((1 << (TF32_FRACTION_DROP - 1)) - 1) + odd) & ~((1 << TF32_FRACTION_DROP) - 1)
        finite = torch.isfinite(x)  # Inf and NaN keep their bits
        return torch.where(finite, rounded.view(torch.float32), x)
    return x.to(LOW[precision]).to(x.dtype)


@round_to.register_fake
def _round_to_fake(x: torch.Tensor, precision: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("dash_fn::tf32_bmm", mutates_args=())
def tf32_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)`` of float32 stacks with TF32 tensor cores allowed for this call only.

    An op of its own so that torch.compile keeps it whole: the flag is read when cuBLAS is
    called, and CUDA graphs capture the TF32 kernel chosen then."""
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        return torch.bmm(a, b)
    finally:
        matmul.fp32_precision = previous


@tf32_bmm.register_fake
def _tf32_bmm_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


def _block_exponents(x: torch.Tensor) -> torch.Tensor:
    """Per block (..., 1, 1), e with the block's largest |entry| in [2^e, 2^(e+1)) (0 for a zero
    or non-finite block)."""
    peak = x.abs().amax(dim=(-2, -1), keepdim=True)
    usable = torch.isfinite(peak) & (peak > 0)
    return torch.where(usable, torch.floor(torch.log2(torch.where(usable, peak, 1.0))), 0.0)


@dataclass(frozen=True)
class Products:
    """The step's large products at one resolved ``precision``, in the device's ``kernel``:
    "plain" (float32 operands), "tensor_core", "native_cpu" or "emulated". Call it as ``a @ b``
    on (K, m, n) stacks; :meth:`of` gives the products of one part of the step."""

    precision: str
    kernel: str

    def of(self, part: str) -> Products:
        """The products of ``part`` (:data:`PARTS`): float32 operands where the part is
        unstable in this precision (:data:`STAYS_FLOAT32`)."""
        if part not in PARTS:
            raise ValueError(f"Products.of: unknown part {part!r}, expected one of {PARTS}")
        if self.precision in STAYS_FLOAT32 and part in STAYS_FLOAT32[self.precision]:
            return PLAIN
        return self

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.kernel == "plain":
            return stacked_matmul(a, b)
        if self.precision == "float16":
            ea, eb = _block_exponents(a), _block_exponents(b)
            return self._rounded(a * torch.exp2(-ea), b * torch.exp2(-eb)) * torch.exp2(ea + eb)
        return self._rounded(a, b)

    def _rounded(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` with both operands in this precision, float32 accumulation."""
        if self.kernel == "tensor_core":
            if self.precision == "tf32":
                return tf32_bmm(a, b)
            low = LOW[self.precision]
            return torch.bmm(a.to(low), b.to(low), out_dtype=a.dtype)
        if self.kernel == "native_cpu":
            low = LOW[self.precision]
            return stacked_matmul(a.to(low), b.to(low)).to(a.dtype)
        return stacked_matmul(round_to(a, self.precision), round_to(b, self.precision))


PLAIN = Products("float32", "plain")
# Every Products a step can use, built once here: the step looks its own up rather than build
# one while torch.compile traces it (torch 2.11's Dynamo builds such an object without its
# fields).
_BUILT = {
    (precision, kernel): Products(precision, kernel)
    for precision in ("tf32", "bfloat16", "float16")
    for kernel in ("tensor_core", "native_cpu", "emulated")
}


def products_for(
    precision: str, device: torch.device, dtype: torch.dtype = torch.float32, auto: str = "float16"
) -> Products:
    """The products of a config's ``precision`` on ``device`` for stacks of ``dtype``, "auto"
    meaning ``auto`` on tensor cores (the preconditioner's: :func:`resolve_precision`): the
    kernel is a static fact of the device (the module doc). float64 stacks (a float64 model's
    state) are never rounded."""
    resolved = resolve_precision(precision, device, auto)
    if resolved == "float32" or dtype != torch.float32:
        return PLAIN
    if device.type == "cuda" or (has_tensor_cores(device) and resolved != "tf32" and not device_refusal(device)):
        return _BUILT[resolved, "tensor_core"]
    if resolved == "bfloat16" and device.type == "cpu" and cpu_has_bf16_units():
        return _BUILT[resolved, "native_cpu"]
    return _BUILT[resolved, "emulated"]
