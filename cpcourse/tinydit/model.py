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
q and k get 3D rotary embeddings at their GLOBAL frame index (and, with `frame_embed`, every
token gets an absolute embedding of that index: rotary alone tells frames apart only by their
distance, and the trained model needs to know which frame comes first). Class id `num_classes`
is the "no condition" id used by classifier-free guidance. With `num_motions > 0` a second label
(the shapes model's direction of motion) has its own embedding, added to the first, with its own
"no condition" id `num_motions`. `prediction` says what the network outputs: the flow velocity
(`"velocity"`, noise - x0) or the clean sample (`"sample"`, x0; `cpcourse.tinydit.training` says why
the trained model uses it). `build_model` gives seeded random weights, which show that CP is
exact; `cpcourse.tinydit.training.load_shapes_model` gives the trained ones, which draw.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass

import torch
from torch import nn

from cpcourse import video
from cpcourse.support.errors import InputError, require
from cpcourse.tinydit.embed import frame_embedding, timestep_embedding
from cpcourse.tinydit.embed import patchify as patchify  # re-exported: callers import it here
from cpcourse.tinydit.embed import unpatchify as unpatchify
from cpcourse.tinydit.kinds import KINDS as KINDS  # re-exported, as are the two checks
from cpcourse.tinydit.kinds import require_kind as require_kind
from cpcourse.tinydit.kinds import weights_kind
from cpcourse.tinydit.rope import apply_rope, rope_3d, rope_angles_at

ATTENTIONS = ("factored", "full")
PREDICTIONS = ("velocity", "sample")


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
    num_motions: int = 0             # > 0: a second label with its own embedding
    prediction: str = "velocity"     # what the network outputs: "velocity" or "sample" (x0)
    frame_embed: bool = False        # add an absolute embedding of each token's GLOBAL frame

    def __post_init__(self):
        require(self.prediction in PREDICTIONS,
                f"prediction must be one of {PREDICTIONS}, got {self.prediction!r}")
        require(self.attention in ATTENTIONS,
                f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        require(self.hidden % self.heads == 0,
                f"hidden {self.hidden} must be divisible by heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def null_label(self) -> tuple[int, ...]:
        """The "no condition" label(s) classifier-free guidance passes."""
        return (self.num_classes, self.num_motions) if self.num_motions else (self.num_classes,)


@dataclass(frozen=True)
class CPContext:
    """Where this rank's frames sit: group (None = one process, whole video), first frame,
    the token grid, and which CP method temporal / full attention use. With `mesh`, the frames are
    split over its ring x ulysses ranks and temporal / full attention run USP on it."""

    group: object = None
    frame_offset: int = 0
    grid: tuple[int, int] = (1, 1)           # (height, width) in tokens: S = h * w
    row_offset: int = 0                      # the grid's first row (a rank holding a band of rows)
    temporal_method: str = "all_to_all"
    full_method: str = "ring"
    mesh: object = None                      # a cpcourse.mesh DeviceMesh: USP over ring x ulysses
    # `attend(layer, q, k, v) -> out`, all `[B, H, T_r, S_r, D]` after rotary, replaces the
    # temporal / full attention's exact CP; `layer` is the Attention module, so a hook can keep
    # state per layer: a KV cache (streaming, `cpcourse.tinydit.streaming`) or stale remote
    # K/V (`cpcourse.approx`). `positions` long `[T_r, S_r, 3]`: the (t, y, x) of each token
    # held, for a rank holding a piece of a frame; None: frames from `frame_offset`, rows from
    # `row_offset`.
    attend: object = None
    positions: object = None


def _modulate(x, shift, scale):
    # x [B, T, S, hidden]; shift, scale [B, hidden]: one affine per sample, broadcast over tokens
    return x * (1 + scale[:, None, None]) + shift[:, None, None]


def _residual(x, update):
    # In place under no_grad (inference); autograd needs the old x kept for the norm's backward.
    return x + update if torch.is_grad_enabled() and (x.requires_grad or update.requires_grad) \
        else x.add_(update)


class Attention(nn.Module):
    """qkv projection, 3D rotary, one of the video attentions, output projection."""

    def __init__(self, cfg: DiTConfig, kind: str):
        super().__init__()
        self.cfg, self.kind = cfg, kind     # kind: "spatial", "temporal" or "full"
        self.heads = cfg.heads              # the heads this rank holds (H / tp under TP)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, ctx: CPContext) -> torch.Tensor:
        b, t, s, _ = x.shape
        h, d = self.heads, self.cfg.head_dim
        # [B, T, S, 3*hidden] -> 3 x [B, H, T, S, D]
        q, k, v = self.qkv(x).view(b, t, s, 3, h, d).permute(3, 0, 4, 1, 2, 5).unbind(0)
        if ctx.positions is None:
            q = rope_3d(q, *ctx.grid, frame_offset=ctx.frame_offset, row_offset=ctx.row_offset)
            k = rope_3d(k, *ctx.grid, frame_offset=ctx.frame_offset, row_offset=ctx.row_offset)
        else:
            angles = rope_angles_at(ctx.positions, d)
            q, k = apply_rope(q, angles), apply_rope(k, angles)
        if self.kind == "spatial":
            out = video.spatial_attention(q, k, v)
        elif ctx.attend is not None:
            out = ctx.attend(self, q, k, v)
        elif ctx.mesh is not None:  # USP over the mesh's ring x ulysses dims
            attend = video.full_attention_cp if self.kind == "full" else video.temporal_attention_cp
            out = attend(q, k, v, ctx.mesh, method="usp")
        elif self.kind == "temporal":
            out = (video.temporal_attention(q, k, v) if ctx.group is None else
                   video.temporal_attention_cp(q, k, v, ctx.group, method=ctx.temporal_method))
        else:
            out = (video.full_attention(q, k, v) if ctx.group is None else
                   video.full_attention_cp(q, k, v, ctx.group, method=ctx.full_method))
        del q, k, v
        # out [B, H, T_r, S, D] -> [B, T_r, S, H*D]
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
        # c [B, hidden] -> (shift, scale, gate) per attention and for the MLP, each [B, hidden]
        mods = self.ada(nn.functional.silu(c)).chunk(3 * (len(self.attns) + 1), dim=-1)
        # In-place residual adds at inference: the caller's reference to the block input would
        # otherwise keep a second copy of the residual stream alive through the whole block.
        for i, attn in enumerate(self.attns):
            shift, scale, gate = mods[3 * i:3 * i + 3]
            x = _residual(x, gate[:, None, None] * attn(_modulate(self.norm(x), shift, scale), ctx))
        shift, scale, gate = mods[-3:]
        return _residual(x, gate[:, None, None] * self.mlp(_modulate(self.norm(x), shift, scale)))


class TinyVideoDiT(nn.Module):
    """Noisy tokens `[B, T_r, S, C*p*p]`, times `[B]`, labels `[B]` (or `[B, 2]` with
    `num_motions`) -> the velocity or the clean sample (`cfg.prediction`), tokens' shape."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        patch_dim = cfg.in_channels * cfg.patch ** 2
        self.embed = nn.Linear(patch_dim, cfg.hidden)
        self.t_mlp = nn.Sequential(nn.Linear(cfg.hidden, cfg.hidden), nn.SiLU(),
                                   nn.Linear(cfg.hidden, cfg.hidden))
        self.y_embed = nn.Embedding(cfg.num_classes + 1, cfg.hidden)  # last id: unconditional
        if cfg.num_motions:
            self.m_embed = nn.Embedding(cfg.num_motions + 1, cfg.hidden)
        if cfg.frame_embed:
            self.frame_proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Linear(cfg.hidden, 2 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, patch_dim)

    def forward(self, tokens: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                ctx: CPContext | None = None) -> torch.Tensor:
        ctx = ctx or CPContext()
        x, c = self.embed_inputs(tokens, t, y, ctx)
        for block in self.blocks:
            x = block(x, c, ctx)
        return self.final_layer(x, c)

    def embed_inputs(self, tokens: torch.Tensor, t: torch.Tensor, y: torch.Tensor,
                     ctx: CPContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens `[B, T_r, S, C*p*p]` -> (hidden states `[B, T_r, S, hidden]`, the
        conditioning `[B, hidden]` every block's modulation reads)."""
        c = self.t_mlp(timestep_embedding(t, self.cfg.hidden).to(tokens.dtype))
        if self.cfg.num_motions:
            require(y.dim() == 2 and y.shape[1] == 2, "labels must be [B, 2] (shape, motion) "
                    f"for a model with num_motions, got {tuple(y.shape)}")
            c = c + self.y_embed(y[:, 0]) + self.m_embed(y[:, 1])
        else:
            c = c + self.y_embed(y)
        x = self.embed(tokens)  # [B, T_r, S, C*p*p] -> [B, T_r, S, hidden]
        if self.cfg.frame_embed:
            # Like rotary positions, the index is the GLOBAL frame: a rank's first frame is
            # ctx.frame_offset, not 0, or every rank would hold "the first frames".
            idx = (torch.arange(ctx.frame_offset, ctx.frame_offset + x.shape[1], device=x.device)
                   [:, None] if ctx.positions is None else ctx.positions[..., 0])  # [T_r, 1|S_r]
            fe = self.frame_proj(frame_embedding(idx.flatten(), self.cfg.hidden).to(x.dtype))
            x = x + fe.view(1, *idx.shape, -1)
        return x, c

    def final_layer(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Hidden states `[B, T_r, S, hidden]` -> the prediction `[B, T_r, S, C*p*p]`."""
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


def save_weights(model: TinyVideoDiT, path: str, extra: dict, name: str | None = None) -> None:
    """safetensors file; its metadata holds the model config, `extra` and `kind` (what the
    weights are: `weights_kind`), as JSON strings. A failure to write is an InputError naming
    `name` (the parameter that gave `path`)."""
    from safetensors.torch import save_file

    from cpcourse.support.out_files import replacing

    meta = {"config": json.dumps(model.cfg.as_dict())}
    meta.update({k: json.dumps(v) for k, v in extra.items()})
    meta["kind"] = json.dumps(weights_kind(extra))
    with replacing(path, name) as tmp:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp, metadata=meta)


def load_weights(path: str, dtype=torch.float32) -> tuple[TinyVideoDiT, dict]:
    """A model and its metadata from a file `save_weights` wrote; anything else: InputError."""
    from safetensors import safe_open

    require(not os.path.isdir(path), f"weights {path}: is a directory; give the file "
            "`cpcourse train --out` wrote")
    require(os.path.isfile(path), f"weights {path}: no such file")
    try:
        with safe_open(path, framework="pt") as fh:
            meta = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
        cfg = DiTConfig(**meta["config"])
        model = TinyVideoDiT(cfg)
        model.load_state_dict(tensors)
    except Exception as exc:  # safetensors' own SafetensorError, a bad config, wrong tensors
        raise InputError(f"weights {path}: not a file written by `cpcourse train` "
                         f"({type(exc).__name__})") from None
    return model.to(dtype).eval(), meta
