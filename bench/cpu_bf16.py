"""Why the CPU path runs the tiny models in float32 where the CPU has no native bfloat16
(runtime/engines/vllm/build.py ``cpu_has_native_bf16``; docs/sources.md §6).

    .venv-vllm/bin/python bench/cpu_bf16.py

Times one matrix product of the tiny models' shape (512 tokens × hidden 128 × 256, one thread)
in float32 and in bfloat16, and prints the CPU's bf16 flags as ``cpu_has_native_bf16`` reads
them.
"""

from __future__ import annotations

import time

import torch

from talaria.runtime.engines.vllm.build import NATIVE_BF16_FLAGS, cpu_has_native_bf16


def product_ms(dtype: torch.dtype, repeats: int = 200) -> float:
    a = torch.randn(512, 128, dtype=dtype)
    w = torch.randn(128, 256, dtype=dtype)
    for _ in range(5):
        a @ w
    start = time.perf_counter()
    for _ in range(repeats):
        a @ w
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    torch.set_num_threads(1)
    fp32, bf16 = product_ms(torch.float32), product_ms(torch.bfloat16)
    print(f"native bf16 ({' or '.join(sorted(NATIVE_BF16_FLAGS))}): {cpu_has_native_bf16()}")
    print(f"512×128 @ 128×256, one thread: float32 {fp32:.3f} ms, bfloat16 {bf16:.3f} ms "
          f"({bf16 / fp32:.0f}×)")  # fmt: skip


if __name__ == "__main__":
    main()
