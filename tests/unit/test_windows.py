"""Long videos in one process: the schedule, the weights, one window = the plain sampler, seams.

    python -m pytest tests/unit/test_windows.py -q
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.cli import main
from cpcourse.support.errors import InputError
from cpcourse.tinydit.model import DiTConfig, build_model
from cpcourse.tinydit.sampling import initial_noise, sample
from cpcourse.tinydit.windows import (
    WindowSampling,
    blend_weights,
    boundaries,
    frame_weights,
    reschedule_noise,
    sample_windows,
    seam_metric,
    window_starts,
)

cases = st.integers(1, 24).flatmap(lambda w: st.tuples(st.integers(w, 90), st.just(w),
                                                       st.integers(1, w)))


@settings(max_examples=200, deadline=None)
@given(cases, st.sampled_from(["flat", "pyramid"]))
def test_schedule_covers_every_frame_and_weights_sum_to_one(case, blend):
    frames, window, stride = case
    starts = window_starts(frames, window, stride)
    assert starts[0] == 0 and starts[-1] == frames - window
    assert all(0 < b - a <= stride for a, b in zip(starts, starts[1:], strict=False))
    w = frame_weights(frames, starts, window, blend)
    assert torch.allclose(w.sum(dim=0), torch.ones(frames, dtype=torch.float64), atol=1e-12)
    assert (w >= 0).all()
    for k, s in enumerate(starts):  # nothing outside a window
        assert w[k, :s].abs().sum() == 0 and w[k, s + window:].abs().sum() == 0


def test_pyramid_weights():
    assert blend_weights(5).tolist() == [1, 2, 3, 2, 1]
    assert blend_weights(4, "flat").tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("args,words", [((8, 9, 4), "longer than the 8-frame video"),
                                        ((20, 8, 9), "uncovered: use a stride of 1 .. 8"),
                                        ((8, 0, 1), "window must be")])
def test_refusals(args, words):
    with pytest.raises(InputError, match=words):
        window_starts(*args)


@pytest.fixture(scope="module")
def tiny():
    cfg = DiTConfig(in_channels=3, patch=4, hidden=32, heads=2, depth=1, attention="full",
                    num_motions=4, prediction="sample", frame_embed=True)
    return build_model(cfg, 0)


def test_one_window_is_the_plain_sampler_bit_for_bit(tiny):
    noise = initial_noise((1, 3, 6, 8, 8), 3)
    want = sample(tiny, noise, (0, 1), 3, 4.0)
    for blend in ("flat", "pyramid"):
        got = sample_windows(tiny, noise, (0, 1), WindowSampling(3, 4.0, window=6, stride=2,
                                                                   blend=blend))
        assert torch.equal(got, want)


def test_windows_are_independent_clips_when_they_do_not_overlap(tiny):
    noise = initial_noise((1, 3, 8, 8, 8), 1)
    got = sample_windows(tiny, noise, (1, 2), WindowSampling(2, 4.0, window=4, stride=4))
    for s in (0, 4):
        want = sample(tiny, noise[:, :, s:s + 4], (1, 2), 2, 4.0)
        assert torch.allclose(got[:, :, s:s + 4], want, atol=1e-6)


def test_freenoise_reuses_earlier_noise():
    noise = initial_noise((1, 3, 13, 4, 4), 0)
    out = reschedule_noise(noise, window=4, stride=2, seed=0)
    assert torch.equal(out[:, :, :4], noise[:, :, :4])
    for f in range(4, 13):  # every later frame is one of the first window's noise frames
        assert any(torch.equal(out[:, :, f], noise[:, :, g]) for g in range(4))


@pytest.mark.parametrize("call,words", [
    (lambda: frame_weights(8, [0], 4), r"frames \[4, 5, 6, 7\] are in no window"),
    (lambda: frame_weights(8, [], 4), "starts is empty"),
    (lambda: frame_weights(8, [5], 4), "outside the video"),
    (lambda: frame_weights(8, [0], 0), "window must be > 0"),
    (lambda: frame_weights(8, [10], 4), r"start 10 is outside the video.*\[0, 4\]"),
    (lambda: frame_weights(8, [-2], 4), "start -2 is outside the video"),
    (lambda: blend_weights(0), "window must be > 0"),  # was an empty tensor
    (lambda: blend_weights(-1), "window must be > 0"),  # was torch's RuntimeError
    (lambda: sample_windows(None, torch.zeros(1, 8, 4, 4), 0), r"noise must be \[B, C, T"),
    (lambda: reschedule_noise(initial_noise((1, 3, 8, 4, 4), 0), 0, 2, 0), "window must be"),
    (lambda: reschedule_noise(initial_noise((1, 3, 8, 4, 4), 0), 4, -1, 0), "stride must be"),
    (lambda: reschedule_noise(torch.zeros(3, 8), 4, 2, 0), r"noise must be \[B, C, T"),
])
def test_windows_helpers_refuse_what_they_cannot_answer(call, words):
    with pytest.raises(InputError, match=words):
        call()


@pytest.mark.parametrize("kwargs,words", [
    ({"steps": 0}, "steps must be > 0"), ({"steps": -1}, "steps must be > 0"),
    ({"cfg_scale": float("nan")}, "cfg_scale must be finite"),
    ({"cfg_scale": float("inf")}, "cfg_scale must be finite"),
])
def test_sample_windows_refuses_no_steps_and_nan_guidance(tiny, kwargs, words):
    noise = initial_noise((1, 3, 8, 8, 8), 0)
    args = {"steps": 2, "cfg_scale": 4.0, **kwargs}
    with pytest.raises(InputError, match=words):
        sample_windows(tiny, noise, (0, 1), WindowSampling(args["steps"], args["cfg_scale"],
                                                           window=4, stride=2))


def test_seam_metric_sees_a_jump():
    t = torch.arange(12, dtype=torch.float64)
    clip = (t / 12).view(12, 1, 1, 1).expand(12, 3, 4, 4).clone()
    clip[8:] += 0.5  # a jump between frames 7 and 8
    m = seam_metric(clip, boundaries(12, 8, 4))
    assert m["boundaries"] == [8] and m["ratio"] > 5
    smooth = seam_metric((t / 12).view(12, 1, 1, 1).expand(12, 3, 4, 4), [8])
    assert smooth["ratio"] == pytest.approx(1.0)


@pytest.mark.parametrize("argv,words", [
    (["--window", "9", "--frames", "8"], "longer than the 8-frame video"),
    (["--window", "8", "--stride", "9"], "uncovered"),
    (["--stride", "4"], "--stride has no effect here: it needs --window"),
    (["--blend", "flat"], "needs --window"),
    (["--window", "8", "--frames", "16", "--nproc", "9", "--parallel", "cp"], "--nproc 8 or"),
    (["--window", "8", "--frames", "16", "--stride", "8", "--nproc", "3"], "there are 2"),
    (["--window", "8", "--frames", "1000"], "at most 512"),
    (["--window", "4", "--frames", "8", "--height", "7"], "--height 7 must be a multiple"),
])
def test_generate_window_refusals(capsys, argv, words):
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and words in err and err.count("\n") == 1 and not out, err


def test_bench_windows_listed(capsys):
    main(["bench", "--help"])
    assert "windows" in capsys.readouterr().out


def test_generate_window_json_keys(capsys):
    code = main(["generate", "--window", "8", "--frames", "12", "--stride", "4", "--nproc", "1",
                 "--steps", "2", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["windows"] == 2 and d["starts"] == [0, 4]
    for key in ("seam", "track", "peak_bytes_per_rank", "window_peak_bytes_per_rank",
                "bytes_per_step_per_rank", "state_bytes", "seconds"):
        assert key in d, key
