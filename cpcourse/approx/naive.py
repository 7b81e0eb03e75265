"""Naive patches: after the warm-up a rank attends to its own frames only and sends nothing.

    cpcourse generate --prompt circle-right --nproc 2 --approx naive --warmup 0 --compare

The baseline DistriFusion's paper (arXiv 2402.19481) beats: patches that never see each other
lose fidelity where they meet. In a video the rank's frames never see the others' after the
warm-up, so motion that should continue across the shard boundary is free to break there.
Shapes `[B, H, T_r, S, D]`.
"""

from __future__ import annotations

from cpcourse.approx.patches import PatchAttention


class NaiveAttention(PatchAttention):
    """Warm-up steps exact (all-gather); then only this rank's own K/V."""

    def remote(self, layer, kv):
        return [kv if r == self.rank else None for r in range(self.world)]
