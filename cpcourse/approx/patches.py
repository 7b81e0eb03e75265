"""Patch parallelism: each rank denoises its frames; how other ranks' K/V reach it is the method.

    cpcourse generate --prompt circle-right --nproc 2 --approx naive --compare --json

A rank holds frames [t0, t0 + T_r) of the latent (a temporal split, as exact CP), or with
`split="space"` the token rows [y0, y0 + h_r) of every frame (DistriFusion's row split). Under
full 3D attention its queries `[B, H, T_r, S, D]` need every rank's keys and values.
`PatchAttention` is the `CPContext.attend` hook the model calls in each attention layer: during
the warm-up it all-gathers the fresh K/V (exact: the all-gather form of CP), afterwards it asks
the method for the other ranks' K/V (`remote`), which may be stale or missing. `ExactAttention`
never stops gathering: the exact reference the cache and the benchmark run on. `exposed` counts
the seconds a rank waited on communication.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cpcourse.attention import attention_with_lse
from cpcourse.video import flatten_video


class PatchAttention:
    """`CPContext.attend` for a rank's frames. `model`: the TinyVideoDiT (to number its attention
    layers), `warmup`: synchronous steps. A step starts when layer 0 is called."""

    def __init__(self, model, group, warmup: int, split: str = "time"):
        self.dim = 2 if split == "time" else 3  # frames, or rows of tokens (S is row-major)
        self.layer_of = {id(a): i for i, a in enumerate(
            a for b in model.blocks for a in b.attns if a.kind != "spatial")}
        self.group, self.warmup = group, warmup
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.step, self.exposed = -1, 0.0

    def __call__(self, module, q, k, v) -> torch.Tensor:
        """q, k, v `[B, H, T_r, S, D]` (this rank's frames) -> out `[B, H, T_r, S, D]`."""
        layer = self.layer_of[id(module)]
        if layer == 0:
            self.step += 1
        kv = torch.cat([k, v], dim=-1)  # one message per layer: [B, H, T_r, S, 2D]
        parts = self.gather(kv) if self.step < self.warmup else self.remote(layer, kv)
        self.after(layer, kv, parts)
        # Shards in rank order: a missing rank (None) is left out, the rest keep their places.
        # [B, H, T, S, 2D] when every rank's K/V is here (fewer frames or rows when some are not)
        keys = torch.cat([kv if r == self.rank else p for r, p in enumerate(parts)
                          if p is not None], dim=self.dim)
        k_all, v_all = keys.split(k.shape[-1], dim=-1)  # [B, H, T, S, D] each
        # flattened: this rank's queries [B, H, L_r, D] over keys [B, H, L, D]; back to q's shape
        out, _ = attention_with_lse(flatten_video(q), flatten_video(k_all), flatten_video(v_all))
        return out.reshape(q.shape)

    def gather(self, kv: torch.Tensor) -> list:
        """Every rank's fresh K/V `[B, H, T_r, S, 2D]`, waited for (on the critical path)."""
        parts = [torch.empty_like(kv) for _ in range(self.world)]
        start = time.perf_counter()
        dist.all_gather(parts, kv, group=self.group)
        self.exposed += time.perf_counter() - start
        return parts

    def remote(self, layer: int, kv: torch.Tensor) -> list:
        """After the warm-up: one entry per rank, None where that rank's K/V are not here."""
        raise NotImplementedError

    def after(self, layer: int, kv: torch.Tensor, parts: list) -> None:
        """What the method does once the layer has its K/V (displaced: send them on)."""

    def close(self) -> None:
        """Wait for anything still in flight (called once the clip is done)."""


class ExactAttention(PatchAttention):
    """All-gather CP at every step: the exact clip, for the cache and as the benchmark's row
    (`warmup` is ignored: every step is synchronous)."""

    def __init__(self, model, group, warmup: int = 0, split: str = "time"):
        super().__init__(model, group, float("inf"), split)
