"""First-block cache under CP: skip a step whose first block's output barely changed, on every
rank at once.

    cpcourse generate --prompt circle-right --nproc 2 --cache fbcache --cache-threshold 0.1 --json

Each step runs the first block, then measures how much a probe `[B, T_r, S, hidden]` changed:
the relative L1 change sum|p - p_ref| / sum|p_ref|. Below `threshold`, the other blocks are
skipped and the residual they added at the last step that ran them is added again. Two rules
for the probe and its reference (`rule`):

    "output"    the course's: the first block's OUTPUT, against the previous step's, even when
                that step was skipped (a run of skips compares neighbours, so drift that
                accumulates slowly over several skipped steps is never seen)
    "residual"  ParaAttention's first-block cache (`get_can_use_cache`, chengzeyi/ParaAttention
                src/para_attn/first_block_cache/utils.py): the first block's RESIDUAL (output
                - input), against the residual of the last step that ran the full model
                (stored only on the uncached path), so drift accumulates until the change
                crosses the threshold and the model runs again

Under CP each rank sees only its frames, so the two sums are all-reduced first (SUM, then
divided): a ratio of sums is the whole video's change exactly, which an average of the ranks'
own ratios is not when the ranks' shares differ (ParaAttention all-reduces two means with AVG
then divides, the same thing for equal shards; some gloo builds refuse ReduceOp.AVG). A
rank-local decision (`decide="local"`, the bug) lets one rank skip while another runs its blocks:
their collectives no longer pair up, and the run fails or hangs. `group` None: one process,
nothing to all-reduce. Threshold 0 never skips: the uncached clip exactly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.support.errors import finite_float, require

DECISIONS = ("global", "local")
RULES = ("output", "residual")


class FirstBlockCache(nn.Module):
    """Wraps a TinyVideoDiT; called like it on a rank's frames `[B, T_r, S, C*p*p]`.
    `changes`: the all-reduced relative change per step (None at step 0), `local_changes` this
    rank's own, `skipped` how many steps reused the residual."""

    def __init__(self, model, group, threshold: float, decide: str = "global",
                 rule: str = "output"):
        super().__init__()
        threshold = finite_float("threshold", threshold)
        require(threshold >= 0, f"threshold {threshold}: a relative change, at least 0")
        require(decide in DECISIONS, f"decide must be global or local, got {decide!r}")
        require(rule in RULES, f"rule must be output or residual, got {rule!r}")
        self.model, self.cfg, self.group = model, model.cfg, group
        self.threshold, self.decide, self.rule = threshold, decide, rule
        self.prev = self.residual = None
        self.changes, self.local_changes, self.skipped = [], [], 0

    def forward(self, tokens, t, y, ctx):
        x, c = self.model.embed_inputs(tokens, t, y, ctx)
        start = x.clone() if self.rule == "residual" else None  # blocks add to x in place
        first = self.model.blocks[0](x, c, ctx).clone()
        probe = first if start is None else first - start
        skip = self._similar(probe)
        if self.rule == "output" or not skip:  # residual: only a full step sets the reference
            self.prev = probe
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
        if self.decide == "global" and self.group is not None:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.group)
        change = float(sums[0] / sums[1])
        self.changes.append(change)
        return change < self.threshold


def sample_cached(model, noise: torch.Tensor, label, steps: int, cfg_scale: float,
                  threshold: float, rule: str = "output") -> tuple[torch.Tensor, FirstBlockCache]:
    """One process, the whole video: `noise` `[B, C, T, Hl, Wl]` sampled through a first-block
    cache with `rule` -> (the sampled latents, same shape; the cache, whose `skipped` and
    `changes` say what it did). Under CP the global decision is this one's, by design."""
    from cpcourse.tinydit.sampling import sample

    cache = FirstBlockCache(model, None, threshold, "global", rule)
    return sample(cache, noise, label, steps, cfg_scale), cache
