"""Real video DiTs as the facts sheet describes them: their frame rules and presets.

    cpcourse tokens --model wan2.1-t2v-14b --json

`presets()` reads every model of `data/video_models_and_hardware.json` (read from each model's own
code and configs; the `src` of each preset names the files) into a frozen `ModelPreset`: heads,
layers, hidden size, patch, VAE strides, its `FrameRule` (which frame counts its VAE takes and how
many latent frames they become), forwards per step, and what the planner needs of its pipeline.
`cpcourse.planner.tokens` counts a video's tokens with them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from cpcourse.planner.facts import dit_derived_costs, facts
from cpcourse.support.errors import InputError, did_you_mean, require


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
