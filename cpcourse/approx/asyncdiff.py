"""AsyncDiff: the blocks split into P components, one per rank, each after the first running on
the previous component's output from the previous step.

    cpcourse generate --prompt circle-right --nproc 2 --approx asyncdiff --warmup 1 --compare

Every rank holds the whole latent and runs only its component (a contiguous run of blocks) on
hidden states `[B, T, S, hidden]`: rank 0 on this step's embedded tokens, rank r > 0 on what rank
r - 1 produced one step earlier. So all components run at once instead of one after another.
At the end of a step every rank broadcasts its component's output (czg1225/AsyncDiff's
`cache_sync`); the last one's output is the prediction every rank takes its Euler step with, the
others are the next step's inputs. The first `warmup` steps run the components in sequence
(exact). With warmup 0 there is no previous output at step 0: a later component starts from the
embedded tokens, as if the components before it were skipped.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.support.shards import shard_offsets, shard_sizes


class AsyncDiffDiT(nn.Module):
    """A TinyVideoDiT whose blocks are split over the ranks' components. Called like the model
    on the WHOLE video: tokens `[B, T, S, C*p*p]` -> prediction, same shape, on every rank."""

    def __init__(self, model, group, warmup: int):
        super().__init__()
        self.model, self.cfg, self.group, self.warmup = model, model.cfg, group, warmup
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        sizes = shard_sizes(len(model.blocks), self.world)
        starts = shard_offsets(sizes)
        self.components = [range(s, s + n) for s, n in zip(starts, sizes, strict=True)]
        self.inputs: list = [None] * self.world   # component r's input for the next step
        self.step, self.exposed = -1, 0.0

    def forward(self, tokens, t, y, ctx):
        self.step += 1
        x, c = self.model.embed_inputs(tokens, t, y, ctx)
        if self.step < self.warmup:
            h = x
            for r in range(self.world):  # in sequence: each component on this step's input
                h = self._run(r, h.clone(), c, ctx) if r == self.rank else torch.empty_like(x)
                self._timed(dist.broadcast, h, r)
                self.inputs[r] = h
        else:
            mine = x if self.rank == 0 else self.inputs[self.rank - 1]
            mine = self._run(self.rank, (x if mine is None else mine).clone(), c, ctx)
            outs = [mine if r == self.rank else torch.empty_like(x) for r in range(self.world)]
            works = [dist.broadcast(o, r, self.group, async_op=True) for r, o in enumerate(outs)]
            start = time.perf_counter()
            for w in works:
                w.wait()
            self.exposed += time.perf_counter() - start
            self.inputs = outs
        return self.model.final_layer(self.inputs[-1], c)

    def _run(self, r: int, h: torch.Tensor, c: torch.Tensor, ctx) -> torch.Tensor:
        """Component r's blocks on h `[B, T, S, hidden]` (updated in place: pass a copy)."""
        for i in self.components[r]:
            h = self.model.blocks[i](h, c, ctx)
        return h

    def close(self):
        """Nothing in flight: every broadcast is waited for within its step."""

    def _timed(self, op, tensor, src):
        start = time.perf_counter()
        op(tensor, src, self.group)
        self.exposed += time.perf_counter() - start
