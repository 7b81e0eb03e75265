"""Streaming the chunk-causal shapes model: chunk after chunk, the finished ones in a KV cache.

    cpcourse generate --causal --prompt circle-right --nproc 2 --kv-cache pass-q --compare

Per chunk of `chunk` frames (2 frames of 4 x 4 patches: 32 tokens):
  1. its noise, cut from the whole video's noise drawn from the seed (so the clip does not depend
     on P), is denoised by Euler steps with classifier-free guidance. At every step each layer
     appends the chunk's noisy k, v to its cache, attends, and drops them again: a draft is not
     context for later chunks;
  2. the denoised chunk then runs once more at t = 0 and its k, v are KEPT. The cache so holds
     clean context computed exactly as training's clean pass computes it
     (`cpcourse.tinydit.causal`). Keeping the last step's k, v instead would save this forward
     but cache a chunk seen at t = 1 / steps, a state training never showed.
Under CP the chunk's tokens, frame-major `[chunk * S]`, are split over the P ranks in
`tensor_split` order: with 2-frame chunks and P = 4 a rank holds half a frame, so every token
carries its own (t, y, x) (`CPContext.positions`). All but attention is per token; attention is
`cpcourse.causal.KVCacheCP` in the design asked for (ulysses, pass-q or pass-kv). The cache of
the guided pair is a batch of 2B: conditional and unconditional context differ.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpcourse.attention import attention_with_lse
from cpcourse.support.bytecount import count_bytes
from cpcourse.support.errors import require
from cpcourse.tinydit.model import CPContext, TinyVideoDiT, load_weights, patchify, unpatchify
from cpcourse.tinydit.training import SAMPLE_STEPS


class LocalCache:
    """The one-process KV cache, `KVCacheCP`'s interface without a group: k, v `[B, H, n, D]`."""

    def __init__(self):
        self.k = self.v = None
        self.lens: list[int] = []

    def append(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.lens.append(k.shape[2])

    def attend(self, q):
        return attention_with_lse(q, self.k, self.v)[0]

    def drop_last(self):
        keep = self.k.shape[2] - self.lens.pop()
        self.k, self.v = self.k[:, :, :keep], self.v[:, :, :keep]

    @property
    def cache_bytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


class CachedAttention:
    """The attention hook (`CPContext.attend`) of a stream: one cache per layer. q, k, v
    `[B, H, T_r, S_r, D]` (this rank's tokens of the chunk) -> out, the same shape."""

    def __init__(self, new_cache):
        self.new_cache, self.caches, self.keep = new_cache, {}, False

    def __call__(self, layer, q, k, v):
        if id(layer) not in self.caches:
            self.caches[id(layer)] = self.new_cache()
        cache = self.caches[id(layer)]
        cache.append(k.flatten(2, 3), v.flatten(2, 3))
        out = cache.attend(q.flatten(2, 3))
        if not self.keep:
            cache.drop_last()
        return out.view(q.shape)

    @property
    def cache_bytes(self) -> int:
        return sum(c.cache_bytes for c in self.caches.values())


def chunk_shard(tokens: torch.Tensor, first_frame: int, grid, rank: int, world: int):
    """This rank's piece of one chunk: tokens `[B, c, S, F]` -> (`[B, 1, n_r, F]`, its (t, y, x)
    `[1, n_r, 3]`), n_r from `tensor_split` of the c * S tokens over `world` ranks."""
    b, c, s, f = tokens.shape
    h, w = grid
    t, y, x = torch.meshgrid(torch.arange(first_frame, first_frame + c), torch.arange(h),
                             torch.arange(w), indexing="ij")
    pos = torch.stack([t, y, x], dim=-1).reshape(c * s, 3).tensor_split(world)[rank]
    return tokens.reshape(b, c * s, f).tensor_split(world, dim=1)[rank][:, None], pos[None]


@dataclass(frozen=True)
class StreamRank:
    """Which rank of how many streams (`stream_sample` keeps this rank's tokens of each chunk),
    and `bytes_per_chunk`, a list that receives what this rank sent for each chunk."""

    rank: int = 0
    world: int = 1
    bytes_per_chunk: list | None = field(default=None, compare=False)


@torch.no_grad()
def stream_sample(model: TinyVideoDiT, noise: torch.Tensor, label, chunk: int, new_cache,
                  steps: int = SAMPLE_STEPS, cfg_scale: float = 4.0,
                  where: StreamRank = StreamRank()) -> list[torch.Tensor]:
    """Stream a clip from the whole video's noise `[B, C, T, Hl, Wl]`: this rank's tokens of
    each chunk, denoised, `[B, 1, n_r, F]` per chunk. `new_cache()` makes one layer's cache;
    `where`: this rank, the world size and the list that receives its bytes per chunk."""
    rank, world, bytes_per_chunk = where.rank, where.world, where.bytes_per_chunk
    cfg = model.cfg
    b, _, frames, hl, wl = noise.shape
    require(frames % chunk == 0, f"chunk {chunk} must divide the {frames} frames")
    grid = (hl // cfg.patch, wl // cfg.patch)
    tokens = patchify(noise, cfg.patch)                                # [B, T, S, F]
    y = torch.tensor([tuple(label)] * b + [cfg.null_label] * b)
    hook = CachedAttention(new_cache)
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    out = []
    for first in range(0, frames, chunk):
        x, pos = chunk_shard(tokens[:, first:first + chunk], first, grid, rank, world)
        ctx = CPContext(grid=grid, attend=hook, positions=pos)
        with count_bytes() as sent:
            hook.keep = False
            for i in range(steps):
                t = torch.full((2 * b,), float(times[i]), dtype=x.dtype)
                cond, uncond = model(torch.cat([x, x]), t, y, ctx).chunk(2)
                x0 = uncond + cfg_scale * (cond - uncond)
                x = x + float(times[i + 1] - times[i]) * (x - x0) / float(times[i])
            hook.keep = True   # the finished chunk at t = 0: its k, v are the context now
            model(torch.cat([x, x]), torch.zeros(2 * b, dtype=x.dtype), y, ctx)
        if bytes_per_chunk is not None:
            bytes_per_chunk.append(sent.total)
        out.append(x)
    return out


def assemble(shards: list[list[torch.Tensor]], chunk: int, grid, channels: int,
             patch: int) -> torch.Tensor:
    """Every rank's chunk pieces (`shards[rank][chunk]`, `[B, 1, n_r, F]`) -> latents
    `[B, C, T, Hl, Wl]`: per chunk the pieces side by side in rank order, then chunk after chunk."""
    chunks = []
    for pieces in zip(*shards, strict=True):
        whole = torch.cat(pieces, dim=2)                                # [B, 1, c * S, F]
        chunks.append(whole.view(whole.shape[0], chunk, -1, whole.shape[-1]))
    return unpatchify(torch.cat(chunks, dim=1), channels, patch, grid)


def stream_latents(model: TinyVideoDiT, noise: torch.Tensor, label, chunk: int,
                   steps: int = SAMPLE_STEPS, cfg_scale: float = 4.0) -> torch.Tensor:
    """One process, one cache per layer: latents `[B, C, T, Hl, Wl]` (the CP runs' reference)."""
    cfg = model.cfg
    grid = (noise.shape[-2] // cfg.patch, noise.shape[-1] // cfg.patch)
    pieces = stream_sample(model, noise, label, chunk, LocalCache, steps, cfg_scale)
    return assemble([pieces], chunk, grid, cfg.in_channels, cfg.patch)


def causal_chunk(path: str) -> int:
    """The chunk (frames) the weights at `path` were trained with; not causal: an InputError."""
    from cpcourse.tinydit.model import require_kind

    return int(require_kind(path, load_weights(path)[1], causal=True)["chunk"])


def evaluate_causal(model: TinyVideoDiT, prompts=None, seeds=range(8), steps: int = SAMPLE_STEPS,
                    cfg_scale: float = 4.0, chunk: int | None = None, progress=None) -> dict:
    """`training.evaluate` with every clip streamed chunk by chunk (the seeds as one batch):
    per prompt "direction", "shape", "present", "clips"; "all"; "seconds_per_clip".
    `progress`: as `evaluate`'s."""
    from cpcourse.tinydit.causal import CHUNK
    from cpcourse.tinydit.training import evaluate

    def streamed(model, noise, label, steps, cfg_scale):
        return stream_latents(model, noise, label, chunk or CHUNK, steps, cfg_scale)

    return evaluate(model, prompts, seeds, steps, cfg_scale, sampler=streamed, progress=progress)
