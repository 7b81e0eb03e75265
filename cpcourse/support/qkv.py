"""The rules every attention call checks on q, k, v `[B, H, L, D]`, and the softmax scale.

    python -m pytest tests/unit/test_attention.py -q -k "bad or scale"

Kept apart from `cpcourse.attention` so that the lesson's module holds the maths; the ring checks
the same scale before any transfer, so that no rank fails alone mid-ring.
"""

from __future__ import annotations

import math

import torch

from cpcourse.support.errors import InputError, require


def check_qkv(q, k, v) -> None:
    """Raise InputError naming the first broken rule. Messages are built only on failure: this
    runs on every call, and a ring makes thousands of small calls."""
    rules = (
        lambda: all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)),
        lambda: q.shape[:2] == k.shape[:2] == v.shape[:2],
        lambda: q.shape[-1] == k.shape[-1],
        lambda: k.shape[2] == v.shape[2],
        lambda: q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point,
        lambda: q.device == k.device == v.device,
    )
    for i, ok in enumerate(rules):
        if not ok():
            raise InputError(_qkv_message(i, q, k, v))


def _qkv_message(rule: int, q, k, v) -> str:
    if rule == 0:
        got = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
               for t in (q, k, v)]
        return f"q, k, v must be 4-d tensors [B, H, L, D], got shapes {got}"
    return [
        f"q, k, v must share [B, H]: got {tuple(q.shape[:2])}, {tuple(k.shape[:2])}, "
        f"{tuple(v.shape[:2])}",
        f"q and k need the same head dim D: got {q.shape[-1]} and {k.shape[-1]}",
        f"k and v need the same number of keys: got {k.shape[2]} and {v.shape[2]}",
        f"q, k, v must share one floating dtype: got {q.dtype}, {k.dtype}, {v.dtype}",
        f"q, k, v must be on one device: got {q.device}, {k.device}, {v.device}",
    ][rule - 1]


def attention_scale(q, scale) -> float:
    """The softmax scale: 1/sqrt(D) by default, else `scale` checked to be a finite number."""
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise InputError(f"scale must be a number, got {scale!r}") from None
    require(math.isfinite(scale), f"scale must be finite, got {scale}")
    return scale
