"""Graded tests of notebook 00's exercises: counting a video's DiT tokens.

    python -m pytest tests/graded/test_ex00_tokens.py --impl exercises

Each answer is compared with the library's own `cpcourse.tokens.video_tokens`.
"""

from __future__ import annotations

import operator
import random

import pytest

from cpcourse.course.testing import assert_close
from cpcourse.tokens import video_tokens

HINT = ("latent frames T = F, or (F-1)//vae_temporal + 1 when vae_temporal > 1; "
        "tokens = ceil(T/p_t) * (H // (s*p_h)) * (W // (s*p_w))")


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
