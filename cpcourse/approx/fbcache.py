"""First-block cache under CP: skip a step whose first block's output barely changed, on every
rank at once.

    cpcourse generate --prompt circle-right --nproc 2 --cache fbcache --cache-threshold 0.1 --json

Each step runs the first block, then compares its output `[B, T_r, S, hidden]` with last step's:
the relative L1 change sum|h - h_prev| / sum|h_prev|. Below `threshold`, the other blocks are
skipped and the residual they added at the last step that ran them is added again (ParaAttention's
first-block cache). Under CP each rank sees only its frames, so the two sums are all-reduced
first (SUM, then divided): a ratio of sums is the whole video's change exactly, which an
average of the ranks' own ratios is not (and some gloo builds refuse ReduceOp.AVG; torch 2.13's
averages). A rank-local decision (`decide="local"`, the bug) lets one rank skip while
another runs its blocks: their collectives no longer pair up, and the run fails or hangs.
Threshold 0 never skips: the uncached clip exactly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.support.errors import finite_float, require

DECISIONS = ("global", "local")


class FirstBlockCache(nn.Module):
    """Wraps a TinyVideoDiT; called like it on a rank's frames `[B, T_r, S, C*p*p]`.
    `changes`: the all-reduced relative change per step (None at step 0), `local_changes` this
    rank's own, `skipped` how many steps reused the residual."""

    def __init__(self, model, group, threshold: float, decide: str = "global"):
        super().__init__()
        threshold = finite_float("threshold", threshold)
        require(threshold >= 0, f"threshold {threshold}: a relative change, at least 0")
        require(decide in DECISIONS, f"decide must be global or local, got {decide!r}")
        self.model, self.cfg, self.group = model, model.cfg, group
        self.threshold, self.decide = threshold, decide
        self.prev = self.residual = None
        self.changes, self.local_changes, self.skipped = [], [], 0

    def forward(self, tokens, t, y, ctx):
        x, c = self.model.embed_inputs(tokens, t, y, ctx)
        first = self.model.blocks[0](x, c, ctx).clone()  # later blocks add to x in place
        skip = self._similar(first)
        self.prev = first
        if skip:
            self.skipped += 1
            x = first + self.residual
        else:
            x = first.clone()
            for block in self.model.blocks[1:]:
                x = block(x, c, ctx)
            self.residual = x - first
        return self.model.final_layer(x, c)

    def _similar(self, first: torch.Tensor) -> bool:
        """Whether this step may reuse the residual: the same answer on every rank, unless
        `decide` is "local"."""
        if self.prev is None:
            self.changes.append(None)
            self.local_changes.append(None)
            return False
        sums = torch.stack([(first - self.prev).abs().sum(), self.prev.abs().sum()]).double()
        self.local_changes.append(float(sums[0] / sums[1]))
        if self.decide == "global":
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)
        change = float(sums[0] / sums[1])
        self.changes.append(change)
        return change < self.threshold
