"""A tiny video diffusion transformer that runs in one process or under CP with the same weights.

    cpcourse generate --nproc 2 --seed 0 --save /tmp/sample.pt

Shapes: latent video `[B, C, T, Hl, Wl]`; patchified tokens `[B, T, S, C*p*p]` with
S = (Hl/p) * (Wl/p); hidden states `[B, T, S, hidden]`; attention heads `[B, H, T, S, D]`
(the layout of `cpcourse.video`). Under CP a rank holds frames `[t0, t0 + T_r)` of every one of
these and nothing else: patch embedding, modulation, MLPs and spatial attention are per frame,
so only the temporal (or full 3D) attention talks to other ranks.

Blocks (DiT with adaLN-zero-style modulation from timestep + class embeddings):
    factored: x += g1 * SpatialAttn(mod(norm(x)));  x += g2 * TemporalAttn(...);  x += g3 * MLP(...)
    full:     x += g1 * Full3DAttn(mod(norm(x)));   x += g2 * MLP(...)
q and k get 3D rotary embeddings at their GLOBAL frame index. Class id `num_classes` is the
"no condition" id used by classifier-free guidance. The weights are random (seeded): this model
shows that CP is exact, not that it draws cats.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from cpcourse import video
from cpcourse.rope import rope_3d
from cpcourse.support.errors import require

ATTENTIONS = ("factored", "full")


@dataclass(frozen=True)
class DiTConfig:
    """Model size. head_dim = hidden // heads must be even and >= 6 (3D rotary)."""

    in_channels: int = 4
    patch: int = 2
    hidden: int = 64
    heads: int = 4
    depth: int = 2
    mlp_ratio: int = 4
    num_classes: int = 10
    attention: str = "factored"      # "factored" (spatial + temporal) or "full" (3D)

    def __post_init__(self):
        require(self.attention in ATTENTIONS,
                f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        require(self.hidden % self.heads == 0,
                f"hidden {self.hidden} must be divisible by heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CPContext:
    """Where this rank's frames sit: group (None = one process, whole video), first frame,
    the token grid, and which CP method temporal / full attention use."""

    group: object = None
    frame_offset: int = 0
    grid: tuple[int, int] = (1, 1)           # (height, width) in tokens: S = h * w
    temporal_method: str = "all_to_all"
    full_method: str = "ring"


def patchify(latent: torch.Tensor, p: int) -> torch.Tensor:
    """`[B, C, T, Hl, Wl]` -> tokens `[B, T, S, C*p*p]`, S = (Hl/p) * (Wl/p), (y, x) row-major."""
    b, c, t, hl, wl = latent.shape
    require(hl % p == 0 and wl % p == 0,
            f"latent height and width ({hl}, {wl}) must be multiples of the patch {p}")
    x = latent.reshape(b, c, t, hl // p, p, wl // p, p)
    return x.permute(0, 2, 3, 5, 1, 4, 6).reshape(b, t, (hl // p) * (wl // p), c * p * p)


def unpatchify(tokens: torch.Tensor, c: int, p: int, grid: tuple[int, int]) -> torch.Tensor:
    """Inverse of `patchify`: `[B, T, S, C*p*p]` -> `[B, C, T, h*p, w*p]`."""
    b, t, _, _ = tokens.shape
    h, w = grid
    x = tokens.reshape(b, t, h, w, c, p, p).permute(0, 4, 1, 2, 5, 3, 6)
    return x.reshape(b, c, t, h * p, w * p)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features `[B, dim]` of diffusion times t in [0, 1] (scaled by 1000)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    args = (t.double()[:, None] * 1000.0) * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=-1).to(t.dtype if t.is_floating_point()
                                                          else torch.float32)


def _modulate(x, shift, scale):
    # x [B, T, S, hidden]; shift, scale [B, hidden]: one affine per sample, broadcast over tokens
    return x * (1 + scale[:, None, None]) + shift[:, None, None]


class Attention(nn.Module):
    """qkv projection, 3D rotary, one of the video attentions, output projection."""

    def __init__(self, cfg: DiTConfig, kind: str):
        super().__init__()
        self.cfg, self.kind = cfg, kind     # kind: "spatial", "temporal" or "full"
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, ctx: CPContext) -> torch.Tensor:
        b, t, s, _ = x.shape
        h, d = self.cfg.heads, self.cfg.head_dim
        # [B, T, S, 3*hidden] -> 3 x [B, H, T, S, D]
        q, k, v = self.qkv(x).view(b, t, s, 3, h, d).permute(3, 0, 4, 1, 2, 5).unbind(0)
        q = rope_3d(q, *ctx.grid, frame_offset=ctx.frame_offset)
        k = rope_3d(k, *ctx.grid, frame_offset=ctx.frame_offset)
        if self.kind == "spatial":
            out = video.spatial_attention(q, k, v)
        elif self.kind == "temporal":
            out = (video.temporal_attention(q, k, v) if ctx.group is None else
                   video.temporal_attention_cp(q, k, v, ctx.group, method=ctx.temporal_method))
        else:
            out = (video.full_attention(q, k, v) if ctx.group is None else
                   video.full_attention_cp(q, k, v, ctx.group, method=ctx.full_method))
        del q, k, v
        return self.proj(out.permute(0, 2, 3, 1, 4).reshape(b, t, s, h * d))


class Block(nn.Module):
    """One DiT block; `factored` has spatial + temporal attention, `full` one 3D attention."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        kinds = ("spatial", "temporal") if cfg.attention == "factored" else ("full",)
        self.attns = nn.ModuleList(Attention(cfg, k) for k in kinds)
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, cfg.mlp_ratio * cfg.hidden),
                                 nn.GELU(approximate="tanh"),
                                 nn.Linear(cfg.mlp_ratio * cfg.hidden, cfg.hidden))
        self.ada = nn.Linear(cfg.hidden, 3 * (len(kinds) + 1) * cfg.hidden)

    def forward(self, x, c, ctx: CPContext):
        mods = self.ada(nn.functional.silu(c)).chunk(3 * (len(self.attns) + 1), dim=-1)
        # In-place residual adds: the caller's reference to the block input would otherwise keep
        # a second copy of the residual stream alive through the whole block.
        for i, attn in enumerate(self.attns):
            shift, scale, gate = mods[3 * i:3 * i + 3]
            x = x.add_(gate[:, None, None] * attn(_modulate(self.norm(x), shift, scale), ctx))
        shift, scale, gate = mods[-3:]
        return x.add_(gate[:, None, None] * self.mlp(_modulate(self.norm(x), shift, scale)))


class TinyVideoDiT(nn.Module):
    """Predicts the flow velocity of noisy tokens: `[B, T_r, S, C*p*p]` -> same shape."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        patch_dim = cfg.in_channels * cfg.patch ** 2
        self.embed = nn.Linear(patch_dim, cfg.hidden)
        self.t_mlp = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(),
                                   nn.Linear(cfg.hidden, cfg.hidden))
        self.y_embed = nn.Embedding(cfg.num_classes + 1, cfg.hidden)  # last id: unconditional
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(cfg.hidden, 2 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, patch_dim)

    def forward(self, tokens: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                ctx: CPContext | None = None) -> torch.Tensor:
        ctx = ctx or CPContext()
        c = self.t_mlp(timestep_embedding(t, self.cfg.hidden).to(tokens.dtype)) + self.y_embed(y)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, c, ctx)
        shift, scale = self.final_ada(nn.functional.silu(c)).chunk(2, dim=-1)
        return self.out(_modulate(self.norm(x), shift, scale))


def build_model(cfg: DiTConfig, weight_seed: int = 0, dtype=torch.float32) -> TinyVideoDiT:
    """The same weights on every rank and in one process: seeded init, no broadcast needed.

    Gates and the output layer get small non-zero weights (a trained DiT's are non-zero; the
    usual zero init would make an untrained block an identity and hide CP bugs).
    """
    gen = torch.Generator().manual_seed(weight_seed)
    model = TinyVideoDiT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = 0.02 if name.endswith("bias") else 1.0 / math.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * std)
    return model.to(dtype).eval()
