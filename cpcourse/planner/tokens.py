"""From a video to the DiT's token sequence: VAE compression, patchify, real model presets.

    cpcourse tokens --model wan2.1-t2v-14b --json
    cpcourse tokens --height 720 --width 1280 --fps 24 --seconds 5 --vae-spatial 8 --patch 1,2,2

A video of F frames of H x W pixels is encoded by a VAE that divides space by `s` and time by a
model-specific rule, then cut into patches of (p_t, p_h, p_w) latent cells; each patch is one
token. Presets come from `data/video_models_and_hardware.json`, read from each model's own code
and configs (the `src` of each preset names the files).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cpcourse.planner.presets import (  # noqa: F401 (re-exported: presets are read from here)
    FrameRule,
    ModelPreset,
    as_preset,
    get_model,
    presets,
)
from cpcourse.support.errors import (
    InputError,
    positive_float,
    positive_int,
    require,
)
from cpcourse.support.shards import video_shard_sizes


def frames_for_clip(fps: float, seconds: float, rule: FrameRule) -> int:
    """Frames in a clip of `seconds` at `fps`, snapped up to a count the VAE accepts.

    A causal video VAE encodes the first frame on its own, so clips are fps*seconds + 1 frames
    long (Wan's 81 frames are 5 s at 16 fps).
    """
    fps = positive_float("fps", fps, high=1e4)  # a camera at 10,000 fps
    seconds = positive_float("seconds", seconds, high=1e6)  # eleven days of video
    frames = max(1, round(fps * seconds)) + (1 if rule.kind == "causal" else 0)
    return rule.nearest_valid(frames)


@dataclass(frozen=True)
class TokenCount:
    """The latent grid and token counts of one video (keys of `cpcourse tokens --json`)."""

    frames: int
    height: int
    width: int
    latent_frames: int
    latent_height: int
    latent_width: int
    token_frames: int
    tokens_per_frame: int
    video_tokens: int
    text_tokens: int
    sequence_length: int
    pixels_per_token: int
    frame_rule: str
    model: str | None

    def as_dict(self) -> dict:
        return asdict(self)

    def rank_video_tokens(self, world: int, split: str = "frames") -> list[int]:
        """Video tokens per rank under CP over `world` ranks, as `cpcourse.models` splits them
        (`parallelize(split=...)`): whole latent frames, or the tokens evenly."""
        return video_shard_sizes(self.token_frames, self.tokens_per_frame, world, split)


def parse_patch(text: str) -> tuple[int, int, int]:
    """'1,2,2' -> (1, 2, 2)."""
    try:
        parts = tuple(int(p) for p in str(text).split(","))
    except ValueError:
        parts = ()
    require(len(parts) == 3, f"patch must be three integers T,H,W like 1,2,2, got {text!r}")
    for name, p in zip("THW", parts, strict=True):
        positive_int(f"patch {name}", p)
    return parts  # type: ignore[return-value]


def video_tokens(height: int, width: int, frames: int, *, vae_temporal: int = 1,
                 vae_spatial: int = 8, patch: tuple[int, int, int] = (1, 2, 2),
                 rule: FrameRule | None = None, text_tokens: int = 0, text_joint: bool = False,
                 model: str | None = None) -> TokenCount:
    """Count the tokens of a `frames x height x width` video.

    Manual mode: `vae_temporal` N > 1 uses T = (F-1)//N + 1 (a causal VAE); `rule` overrides it.
    Tokens = ceil(T / p_t) * (H / (s p_h)) * (W / (s p_w)), plus text when it joins attention.
    """
    height, width = positive_int("height", height), positive_int("width", width)
    frames = positive_int("frames", frames)
    vae_temporal = positive_int("vae_temporal", vae_temporal)
    vae_spatial = positive_int("vae_spatial", vae_spatial)
    pt, ph, pw = patch
    text_tokens = positive_int("text_tokens", text_tokens, allow_zero=True)
    if rule is None:
        rule = FrameRule("causal", vae_temporal, 1) if vae_temporal > 1 else FrameRule("none")
    who = model or "this VAE"
    if not rule.is_valid(frames):
        raise InputError(f"{who} takes frame counts with {rule.describe()}; {frames} is not one: "
                         f"use {rule.nearest_valid(frames)}")
    for name, size, p in (("height", height, ph), ("width", width, pw)):
        px = vae_spatial * p
        below = size - size % px
        require(size % px == 0, f"{name} {size} is not divisible by {px} (VAE {vae_spatial} x "
                f"patch {p} pixels per token): use {below or px} or {below + px}")
    t_lat = rule.latent_frames(frames)
    lat_h, lat_w = height // vae_spatial, width // vae_spatial
    t_tok = math.ceil(t_lat / pt)
    per_frame = (lat_h // ph) * (lat_w // pw)
    n_video = t_tok * per_frame
    return TokenCount(
        frames=frames, height=height, width=width, latent_frames=t_lat, latent_height=lat_h,
        latent_width=lat_w, token_frames=t_tok, tokens_per_frame=per_frame, video_tokens=n_video,
        text_tokens=text_tokens, sequence_length=n_video + (text_tokens if text_joint else 0),
        pixels_per_token=vae_spatial * ph, frame_rule=rule.describe(), model=model,
    )


def model_tokens(model_id: str, height: int | None = None, width: int | None = None,
                 frames: int | None = None, *, fps: float | None = None,
                 seconds: float | None = None) -> TokenCount:
    """Tokens of a preset at its defaults, or at the given size (frames or fps x seconds)."""
    m = get_model(model_id)
    if frames is None and seconds is not None:
        frames = frames_for_clip(fps or m.default_fps or 24, seconds, m.rule)
    return video_tokens(
        m.default_height if height is None else height,
        m.default_width if width is None else width,
        m.default_frames if frames is None else frames,
        vae_temporal=m.vae_temporal, vae_spatial=m.vae_spatial, patch=m.patch, rule=m.rule,
        text_tokens=m.text_tokens, text_joint=m.text_joint, model=m.id,
    )


def hunyuan_split_axis(height: int, width: int, world: int) -> str | None:
    """Which axis HunyuanVideo's own multi-GPU inference splits for a `height x width` (pixels)
    video over `world` ranks: "height" when the rows of tokens divide by P, else "width" when
    the columns do, else None (its code refuses the size). The rule, read from
    hyvideo/inference.py (`parallelize_transformer`), tests (H_lat // 2) % P on the latent
    (8x smaller than pixels; the // 2 is the 2x2 patch): at 720p (45 x 80 tokens) the default
    on 2, 4 or 8 GPUs is width."""
    m = get_model("hunyuanvideo-13b")
    rows, cols = height // m.vae_spatial // m.patch[1], width // m.vae_spatial // m.patch[2]
    if rows % world == 0:
        return "height"
    if cols % world == 0:
        return "width"
    return None
