"""Displaced patches (DistriFusion): other ranks' K/V from the previous step, sent asynchronously.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --compare

After each attention layer a rank starts an all-gather of its fresh K/V `[B, H, T_r, S, 2D]`
(`async_op=True`) and waits on it at the same layer one step later: by then the transfer has had
a whole step of compute to hide behind. So a rank's own frames are fresh and every other rank's
are one step old (distrifuser's `DistriSelfAttentionPP`). The first `warmup` steps gather
synchronously, which also fills the buffers. With warmup 0, step 0 has no previous step: it
attends to its own frames only (distrifuser always runs at least one step synchronously).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cpcourse.approx.patches import PatchAttention


class DisplacedAttention(PatchAttention):
    """`stale[layer]`: every rank's K/V of that layer from the step before (once received)."""

    def __init__(self, model, group, warmup: int, split: str = "time"):
        super().__init__(model, group, warmup, split)
        self.stale: dict[int, list] = {}
        self.pending: dict[int, tuple] = {}   # layer -> (work, buffers) of the gather in flight

    def remote(self, layer, kv):
        if layer in self.pending:
            work, parts = self.pending.pop(layer)
            start = time.perf_counter()
            work.wait()  # exposed only if the transfer took longer than a step of compute
            self.exposed += time.perf_counter() - start
            self.stale[layer] = parts
        return self.stale.get(layer, [kv if r == self.rank else None for r in range(self.world)])

    def after(self, layer, kv, parts):
        if self.step < self.warmup:  # the synchronous gather is next step's stale K/V
            self.stale[layer] = parts
            return
        bufs = [torch.empty_like(kv) for _ in range(self.world)]
        self.pending[layer] = (dist.all_gather(bufs, kv, group=self.group, async_op=True), bufs)

    def close(self):
        for work, _ in self.pending.values():
            work.wait()
        self.pending.clear()
