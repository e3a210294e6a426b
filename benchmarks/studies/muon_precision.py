# A study (benchmarks/studies/README.md): kept as it ran, not maintained, imported by no test.
# Ran at: 9288b6b (2026-12-04), on the AVX2 development VM:
#   python benchmarks/muon_precision.py --reps 3       (today: python -m benchmarks.studies.muon_precision)
# and at 1474d74 (2026-12-04), on the AMX VM: python benchmarks/muon_precision.py
# Figures: benchmarks/history/update-rules.md, "Each option alone, and the first runs of the combination".
"""Is torch.optim.Muon's bfloat16 Newton-Schulz slow on this CPU? (issue 39's check before the study)

    python -m benchmarks.studies.muon_precision [--reps 5]

Times ``torch.optim.Muon.step`` on eight 1024 x 256 matrices, and on the hidden matrices of the
scaling study's largest model (its Newton-Schulz iterations run in bfloat16, as torch rounds
them), beside the same five iterations in float32: torch's own
``_zeropower_via_newtonschulz`` with its bfloat16 cast made a no-op. On some CPUs bfloat16
matmuls fall back to slow kernels, tens of times slower; then the study would run Muon's
iterations in float32 (the same math at higher precision). Median of ``--reps`` steps after one
warm-up step each, both forms in one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
import torch.optim._muon as muon_module

from benchmarks.machine import machine_line

# the example, and the hidden matrices of train_lm --size l (4 layers of d_model 512:
# attention 4 x (512, 512), MLP 2 x (1365, 512) and (512, 1365))
SETS = {
    "eight 1024 x 256 matrices": [(1024, 256)] * 8,
    "train_lm --size l's 28 hidden matrices": [(512, 512)] * 16 + [(1365, 512)] * 8 + [(512, 1365)] * 4,
}


def step_seconds(shapes: list[tuple[int, int]], float32: bool, reps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = torch.optim.Muon(params, lr=1e-3, adjust_lr_fn="match_rms_adamw")
    # float32: Tensor.bfloat16 returns the tensor itself inside Muon's iteration
    patch = mock.patch.object(torch.Tensor, "bfloat16", lambda x: x) if float32 else mock.MagicMock()
    times = []
    with patch:
        opt.step()
        for _ in range(reps):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="timed steps per form")
    args = parser.parse_args()
    assert muon_module._zeropower_via_newtonschulz  # the iteration this script times
    print(machine_line())
    print("| Muon step on | Newton-Schulz in bfloat16 (as is), s | in float32, s | ratio |\n|---|---|---|---|")
    for name, shapes in SETS.items():
        bf16, fp32 = step_seconds(shapes, False, args.reps), step_seconds(shapes, True, args.reps)
        print(f"| {name} | {bf16:.3f} | {fp32:.3f} | {bf16 / fp32:.2f} |")


if __name__ == "__main__":
    main()
