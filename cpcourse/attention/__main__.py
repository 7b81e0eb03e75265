"""The memory wall, measured: peak memory of naive and fused attention at a few lengths.

    python -m cpcourse.attention

Notebook 01 draws the same numbers; the naive column grows as L * L * 4 bytes * H (the score
matrix), the fused one as L (out and the lse).
"""

from __future__ import annotations

import torch

from cpcourse.attention import attention_with_lse, reference_attention
from cpcourse.support.peak_memory import peak_memory


def main() -> None:
    """A table: L, the naive peak (MB), the score matrix's L*L*4*H, the fused peak."""
    print(f"{'L':>6} {'naive MB':>10} {'L*L*4*H MB':>11} {'fused MB':>9}")
    for length in (512, 1024, 2048, 4096):
        q = torch.randn(1, 4, length, 64)
        with torch.no_grad():
            _, naive = peak_memory(reference_attention, q, q, q)
            _, fused = peak_memory(attention_with_lse, q, q, q)
        print(f"{length:6d} {naive / 1e6:10.1f} {length * length * 16 / 1e6:11.1f} "
              f"{fused / 1e6:9.2f}")


if __name__ == "__main__":
    main()
