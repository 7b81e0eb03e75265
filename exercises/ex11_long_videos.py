# Yours to edit. Generated from solutions/ex11_long_videos.py by tools/make_exercises.py
# stub-sha256: 5a817fa702f9a012 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 11, long videos: the window schedule, the blending weights, and a bug
hunt in the blend of windows spread over ranks.

    python -m pytest tests/graded --ex 11.1 --impl exercises

A model trained on W frames makes a T-frame video by co-denoising overlapping windows of W
frames and blending their predictions where they overlap. The library's versions are
`cpcourse.tinydit.windows.window_starts` and `cpcourse.tinydit.windows.frame_weights`
(`blend_weights`: one window's weights before normalising); check yours in the notebook with
`cpcourse.check("11.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.tinydit import windows


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
        "Hint: the blended prediction of a frame is a weighted mean of the windows "
        "that cover it. What must a frame's weights add up to, and what weight does a "
        "frame covered by only one window get from it? (Section 2's stackplot of the "
        "weights.) (2 more: cpcourse.hint(\"11.2\"))"
    )


def rank_blend_buggy(preds: list, starts: list[int], mine: list[int], frames: int, window: int,
                     blend: str) -> torch.Tensor:
    """This rank's term of the all-reduce under `parallel="windows"`, as a colleague wrote it (do
    not copy it): exact on one rank, a seam on two. Find why.
    """
    raw = windows.blend_weights(window, blend)
    total = torch.zeros(frames, dtype=torch.float64)
    for k in mine:  # each frame's weights must add up to 1
        total[starts[k]:starts[k] + window] += raw
    b, c, _, h, w = preds[0].shape
    x0 = preds[0].new_zeros(b, c, frames, h, w)
    for k, pred in zip(mine, preds, strict=True):
        s = starts[k]
        share = (raw / total[s:s + window]).to(pred.dtype)
        x0[:, :, s:s + window] += share.view(1, 1, -1, 1, 1) * pred
    return x0


def rank_blend(preds: list, starts: list[int], mine: list[int], frames: int, window: int,
               blend: str) -> torch.Tensor:
    """`rank_blend_buggy`, fixed: this rank's term of the per-step all-reduce when whole windows
    are spread over ranks.

    preds: the predictions `[B, C, window, Hl, Wl]` of this rank's windows, in the order of
    `mine` (indices into `starts`, the schedule of the whole video; each rank holds a different
    run of at least one window, and together the ranks hold each window once). Returns
    `[B, C, frames, Hl, Wl]`, zero where this rank has no window. Summed over the ranks (the
    all-reduce), it must equal the blend one process computes with every window, for any
    number of ranks.
    """
    # Exercise 11.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 11.3 rank_blend: read notebook 11, \"Bug hunt: a seam that only two "
        "ranks make\". Hint: the all-reduce adds the ranks' terms, so a frame's final "
        "weight is the sum of the shares every rank gave it. The buggy version makes "
        "each rank's shares add up to 1 on every frame it touches: what happens to a "
        "frame that windows of two ranks cover? Of which windows' weights should a "
        "window's share of a frame be the fraction? (2 more: cpcourse.hint(\"11.3\"))"
    )
