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
import re
from dataclasses import asdict, dataclass
from functools import lru_cache

from cpcourse.planner.facts import dit_derived_costs, facts
from cpcourse.support.errors import (
    InputError,
    did_you_mean,
    positive_float,
    positive_int,
    require,
)
from cpcourse.support.shards import video_shard_sizes


@dataclass(frozen=True)
class FrameRule:
    """How a VAE turns F pixel frames into latent frames.

    kind: "none" (T = F), "causal" (T = (F-1)//stride + 1, valid F = step*n + 1),
    "chunked" (`chunk` frames -> `per_chunk` latents, remainder at `stride`), "chunks-only"
    (only whole chunks: T = F//chunk * per_chunk).
    """

    kind: str
    stride: int = 1
    step: int = 1
    chunk: int = 0
    per_chunk: int = 0

    def describe(self) -> str:
        if self.kind == "none":
            return "T = F (no temporal compression)"
        if self.kind == "causal":
            grid = f", F = {self.step}n+1" if self.step > 1 else ""
            return f"T = (F-1)//{self.stride} + 1{grid}"
        if self.kind == "chunks-only":
            return f"T = F//{self.chunk} * {self.per_chunk}, F a multiple of {self.chunk}"
        return (f"T = F//{self.chunk} * {self.per_chunk} + ceil((F % {self.chunk}) / "
                f"{self.stride})")

    def is_valid(self, frames: int) -> bool:
        if frames < 1:
            return False
        if self.kind == "causal":
            return (frames - 1) % self.step == 0
        if self.kind == "chunks-only":
            return frames % self.chunk == 0
        return True

    def nearest_valid(self, frames: int) -> int:
        """The smallest valid frame count >= `frames` (what a UI snaps a slider to)."""
        frames = max(1, int(frames))
        if self.kind == "causal":
            return frames + (-(frames - 1)) % self.step
        if self.kind == "chunks-only":
            return max(self.chunk, frames + (-frames) % self.chunk)
        return frames

    def latent_frames(self, frames: int) -> int:
        if self.kind == "none":
            return frames
        if self.kind == "causal":
            return (frames - 1) // self.stride + 1
        whole = frames // self.chunk * self.per_chunk
        if self.kind == "chunks-only":
            return whole
        return whole + math.ceil((frames % self.chunk) / self.stride)


def _rule_from_preset(m: dict) -> FrameRule:
    kind = m["latent_frame_rule_kind"]
    if kind.startswith("none"):
        return FrameRule("none")
    if kind.startswith("causal"):
        stride = int(re.search(r"//(\d+)", kind).group(1))
        # Some VAEs accept a coarser frame grid than their stride (CogVideoX: F = 8n+1).
        step = re.search(r"F=(\d+)n\+1", m["vae"].get("rule", ""))
        return FrameRule("causal", stride=stride, step=int(step.group(1)) if step else stride)
    if kind.startswith("stepvideo"):
        return FrameRule("chunks-only", chunk=17, per_chunk=3)
    if kind.startswith("chunked"):
        chunk, per = map(int, re.search(r"(\d+)->(\d+)", kind).groups())
        return FrameRule("chunked", stride=m["vae"]["t"], chunk=chunk, per_chunk=per)
    raise InputError(f"unknown latent-frame rule {kind!r} in the facts sheet")


@dataclass(frozen=True)
class ModelPreset:
    """A real video DiT as the facts sheet describes it (sizes in tokens, not pixels)."""

    id: str
    name: str
    params_b: float
    vae_temporal: int
    vae_spatial: int
    latent_channels: int
    patch: tuple[int, int, int]
    hidden: int
    heads: int
    head_dim: int
    layers: int
    ffn: int
    text_tokens: int
    text_joint: bool
    cfg_forwards: int  # forwards per sampling step: 2 with CFG, 3 with Open-Sora 2.0's 3-way
    # guidance, 1 when guidance-distilled (`_forwards`)
    attention: str
    parallel: str
    default_height: int
    default_width: int
    default_frames: int
    default_fps: float | None
    rule: FrameRule
    src: str
    # what the planner's modules need of the model, resolved once from the facts sheet:
    block_params: float  # parameters of the blocks one token meets (see `_block_params`)
    vae_family: str | None  # the VAE the decode tables know it by; None: not counted
    text_encoder: tuple[float, str] | None  # (parameters, source); None: not counted
    released_dtypes: tuple[tuple[int, int, int], str] | None  # bytes per parameter of
    # (transformer, text encoder, VAE) in the released code, and the source; None: not read
    tp_all_reduces_per_forward: int  # TP all-reduces in one forward, as the blocks have them
    tp_all_reduces_src: str | None  # where the blocks are not all alike, the facts sheet's count
    split_rule: tuple[str, str] | None  # (rule, source): how the released code splits the
    # sequence, where that constrains the layout
    # how block_params was obtained: "derived: ..." (counted on diffusers' class, meta device)
    # or "estimated: ..." with the reason; and where cfg_forwards was read
    derivation: str = ""
    cfg_forwards_src: str = ""

    @property
    def factored(self) -> bool:
        return self.attention.upper().startswith("FACTORED")


def _block_params(m: dict, hidden: int, layers: int, cross: bool) -> float:
    """The parameters of the blocks one token meets (one expert of an MoE; a cross-attention's
    K/V weights included, though they meet the text): where tools/derive_dit_costs.py counted
    the model on diffusers' own module, its matmul FLOPs per token / 2 plus those K/V weights;
    else the facts sheet's estimate, which counts every block parameter (HunyuanVideo: 12.46 B
    where a token meets 6.79 B: the modulation linears act on the timestep, the text stream's
    weights on the text)."""
    derived = dit_derived_costs().get(m["id"])
    if derived:
        return derived["matmul_flops_per_token"] / 2 + (2 * hidden ** 2 * layers if cross else 0)
    return float(m.get("est_block_params_B") or m["params_B"]) * 1e9


def _pipeline_facts(m: dict, layers: int, text_joint: bool) -> dict:
    """The facts sheet's fields on the rest of the pipeline and on how the code splits work."""
    enc, rel = m.get("text_encoder_params"), m.get("released_bytes_per_param")
    reduces, split = m.get("tp_all_reduces_per_forward"), m.get("sequence_split")
    return {
        "vae_family": m.get("vae_family"),
        "text_encoder": (enc["params"], enc["src"]) if enc else None,
        "released_dtypes": ((rel["transformer"], rel["text_encoder"], rel["vae"]), rel["src"])
        if rel else None,
        # a joint-attention block all-reduces twice (attention, MLP), a cross-attention one thrice
        "tp_all_reduces_per_forward": reduces["count"] if reduces
        else layers * (2 if text_joint else 3),
        "tp_all_reduces_src": reduces["src"] if reduces else None,
        "split_rule": (split["rule"], split["src"]) if split else None,
    }


def _forwards(m: dict) -> tuple[int, str]:
    """Forwards per sampling step and where that was read: the facts sheet's forwards_per_step
    (read from each pipeline's sampler: 2 with CFG, 3 for Open-Sora 2.0's text + image
    guidance, 1 guidance-distilled), else what its `cfg` text says."""
    fwd = m.get("forwards_per_step")
    if fwd:
        return int(fwd["count"]), fwd["src"]
    cfg = m["cfg"].lower()
    distilled = cfg.startswith("guidance-distilled") or "cfg 1.0" in cfg
    return (1 if distilled else 2), f"facts sheet cfg: {m['cfg']}"


def _preset(m: dict) -> ModelPreset:
    forwards, forwards_src = _forwards(m)
    how = m.get("derivation") or {"kind": "estimated", "how": "no derivation recorded"}
    d = m["default"]
    text_tokens, text_joint = m.get("text_tokens") or 0, bool(m["text_joint"])
    cross = not text_joint and bool(text_tokens)
    return ModelPreset(
        id=m["id"], name=m["name"], params_b=float(m["params_B"]),
        vae_temporal=m["vae"]["t"], vae_spatial=m["vae"]["s"], latent_channels=m["vae"]["ch"],
        patch=(m["patch"]["t"], m["patch"]["h"], m["patch"]["w"]),
        hidden=m["hidden"], heads=m["heads"], head_dim=m["head_dim"], layers=m["layers"],
        ffn=m.get("ffn") or 4 * m["hidden"], text_tokens=text_tokens, text_joint=text_joint,
        cfg_forwards=forwards, attention=m["attention"], parallel=m["parallel"],
        default_height=d["H"], default_width=d["W"], default_frames=d["F"],
        default_fps=d.get("fps"), rule=_rule_from_preset(m), src=m["src"],
        block_params=_block_params(m, m["hidden"], m["layers"], cross),
        **_pipeline_facts(m, m["layers"], text_joint),
        derivation=f"{how['kind']}: {how['how']}", cfg_forwards_src=forwards_src,
    )


@lru_cache(maxsize=1)
def presets() -> dict[str, ModelPreset]:
    """Every model of the facts sheet, by its `id`."""
    return {m["id"]: _preset(m) for m in facts()["models"]}


def get_model(model_id: str) -> ModelPreset:
    """The preset `model_id`, or an `InputError` listing the ids that exist."""
    table = presets()
    require(isinstance(model_id, str), f"model must be a preset id (a string) such as "
            f"{next(iter(table))!r}, got {model_id!r} (see `cpcourse tokens --list`)")
    if model_id not in table:
        close = [k for k in table if model_id.lower().split("-")[0] in k]
        raise InputError(f"unknown model {model_id!r}: {did_you_mean(model_id, table)}use one of "
                         f"{', '.join(close or table)} (see `cpcourse tokens --list`)")
    return table[model_id]


def as_preset(model: ModelPreset | str) -> ModelPreset:
    """`model` itself, or the preset of the id `model`: the planner resolves an id once, at its
    edge, and hands the preset down."""
    return model if isinstance(model, ModelPreset) else get_model(model)


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
