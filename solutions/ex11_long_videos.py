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
    # BEGIN SOLUTION 11.1 | notebook 11, "The window schedule"
    # | hint: two refusals first (a window that does not fit, a stride that skips frames), then
    # | the regular starts while a whole window fits, then check the end: the last regular window
    # | may stop short of the video's last frame, and then one more window, flush with the end,
    # | covers the rest.
    # | hint2: frames 18, window 8, stride 4: regular starts 0, 4, 8 (12 would end at 20 > 18);
    # | the window at 8 ends at frame 15, so frames 16 and 17 need one more window, starting at
    # | 18 - 8 = 10. frames 16: the window at 8 ends exactly at 16, nothing to add.
    # | hint3: starts = list(range(0, frames - window + 1, stride)); if starts[-1] + window <
    # | frames: starts.append(frames - window).
    if min(frames, window, stride) < 1:
        raise ValueError(f"frames, window and stride must be >= 1, got {frames}, {window}, "
                         f"{stride}")
    if window > frames:
        raise ValueError(f"a window of {window} frames does not fit in {frames} frames")
    if stride > window:
        raise ValueError(f"stride {stride} > window {window} leaves frames uncovered")
    starts = list(range(0, frames - window + 1, stride))
    if starts[-1] + window < frames:
        starts.append(frames - window)
    return starts
    # END SOLUTION


def frame_weights(frames: int, starts: list[int], window: int, blend: str) -> torch.Tensor:
    """Blending weights `[K, frames]` (float64): window k's share of each frame's prediction.

    Before normalising, window k gives each of its own frames j = 0 .. window-1 the weight 1
    ("flat") or min(j + 1, window - j) ("pyramid": 1, 2, ..., 2, 1, so a window's edge frames,
    which see the least of the video around them, count least), and 0 to frames outside it.
    Then every column (frame) is divided by its sum, so the weights of each frame add up to 1.
    """
    # BEGIN SOLUTION 11.2 | notebook 11, "Blending the overlaps"
    # | hint: the blended prediction of a frame is a weighted mean of the windows that cover it.
    # | What must a frame's weights add up to, and what weight does a frame covered by only one
    # | window get from it? (Section 2's stackplot of the weights.)
    # | hint2: frames 6, window 4, starts [0, 2], pyramid: raw rows [1, 2, 2, 1, 0, 0] and
    # | [0, 0, 1, 2, 2, 1]; column sums [1, 2, 3, 3, 2, 1]; frame 2 gets 2/3 from window 0 and
    # | 1/3 from window 1. With flat weights frame 2 gets 1/2 and 1/2.
    # | hint3: w = torch.zeros(len(starts), frames, dtype=torch.float64); j = torch.arange(window,
    # | dtype=torch.float64); row = torch.ones(window) if flat else torch.minimum(j + 1, window -
    # | j); w[k, s:s + window] = row for each k, s; return w / w.sum(dim=0, keepdim=True).
    j = torch.arange(window, dtype=torch.float64)
    row = torch.ones(window, dtype=torch.float64) if blend == "flat" else torch.minimum(
        j + 1, window - j)
    w = torch.zeros(len(starts), frames, dtype=torch.float64)
    for k, s in enumerate(starts):
        w[k, s:s + window] = row
    return w / w.sum(dim=0, keepdim=True)
    # END SOLUTION


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
    # BEGIN SOLUTION 11.3 | notebook 11, "Bug hunt: a seam that only two ranks make"
    # | hint: the all-reduce adds the ranks' terms, so a frame's final weight is the sum of the
    # | shares every rank gave it. The buggy version makes each rank's shares add up to 1 on
    # | every frame it touches: what happens to a frame that windows of two ranks cover? Of
    # | which windows' weights should a window's share of a frame be the fraction?
    # | hint2: 32 frames, windows of 8 at stride 4: 7 windows, ranks hold windows 0-3 and 4-6.
    # | Frames 16-19 are in window 3 (rank 0) and window 4 (rank 1). The buggy rank 0 gives
    # | window 3 all of them (the only window it knows there), rank 1 gives window 4 all of them:
    # | after the sum they count twice, and the video jumps in brightness at frames 16 and 20.
    # | hint3: weights = windows.frame_weights(frames, starts, window, blend), over the whole
    # | schedule; then for each k in mine, x0[:, :, s:s + window] += weights[k, s:s + window]
    # | .view(1, 1, -1, 1, 1) * pred.
    weights = windows.frame_weights(frames, starts, window, blend).to(preds[0].dtype)
    b, c, _, h, w = preds[0].shape
    x0 = preds[0].new_zeros(b, c, frames, h, w)
    for k, pred in zip(mine, preds, strict=True):
        s = starts[k]
        x0[:, :, s:s + window] += weights[k, s:s + window].view(1, 1, -1, 1, 1) * pred
    return x0
    # END SOLUTION
