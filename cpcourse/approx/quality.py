"""How far an approximate clip is from the exact one: PSNR and the largest difference.

    cpcourse generate --prompt circle-right --nproc 2 --approx naive --compare --json

Clips `[T, 3, H, W]` in [0, 1], so the peak signal is 1: PSNR = 10 log10(1 / MSE) dB.
"""

from __future__ import annotations

import math

import torch


def psnr(clip: torch.Tensor, exact: torch.Tensor) -> float | None:
    """PSNR of `clip` against `exact` (both `[T, 3, H, W]` in [0, 1]); None when identical
    (infinite, which JSON cannot carry)."""
    mse = float(((clip.double() - exact.double()) ** 2).mean())
    return None if mse == 0 else 10 * math.log10(1.0 / mse)


def compare(clip: torch.Tensor, exact: torch.Tensor) -> dict:
    """`psnr_vs_exact` and `max_abs_diff_vs_exact` of two clips `[T, 3, H, W]`."""
    return {"psnr_vs_exact": psnr(clip, exact),
            "max_abs_diff_vs_exact": float((clip - exact).abs().max())}
