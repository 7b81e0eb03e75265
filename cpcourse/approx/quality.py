"""How far an approximate clip is from the exact one: PSNR and the largest difference.

    cpcourse generate --prompt circle-right --nproc 2 --approx naive --compare --json

Clips `[T, 3, H, W]` in [0, 1], so the peak signal is 1: PSNR = 10 log10(1 / MSE) dB.
"""

from __future__ import annotations

import math

import torch

from cpcourse.support.errors import require


def _check(clip: torch.Tensor, exact: torch.Tensor) -> None:
    """Two clips of one shape, not empty, finite: else an InputError (a mismatched shape would
    broadcast one frame against all, a NaN would make the measure NaN)."""
    for name, x in (("clip", clip), ("exact", exact)):
        require(isinstance(x, torch.Tensor) and x.is_floating_point(), f"{name} must be a "
                f"floating-point tensor [T, 3, H, W], got {type(x).__name__}")
        require(x.numel() > 0, f"{name} is empty (shape {tuple(x.shape)}): nothing to compare")
        require(bool(torch.isfinite(x).all()), f"{name} holds values that are not finite "
                "(NaN or inf): PSNR would mean nothing")
    require(clip.shape == exact.shape, f"clip {tuple(clip.shape)} and exact "
            f"{tuple(exact.shape)} differ in shape: compare clips of the same size")


def psnr(clip: torch.Tensor, exact: torch.Tensor) -> float | None:
    """PSNR of `clip` against `exact` (both `[T, 3, H, W]` in [0, 1]); None when identical
    (infinite, which JSON cannot carry). Unequal shapes, an empty clip or a value that is not
    finite: InputError."""
    _check(clip, exact)
    mse = float(((clip.double() - exact.double()) ** 2).mean())
    return None if mse == 0 else 10 * math.log10(1.0 / mse)


def compare(clip: torch.Tensor, exact: torch.Tensor) -> dict:
    """`psnr_vs_exact` and `max_abs_diff_vs_exact` of two clips `[T, 3, H, W]`."""
    _check(clip, exact)
    return {"psnr_vs_exact": psnr(clip, exact),
            "max_abs_diff_vs_exact": float((clip - exact).abs().max())}
