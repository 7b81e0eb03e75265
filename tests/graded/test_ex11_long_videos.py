"""Graded tests of notebook 11: the window schedule and the blending weights.

    python -m pytest tests/graded --ex 11.1 --impl solutions
"""

import random

import pytest
import torch

from cpcourse.course.testing import assert_close
from cpcourse.tinydit import windows


def _cases(n=300, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        window = rng.randint(1, 24)
        yield rng.randint(window, 100), window, rng.randint(1, window)


@pytest.mark.ex("11.1")
def test_window_starts_cover_every_frame(impl):
    mod = impl("ex11_long_videos")
    for frames, window, stride in _cases():
        got = mod.window_starts(frames, window, stride)
        covered = set()
        for s in got:
            assert 0 <= s <= frames - window, f"({frames}, {window}, {stride}): start {s} " \
                                              "puts the window outside the video"
            covered.update(range(s, s + window))
        assert covered == set(range(frames)), (
            f"({frames}, {window}, {stride}): {got} leaves frames "
            f"{sorted(set(range(frames)) - covered)[:5]} uncovered")
        assert got == windows.window_starts(frames, window, stride), (
            f"({frames}, {window}, {stride}): got {got}; starts are 0, stride, 2*stride, ... "
            "plus one window flush with the end when the last regular one stops short")


@pytest.mark.ex("11.1")
def test_window_starts_examples_and_refusals(impl):
    mod = impl("ex11_long_videos")
    assert mod.window_starts(16, 8, 4) == [0, 4, 8]
    assert mod.window_starts(18, 8, 4) == [0, 4, 8, 10]
    assert mod.window_starts(8, 8, 3) == [0]
    for bad in ((8, 9, 4), (20, 8, 9), (0, 1, 1), (8, 4, 0)):
        with pytest.raises(ValueError):
            mod.window_starts(*bad)


@pytest.mark.ex("11.2")
def test_frame_weights_sum_to_one_and_match(impl):
    mod = impl("ex11_long_videos")
    for frames, window, stride in _cases(n=120, seed=1):
        starts = windows.window_starts(frames, window, stride)
        for blend in ("flat", "pyramid"):
            got = mod.frame_weights(frames, starts, window, blend)
            want = windows.frame_weights(frames, starts, window, blend)
            assert_close(got, want, atol=1e-12, rtol=1e-12, dims=("window", "frame"),
                         name=f"{blend} weights, ({frames}, {window}, {stride})",
                         hint="paste each window's raw weights at its start, then divide every "
                              "column by its sum")


@pytest.mark.ex("11.2")
def test_frame_weights_small_case(impl):
    mod = impl("ex11_long_videos")
    got = mod.frame_weights(6, [0, 2], 4, "pyramid")
    want = torch.tensor([[1, 1, 2 / 3, 1 / 3, 0, 0], [0, 0, 1 / 3, 2 / 3, 1, 1]],
                        dtype=torch.float64)
    assert_close(got, want, atol=1e-12, rtol=1e-12, dims=("window", "frame"),
                 name="pyramid weights of 2 windows of 4 over 6 frames",
                 hint="raw rows [1, 2, 2, 1, 0, 0] and [0, 0, 1, 2, 2, 1], then per column")
    flat = mod.frame_weights(6, [0, 2], 4, "flat")
    assert_close(flat[:, 2:4], torch.full((2, 2), 0.5, dtype=torch.float64), atol=1e-12,
                 rtol=1e-12, dims=("window", "frame"), name="flat weights in the overlap",
                 hint="flat: each covering window counts the same")


@pytest.mark.ex("11.3")
def test_rank_blend_sums_to_the_one_process_blend(impl):
    from cpcourse.support.shards import shard_offsets, shard_sizes

    mod = impl("ex11_long_videos")
    gen = torch.Generator().manual_seed(0)
    for frames, window, stride, world in ((32, 8, 4, 2), (18, 8, 4, 3), (20, 6, 3, 4),
                                          (16, 8, 4, 1), (30, 8, 8, 2), (25, 7, 2, 5)):
        starts = windows.window_starts(frames, window, stride)
        preds = [torch.randn(1, 2, window, 3, 3, generator=gen, dtype=torch.float64)
                 for _ in starts]
        for blend in ("flat", "pyramid"):
            weights = windows.frame_weights(frames, starts, window, blend)
            want = torch.zeros(1, 2, frames, 3, 3, dtype=torch.float64)
            for k, (s, p) in enumerate(zip(starts, preds, strict=True)):
                want[:, :, s:s + window] += weights[k, s:s + window].view(1, 1, -1, 1, 1) * p
            sizes = shard_sizes(len(starts), world)
            got = sum(mod.rank_blend([preds[k] for k in range(o, o + n)], starts,
                                     list(range(o, o + n)), frames, window, blend)
                      for o, n in zip(shard_offsets(sizes), sizes, strict=True))
            assert_close(got, want, atol=1e-12, rtol=1e-12, dims=("B", "C", "T", "H", "W"),
                         name=f"sum over {world} ranks, {frames} frames, windows of {window} at "
                              f"stride {stride}, {blend}",
                         hint="after the all-reduce every frame's weights must add up to 1 over "
                              "all the windows that cover it, whichever rank holds them")
