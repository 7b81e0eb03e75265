"""Token counts against the facts sheet and the seed article's correct figures."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cpcourse.planner import tokens
from cpcourse.planner.facts import facts
from cpcourse.support.errors import InputError

FACTS = facts()


@pytest.mark.parametrize("m", FACTS["models"], ids=lambda m: m["id"])
def test_every_preset_matches_the_facts_sheet(m):
    t = tokens.model_tokens(m["id"])
    assert [t.latent_frames, t.latent_height, t.latent_width] == m["latent_grid_THW"]
    assert [t.token_frames, t.latent_height // m["patch"]["h"],
            t.latent_width // m["patch"]["w"]] == m["token_grid_THW"]
    assert t.video_tokens == m["video_tokens_default"]
    assert t.sequence_length == m["joint_seq_len_default"]
    assert t.text_tokens == (m.get("text_tokens") or 0)


def test_seed_432k_tokens_without_time_compression():
    t = tokens.video_tokens(720, 1280, 120, vae_spatial=8, patch=(1, 2, 2))
    assert (t.tokens_per_frame, t.video_tokens) == (3600, 432_000)


def test_seed_900_tokens_per_frame_needs_32_pixels_per_token():
    # 16 px per token (8x VAE, 2x2 patch) gives 3,600 per 720p frame, not ~900.
    assert tokens.video_tokens(720, 1280, 1).tokens_per_frame == 3600
    # 32 px per token at Wan2.2-5B's 704x1280 gives 880, the "~900" of the article.
    assert tokens.model_tokens("wan2.2-ti2v-5b", 704, 1280, 1).tokens_per_frame == 880


def test_real_causal_vaes_compress_time():
    assert tokens.video_tokens(720, 1280, 121, vae_temporal=4).video_tokens == 111_600
    assert tokens.video_tokens(720, 1280, 121, vae_temporal=8).video_tokens == 57_600
    assert tokens.video_tokens(720, 1280, 49, vae_temporal=4).video_tokens == 46_800


def test_frame_rules():
    assert tokens.get_model("step-video-t2v-30b").rule.latent_frames(204) == 36
    assert tokens.get_model("open-sora-1.2-stdit3").rule.latent_frames(408) == 120
    assert tokens.get_model("mochi-1").rule.latent_frames(163) == 28
    assert tokens.get_model("latte-xl-2").rule.latent_frames(16) == 16


def test_clip_length_uses_the_first_frame_rule():
    rule = tokens.get_model("wan2.1-t2v-14b").rule
    assert tokens.frames_for_clip(16, 5, rule) == 81
    assert tokens.frames_for_clip(24, 5, tokens.FrameRule("none")) == 120
    # 24 fps x 5 s + 1 = 121 is already 4n+1; 8n+1 models snap up from 121 too.
    assert tokens.frames_for_clip(24, 5, tokens.get_model("cosmos-1.0-diffusion-7b").rule) == 121


@pytest.mark.parametrize("call, words", [
    (lambda: tokens.video_tokens(-720, 1280, 5), "height must be > 0"),
    (lambda: tokens.video_tokens(720, 1280, 0), "frames must be > 0"),
    (lambda: tokens.video_tokens(721, 1280, 5), "not divisible by 16"),
    (lambda: tokens.model_tokens("wan2.1-t2v-14b", frames=80), "use 81"),
    (lambda: tokens.model_tokens("step-video-t2v-30b", frames=100), "use 102"),
    (lambda: tokens.get_model("sora"), "unknown model 'sora'"),
    (lambda: tokens.parse_patch("2,2"), "three integers"),
    (lambda: tokens.frames_for_clip(-3, 5, tokens.FrameRule("none")), "fps must be"),
])
def test_bad_input_says_what_to_change(call, words):
    with pytest.raises(InputError, match=words.replace("(", r"\(")) as info:
        call()
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 200), st.sampled_from([1, 4, 8]),
       st.sampled_from([(1, 2, 2), (1, 1, 1), (2, 2, 2)]))
def test_tokens_formula(h16, w16, frames, vt, patch):
    t = tokens.video_tokens(h16 * 16, w16 * 16, frames, vae_temporal=vt, vae_spatial=8,
                            patch=patch)
    t_lat = frames if vt == 1 else (frames - 1) // vt + 1
    expect = math.ceil(t_lat / patch[0]) * (h16 * 2 // patch[1]) * (w16 * 2 // patch[2])
    assert t.video_tokens == expect == t.token_frames * t.tokens_per_frame
    json.dumps(t.as_dict())


@given(st.integers(1, 500), st.sampled_from(["wan2.1-t2v-14b", "cogvideox-2b", "mochi-1",
                                             "step-video-t2v-30b", "open-sora-1.2-stdit3"]))
def test_nearest_valid_is_valid_and_not_smaller(frames, model):
    rule = tokens.get_model(model).rule
    snapped = rule.nearest_valid(frames)
    assert snapped >= frames and rule.is_valid(snapped)
    assert rule.nearest_valid(snapped) == snapped
