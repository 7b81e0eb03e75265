"""Graded tests of notebook 00's exercises: counting a video's DiT tokens (00.1), and which ranks
of a token split hold whole frames (00.2).

    python -m pytest tests/graded/test_ex00_tokens.py --impl exercises

00.1 is compared with the library's own `cpcourse.planner.tokens.video_tokens`, 00.2 with a
brute-force `torch.tensor_split` of the token indices.
"""

from __future__ import annotations

import operator
import random

import pytest
import torch

from cpcourse.course.testing import assert_close
from cpcourse.planner.tokens import model_tokens, video_tokens

HINT = ("count latent frames first (what does a causal VAE do with the first frame?), then "
        "patches along each axis: which one is padded, so rounds up?")


def _check(mod, height, width, frames, vae_temporal=1, vae_spatial=8, patch=(1, 2, 2)):
    call = (f"count_video_tokens({height}, {width}, {frames}, vae_temporal={vae_temporal}, "
            f"vae_spatial={vae_spatial}, patch={patch})")
    got = mod.count_video_tokens(height, width, frames, vae_temporal=vae_temporal,
                                 vae_spatial=vae_spatial, patch=patch)
    try:
        operator.index(got)  # an int, not 432000.0: a count of tokens is whole
    except TypeError:
        pytest.fail(f"{call} returned {got!r} ({type(got).__name__}); return an int "
                    "(use // and math.ceil, not /)", pytrace=False)
    want = video_tokens(height, width, frames, vae_temporal=vae_temporal,
                        vae_spatial=vae_spatial, patch=patch).video_tokens
    assert_close(got, want, name=call, hint=HINT)


@pytest.mark.ex("00.1")
def test_720p_five_seconds(impl):
    """The facts sheet's example: 720 x 1280, 120 frames, 8x VAE, patch (1, 2, 2)."""
    mod = impl("ex00_tokens")
    _check(mod, 720, 1280, 120)
    assert mod.count_video_tokens(720, 1280, 120) == 432_000


@pytest.mark.ex("00.1")
def test_causal_vae_121_frames(impl):
    """A 4x causal VAE keeps the first frame apart: 121 frames -> 31 latent frames."""
    mod = impl("ex00_tokens")
    _check(mod, 720, 1280, 121, vae_temporal=4)
    assert mod.count_video_tokens(720, 1280, 121, vae_temporal=4) == 111_600


@pytest.mark.ex("00.1")
def test_temporal_patch_rounds_up(impl):
    """A temporal patch of 2 over an odd number of latent frames: the last patch is padded."""
    _check(impl("ex00_tokens"), 480, 832, 81, vae_temporal=4, patch=(2, 2, 2))


@pytest.mark.ex("00.1")
def test_random_sizes(impl):
    """Many random videos (seeded), sizes divisible by the VAE x patch."""
    mod, rng = impl("ex00_tokens"), random.Random(0)
    for _ in range(200):
        s, p_t, p_h, p_w = rng.choice([8, 16]), rng.choice([1, 2]), rng.choice([1, 2]), 2
        vt = rng.choice([1, 4, 8])
        frames = rng.randrange(1, 200)
        if vt > 1:  # a causal VAE takes F = vt * n + 1 frames
            frames = vt * (frames // vt) + 1
        height, width = s * p_h * rng.randrange(1, 90), s * p_w * rng.randrange(1, 160)
        _check(mod, height, width, frames, vae_temporal=vt, vae_spatial=s, patch=(p_t, p_h, p_w))


# --- 00.2 which ranks hold whole frames -----------------------------------------------------------

def _mid_frame_ranks(frames, tokens_per_frame, world):
    """The truth, by brute force: split the token indices and look at each run's ends."""
    runs = torch.tensor_split(torch.arange(frames * tokens_per_frame), world)
    return [r for r, run in enumerate(runs) if len(run)
            and (int(run[0]) % tokens_per_frame or (int(run[-1]) + 1) % tokens_per_frame)]


def _check_mid_frame(mod, frames, tokens_per_frame, world, what=""):
    got = mod.ranks_split_mid_frame(frames, tokens_per_frame, world)
    want = _mid_frame_ranks(frames, tokens_per_frame, world)
    call = f"ranks_split_mid_frame({frames}, {tokens_per_frame}, {world}){what}"
    assert isinstance(got, list) and all(isinstance(r, int) for r in got), \
        f"{call} returned {got!r}: return a list of rank numbers (ints)"
    runs = [len(x) for x in torch.tensor_split(torch.arange(frames * tokens_per_frame), world)]
    assert got == want, (
        f"{call} = {got}, want {want}. The ranks hold runs of {runs[:12]}"
        f"{' ...' if world > 12 else ''} tokens; a frame is {tokens_per_frame} tokens, so frame "
        f"boundaries are the multiples of {tokens_per_frame}.")


@pytest.mark.ex("00.2")
def test_real_models_at_their_default_size(impl):
    """HunyuanVideo's 33 latent frames split as tokens over 8 GPUs: every rank's run starts or
    ends mid-frame; Wan2.1-14B's 21 latent frames over 3 and 7 GPUs: whole frames."""
    mod = impl("ex00_tokens")
    for model_id in ("hunyuanvideo-13b", "wan2.1-t2v-14b"):
        t = model_tokens(model_id)
        for world in (2, 3, 4, 7, 8):
            _check_mid_frame(mod, t.latent_frames, t.tokens_per_frame, world, f" ({model_id})")


@pytest.mark.ex("00.2")
def test_random_videos_and_more_ranks_than_tokens(impl):
    mod, rng = impl("ex00_tokens"), random.Random(2)
    for frames, tokens_per_frame, world in [(3, 4, 5), (1, 1, 4), (2, 3, 7), (4, 1, 3),
                                            (6, 5, 6), (6, 5, 4), (5, 2, 10)]:
        _check_mid_frame(mod, frames, tokens_per_frame, world)
    for _ in range(300):
        _check_mid_frame(mod, rng.randrange(1, 40), rng.randrange(1, 60), rng.randrange(1, 17))
