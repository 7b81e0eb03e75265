"""PipeFusion: the blocks split into stages over the ranks, the frames into M patches that flow
through them, each layer attending to a full-sequence K/V buffer overwritten patch by patch.

    cpcourse generate --prompt circle-right --nproc 2 --approx pipefusion --patches 4 --compare

Rank r holds stage r (a contiguous run of blocks). Patch m (frames [f0, f1)) enters rank 0,
runs its stage, and its hidden states `[B, f1 - f0, S, hidden]` go to rank r + 1 while rank r
starts patch m + 1: the stages work on different patches at once. In each layer the patch writes
its fresh K/V `[B, H, f1 - f0, S, 2D]` into the layer's buffer `[B, H, T, S, 2D]` and attends to
the whole buffer, in which patches < m are fresh this step and patches > m are one step old
(xDiT's `_naive_cache_update`: "stale-"). Only patch activations cross the stage boundaries, not
K/V in every layer. The last stage broadcasts the prediction so every rank takes the Euler step
(xDiT keeps the pipeline full across steps instead; the staleness is the same). The first
`warmup` steps run the whole sequence as one patch: exact, and they fill the buffers. With warmup
0, step 0's patch m sees only patches 0..m (the rest of the buffer is still empty).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.attention import attention_with_lse
from cpcourse.support.shards import shard_offsets, shard_sizes
from cpcourse.tinydit.model import CPContext
from cpcourse.video import flatten_video


class PipeFusionDiT(nn.Module):
    """A TinyVideoDiT run as a pipeline of `world` stages over `patches` frame patches. Called
    like the model on the WHOLE video: tokens `[B, T, S, C*p*p]` -> prediction, same shape, on
    every rank."""

    def __init__(self, model, group, warmup: int, patches: int):
        super().__init__()
        self.model, self.cfg, self.group = model, model.cfg, group
        self.warmup, self.patches = warmup, patches
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        sizes = shard_sizes(len(model.blocks), self.world)
        first = shard_offsets(sizes)[self.rank]
        self.stage = list(range(first, first + sizes[self.rank]))
        self.layer_of = {id(model.blocks[i].attns[0]): i for i in self.stage}
        self.kv: dict[int, torch.Tensor] = {}   # layer -> [B, H, T, S, 2D]
        self.filled: dict[int, int] = {}        # layer -> frames [0, n) written at least once
        self.step, self.exposed, self.sends = -1, 0.0, []

    def forward(self, tokens, t, y, ctx: CPContext):
        self.step += 1
        frames = self.frames_total = tokens.shape[1]
        m = 1 if self.step < self.warmup else self.patches
        bounds = shard_offsets(shard_sizes(frames, m)) + [frames]
        outs = []
        for f0, f1 in zip(bounds[:-1], bounds[1:], strict=True):
            pctx = CPContext(frame_offset=f0, grid=ctx.grid,
                             attend=lambda mod, q, k, v, f0=f0: self.attend(mod, q, k, v, f0))
            # the patch's tokens [B, Tp, S, C*p*p] -> x [B, Tp, S, hidden], c [B, hidden]
            x, c = self.model.embed_inputs(tokens[:, f0:f1], t, y, pctx)
            if self.rank > 0:  # this patch's hidden states come from the previous stage
                x = self._wait(dist.recv, x, self.rank - 1)
            for i in self.stage:
                x = self.model.blocks[i](x, c, pctx)
            if self.rank < self.world - 1:
                x = x.contiguous()  # kept alive in `sends` until the send completes
                self.sends += [(w, x) for w in dist.batch_isend_irecv(
                    [dist.P2POp(dist.isend, x, self.rank + 1, self.group)])]
            else:
                outs.append(self.model.final_layer(x, c))
        # [B, T, S, C*p*p]: the last stage's patches joined; the others' buffer for the broadcast
        out = torch.cat(outs, dim=1) if outs else torch.empty(
            tokens.shape[:3] + (self.model.out.out_features,), dtype=tokens.dtype)
        self._wait(dist.broadcast, out, self.world - 1)
        self.close()
        return out

    def attend(self, module, q, k, v, f0: int) -> torch.Tensor:
        """q, k, v `[B, H, Tp, S, D]` of the patch starting at frame f0 -> out, same shape."""
        layer = self.layer_of[id(module)]
        kv = torch.cat([k, v], dim=-1)  # [B, H, Tp, S, 2D]
        if layer not in self.kv:  # the buffer spans the whole video: [B, H, T, S, 2D]
            b, h, _, s, d2 = kv.shape
            self.kv[layer] = kv.new_zeros(b, h, self.frames_total, s, d2)
        f1 = f0 + kv.shape[2]
        self.kv[layer][:, :, f0:f1] = kv
        self.filled[layer] = max(self.filled.get(layer, 0), f1)
        keys = self.kv[layer][:, :, :self.filled[layer]]  # [B, H, filled, S, 2D]
        k_all, v_all = keys.split(k.shape[-1], dim=-1)  # [B, H, filled, S, D] each
        out, _ = attention_with_lse(flatten_video(q), flatten_video(k_all), flatten_video(v_all))
        return out.reshape(q.shape)

    def _wait(self, op, tensor, peer):
        """A blocking receive (`dist.recv`) or broadcast from `peer` into `tensor`, timed."""
        start = time.perf_counter()
        op(tensor, peer, self.group)
        self.exposed += time.perf_counter() - start
        return tensor

    def close(self):
        for work, _ in self.sends:
            work.wait()
        self.sends = []
