# Yours to edit. Generated from solutions/ex11_long_videos.py by tools/make_exercises.py
# stub-sha256: 489dd2935daa618e (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 11, long videos: the window schedule and the blending weights.

    python -m pytest tests/graded --ex 11.1 --impl exercises

A model trained on W frames makes a T-frame video by co-denoising overlapping windows of W
frames and blending their predictions where they overlap. The library's versions are
`cpcourse.windows.window_starts` and `cpcourse.windows.frame_weights`; check yours in the
notebook with `cpcourse.check("11.1")`.
"""

from __future__ import annotations

import torch


def window_starts(frames: int, window: int, stride: int) -> list[int]:
    """First frame of every window, in order, so that every frame is covered.

    Windows start at 0, stride, 2 * stride, ... while they fit; if the last of those ends before
    the last frame, one more window ends exactly on it (start = frames - window). Raise
    ValueError when window > frames (a window longer than the video) or stride > window (frames
    between two windows that no window covers), and when any argument is below 1.
    Examples: (16, 8, 4) -> [0, 4, 8]; (18, 8, 4) -> [0, 4, 8, 10]; (8, 8, 3) -> [0].
    """
    # Exercise 11.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 11.1 window_starts: read notebook 11, \"The window schedule\". Hint: "
        "two refusals first (a window that does not fit, a stride that skips frames), "
        "then the regular starts while a whole window fits, then check the end: the "
        "last regular window may stop short of the video's last frame, and then one "
        "more window, flush with the end, covers the rest. (2 more: "
        "cpcourse.hint(\"11.1\"))"
    )


def frame_weights(frames: int, starts: list[int], window: int, blend: str) -> torch.Tensor:
    """Blending weights `[K, frames]` (float64): window k's share of each frame's prediction.

    Before normalising, window k gives each of its own frames j = 0 .. window-1 the weight 1
    ("flat") or min(j + 1, window - j) ("pyramid": 1, 2, ..., 2, 1, so a window's edge frames,
    which see the least of the video around them, count least), and 0 to frames outside it.
    Then every column (frame) is divided by its sum, so the weights of each frame add up to 1.
    """
    # Exercise 11.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 11.2 frame_weights: read notebook 11, \"Blending the overlaps\". "
        "Hint: build the raw table first: one row per window, the window's own "
        "weights pasted at its start, zeros elsewhere. Then normalise per frame (per "
        "column), not per window: a frame inside one window only gets weight 1 from "
        "it, a frame in two windows splits 1 between them in proportion to their raw "
        "weights. (2 more: cpcourse.hint(\"11.2\"))"
    )
