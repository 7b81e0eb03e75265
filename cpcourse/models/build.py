"""Real diffusers video transformers built tiny, random weights (no download), and their inputs.

    python -c "from cpcourse.models import build; print(build('wan'))"

`build(arch, tiny=True, seed=0)` returns the architecture's own diffusers class with a small
config: the same code, blocks and attention processors as the released checkpoints, only narrow
and shallow, so it runs on a CPU in milliseconds. `from_pretrained(arch, path_or_id)` loads
real weights through the same class (the path a GPU box takes). `example_inputs` gives seeded
full inputs of the shape each forward expects.

Arch ids: "wan" (Wan 2.1, one timestep per sample), "wan2.2" (Wan 2.2 TI2V: one timestep per
token), "hunyuanvideo" (dual- and single-stream blocks, text joined into self-attention,
guidance-distilled), "cogvideox" (text joined in front of the video, rotary positions passed in).
The tiny models have 12 heads, like Wan 2.1 1.3B, so Ulysses works on 1, 2, 3, 4 and 6 ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.support.errors import InputError, positive_int, require


@dataclass(frozen=True)
class CPPlan:
    """Where an architecture's forward is split and gathered under CP: the per-architecture
    facts `cpcourse.models.parallel` reads, as diffusers' `_cp_plan` holds them per model
    (adding an architecture is adding a row, not an `if` in the hooks).

    rope: the rotary table's kind, "wan" (`[1, S, 1, D]`, tokens on dim 1), "hunyuan" (`[S, D]`,
    tokens on dim 0) or None (no table, or the pipeline passes it in, already per token);
    first_blocks: the block lists, in order, whose first block the sequence is split before (the
    first non-empty one); tp: tensor parallel is built for it (`cpcourse.models.tp`);
    refuse / refuse_shard_io: (config key, value, why) that CP (or `shard_io`) cannot split."""

    rope: str | None
    first_blocks: tuple[str, ...]
    tp: bool = False
    refuse: tuple[tuple[str, object, str], ...] = ()
    refuse_shard_io: tuple[tuple[str, object, str], ...] = ()

    @property
    def rope_token_dim(self) -> int:
        return {"wan": 1, "hunyuan": 0}[self.rope]

    @property
    def rope_builds_rows(self) -> bool:
        """Whether the rotary shard computes its rows from positions (Hunyuan: it needs the
        latents' device) rather than slicing the model's own tables (Wan)."""
        return {"wan": False, "hunyuan": True}[self.rope]


@dataclass(frozen=True)
class Arch:
    id: str
    cls: str  # the diffusers class name
    layout: str  # "BCFHW" or "BFCHW": how the latents are laid out
    tiny: dict  # the tiny config
    real: str  # a hub id with real weights (documentation only: never downloaded here)
    cp: CPPlan
    per_token_timestep: bool = False
    text_joined: bool = False  # text tokens are part of self-attention (counted once under CP)
    guidance_distilled: bool = False  # guidance is an embedding: one forward per step, no CFG pair
    text_mask: bool = False  # the forward takes a text padding mask (and pooled text)
    rotary_passed_in: bool = False  # the pipeline computes the rotary table and passes it in
    optional_blocks: tuple[str, ...] = ()  # block counts that may be 0 (one of them must not)


_WAN_CP = CPPlan(rope="wan", first_blocks=("blocks",), tp=True)
_HUNYUAN_CP = CPPlan(
    rope="hunyuan", first_blocks=("transformer_blocks", "single_transformer_blocks"),
    refuse=(("image_condition_type", "token_replace", "HunyuanVideo's token-replace image "
             "conditioning treats the first frame's tokens apart; cpcourse.models does not "
             "split it yet (use the text-to-video model)"),))
_COGVIDEOX_CP = CPPlan(
    rope=None, first_blocks=("transformer_blocks",),
    refuse_shard_io=(("use_rotary_positional_embeddings", False, "CogVideoX with sin-cos "
                      "positions adds them inside its patch embedding, from local frame "
                      "numbers: use shard_io=False for it"),))


ARCHS = {a.id: a for a in (
    Arch("wan", "WanTransformer3DModel", "BCFHW",
         dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=8, in_channels=4,
              out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64, num_layers=2,
              cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64),
         "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", _WAN_CP),
    Arch("wan2.2", "WanTransformer3DModel", "BCFHW",
         dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=8, in_channels=4,
              out_channels=4, text_dim=16, freq_dim=32, ffn_dim=64, num_layers=2,
              cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=64),
         "Wan-AI/Wan2.2-TI2V-5B-Diffusers", _WAN_CP, per_token_timestep=True),
    Arch("hunyuanvideo", "HunyuanVideoTransformer3DModel", "BCFHW",
         dict(in_channels=4, out_channels=4, num_attention_heads=12, attention_head_dim=8,
              num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=2,
              patch_size_t=1, guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8,
              rope_axes_dim=(4, 2, 2)),
         "hunyuanvideo-community/HunyuanVideo", _HUNYUAN_CP, text_joined=True,
         guidance_distilled=True, text_mask=True,
         optional_blocks=("num_layers", "num_single_layers")),
    Arch("cogvideox", "CogVideoXTransformer3DModel", "BFCHW",
         dict(num_attention_heads=12, attention_head_dim=16, in_channels=4, out_channels=4,
              time_embed_dim=8, text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8,
              sample_frames=9, patch_size=2, temporal_compression_ratio=4,
              max_text_seq_length=7, use_rotary_positional_embeddings=True),
         "THUDM/CogVideoX-5b", _COGVIDEOX_CP, text_joined=True, rotary_passed_in=True),
)}
CLASSES = {a.cls for a in ARCHS.values()}
TEXT_TOKENS = 7  # odd on purpose; CogVideoX's tiny config fixes its text length to this


def arch_info(arch: str) -> Arch:
    require(isinstance(arch, str) and arch in ARCHS,
            f"unknown arch {arch!r}: choose one of {', '.join(ARCHS)}")
    return ARCHS[arch]


def _diffusers():
    try:
        import diffusers
    except ImportError as exc:  # a clear line instead of a traceback from the model code
        raise InputError("cpcourse.models needs diffusers: pip install 'diffusers==0.42.1' "
                         "(or `make setup`, which installs it)") from exc
    return diffusers


def model_class(arch: str):
    """The diffusers class of `arch` (imported on first use: the planner never needs it)."""
    return getattr(_diffusers(), arch_info(arch).cls)


def build(arch: str, tiny: bool = True, seed: int = 0, dtype=torch.float32, **overrides):
    """The tiny `arch` with weights drawn from `torch.manual_seed(seed)`, in eval mode.

    Same seed, same weights, on every rank and in every process: that is what lets a CP run be
    compared with one process. `overrides` change config entries (e.g. `num_layers=1`).
    """
    info = arch_info(arch)
    require(tiny, "build(..., tiny=False) would need real weights: use "
            f"from_pretrained({arch!r}, path_or_hub_id) (e.g. {info.real!r})")
    unknown = sorted(set(overrides) - set(info.tiny))
    require(not unknown, f"{arch} has no config entries {unknown}; it has {sorted(info.tiny)}")
    overrides = {k: _override(k, v, info.tiny[k], arch) for k, v in overrides.items()}
    if info.optional_blocks:  # either kind of block may be left out, not both
        blocks = {k: overrides.get(k, info.tiny[k]) for k in info.optional_blocks}
        require(sum(blocks.values()) >= 1, f"{arch} needs at least one block: got "
                + ", ".join(f"{k}={v}" for k, v in blocks.items()))
    cls = model_class(arch)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = cls(**{**info.tiny, **overrides})
    finally:
        torch.random.set_rng_state(state)  # building a model must not move the caller's seed
    return cast(model, dtype).eval()


def _override(name: str, value, default, arch: str):
    """A config override of the default's kind: sizes whole numbers > 0 (heads=0 divides by
    zero inside diffusers, layers=0 leaves no block to split), flags bools."""
    if isinstance(default, bool):
        require(isinstance(value, bool), f"{name} must be True or False, got {value!r}")
    elif isinstance(default, int):  # a kind of block may be dropped (checked above)
        return positive_int(name, value, allow_zero=name in ARCHS[arch].optional_blocks)
    elif isinstance(default, tuple):
        require(isinstance(value, tuple | list) and len(value) == len(default),
                f"{name} must be {len(default)} whole numbers like {default}, got {value!r}")
        return tuple(positive_int(f"{name}[{i}]", v) for i, v in enumerate(value))
    return value


def cast(model, dtype):
    """Cast to `dtype` as `from_pretrained(torch_dtype=...)` does: the model's
    `_keep_in_fp32_modules` (Wan: rope tables, time embedder, norms) keep their precision."""
    require(dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16),
            f"dtype must be float32, float64, bfloat16 or float16, got {dtype}")
    keep = () if dtype == torch.float64 else tuple(getattr(model, "_keep_in_fp32_modules", None)
                                                   or ())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        if t.is_floating_point() and not any(k in name.split(".") for k in keep):
            t.data = t.data.to(dtype)
    return model


def arch_of(model) -> Arch:
    """The Arch a diffusers model belongs to (Wan 2.1 and 2.2 share a class: "wan")."""
    name = type(model).__name__
    for info in ARCHS.values():
        if info.cls == name:
            return info
    raise InputError(f"cpcourse.models supports {', '.join(sorted(CLASSES))}; got {name} "
                     "(add its split points and attention processor to cpcourse.models first)")


def latent_shape(arch: str, frames: int, height: int, width: int, batch: int = 1) -> tuple:
    """The latents' shape: `[B, C, F, H, W]` (Wan, HunyuanVideo), `[B, F, C, H, W]` (CogVideoX)."""
    info = arch_info(arch)
    c = info.tiny["in_channels"]
    return (batch, c, frames, height, width) if info.layout == "BCFHW" else (
        batch, frames, c, height, width)


def tokens(arch: str, frames: int, height: int, width: int) -> tuple[int, int]:
    """(video tokens, tokens per latent frame) of the tiny `arch` at this latent size."""
    cfg = arch_info(arch).tiny
    p = cfg["patch_size"]
    ph, pw = (p[1], p[2]) if isinstance(p, tuple) else (p, p)
    pt = p[0] if isinstance(p, tuple) else (cfg.get("patch_size_t") or 1)
    per_frame = (height // ph) * (width // pw)
    return (frames // pt) * per_frame, per_frame


def check_size(arch: str, frames: int, height: int, width: int) -> None:
    cfg = arch_info(arch).tiny
    p = cfg["patch_size"]
    ph = p[1] if isinstance(p, tuple) else p
    for name, n in (("frames", frames), ("height", height), ("width", width)):
        require(isinstance(n, int) and n >= 1, f"{name} must be a whole number >= 1, got {n!r}")
    require(height % ph == 0 and width % ph == 0,
            f"{arch} cuts latents into {ph} x {ph} patches: height and width must be multiples "
            f"of {ph}, got {height} x {width}")
    if "rope_max_seq_len" in cfg:  # Wan's rotary table: positions 0 .. max - 1 on each axis
        most = cfg["rope_max_seq_len"]
        grid = {"frames": frames // p[0], "height": height // ph, "width": width // ph}
        over = [f"{name} {n} ({grid[name]} positions)" for name, n in
                (("frames", frames), ("height", height), ("width", width)) if grid[name] > most]
        require(not over, f"the tiny {arch}'s rotary table covers {most} positions per axis: "
                f"{', '.join(over)} is too large")
    if arch_info(arch).rotary_passed_in:  # the pipeline's table covers the sample grid
        require(height <= cfg["sample_height"] and width <= cfg["sample_width"],
                f"the tiny cogvideox's rotary grid covers at most {cfg['sample_height']} x "
                f"{cfg['sample_width']} latent pixels, got {height} x {width}")


def example_inputs(arch: str, frames: int = 5, height: int = 8, width: int = 8, batch: int = 1,
                   seed: int = 0, dtype=torch.float32, t: float | None = None) -> dict:
    """Seeded full inputs for one forward of the tiny `arch`, as keyword arguments.

    `t`: the diffusion timestep, the same for every token; None: 500, except that Wan 2.2,
    which takes one timestep per token, gets random ones (so that slicing them wrongly shows).
    HunyuanVideo gets a text mask whose last 2 to 4 tokens are padding; CogVideoX its rotary
    table, which the pipeline computes and passes in.
    """
    info = arch_info(arch)
    check_size(arch, frames, height, width)
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)  # noqa: E731
    cfg = info.tiny
    n_tok, _ = tokens(arch, frames, height, width)
    kw = {"hidden_states": rand(*latent_shape(arch, frames, height, width, batch))}
    text_dim = cfg.get("text_dim") or cfg["text_embed_dim"]
    kw["encoder_hidden_states"] = rand(batch, TEXT_TOKENS, text_dim)
    if info.per_token_timestep:
        kw["timestep"] = (torch.rand(batch, n_tok, generator=gen, dtype=torch.float64) * 1000
                          if t is None else torch.full((batch, n_tok), t,
                                                       dtype=torch.float64)).to(dtype)
    else:
        kw["timestep"] = torch.full((batch,), 500.0 if t is None else t, dtype=dtype)
    if info.text_mask:
        mask = torch.ones(batch, TEXT_TOKENS, dtype=torch.bool)
        for i in range(batch):  # padding of different lengths per sample (2, 3, 4, 2, ...)
            mask[i, TEXT_TOKENS - 2 - i % 3:] = False
        kw["encoder_attention_mask"] = mask
        kw["pooled_projections"] = rand(batch, cfg["pooled_projection_dim"])
    if info.guidance_distilled:  # 6.0 x 1000: Tencent/HunyuanVideo hyvideo/config.py's default
        # --embedded-cfg-scale 6.0, times 1000 as diffusers' HunyuanVideoPipeline embeds it
        kw["guidance"] = torch.full((batch,), 6000.0, dtype=dtype)
    if info.rotary_passed_in:
        kw["image_rotary_emb"] = cogvideox_rotary(frames, height, width)
    return kw


def cogvideox_rotary(frames: int, height: int, width: int, head_dim: int | None = None,
                     base: tuple[int, int] | None = None, patch: int | None = None):
    """The rotary table CogVideoX's pipeline passes in: (cos, sin), each `[F * h * w, D]`.
    `height`, `width` in latent pixels; `base` is the model's sample size (latent pixels) and
    `patch` its patch size (the tiny config's when not given)."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cfg = ARCHS["cogvideox"].tiny
    p = patch or cfg["patch_size"]
    grid = (height // p, width // p)
    # The pipeline fits the grid inside the base grid (aspect kept) and centres it; its helper
    # lives in a module that imports transformers, so the few lines are here.
    base_h, base_w = (b // p for b in (base or (cfg["sample_height"], cfg["sample_width"])))
    if grid[0] / grid[1] > base_h / base_w:
        rh, rw = base_h, int(round(base_h / grid[0] * grid[1]))
    else:
        rh, rw = int(round(base_w / grid[1] * grid[0])), base_w
    top, left = int(round((base_h - rh) / 2.0)), int(round((base_w - rw) / 2.0))
    crops = ((top, left), (top + rh, left + rw))
    return get_3d_rotary_pos_embed(embed_dim=head_dim or cfg["attention_head_dim"],
                                   crops_coords=crops, grid_size=grid, temporal_size=frames)
