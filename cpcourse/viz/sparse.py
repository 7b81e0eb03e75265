"""Figures of notebook 16: each rank's kept blocks under a sparse mask, and work per rank.

    python -c "from cpcourse.viz.sparse import *"   # used by notebooks/16_sparse_attention_and_fp8

`rank_blocks` draws, for each rank, the (query tile x key tile) blocks it computes, summed over
the heads it computes them for: Ulysses ranks hold whole heads, ring ranks hold query tiles.
`work_bars` compares the ranks' work under several deals.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from cpcourse.sparse import BlockMask, tile_of_token
from cpcourse.sparse.cp import imbalance, predicted_work


def rank_blocks(bm: BlockMask, method: str, assignment, title: str = "") -> Figure:
    """One panel per rank: kept blocks `[n query tiles, n key tiles]` it computes (count of
    heads), with its work (score entries) and the deal's imbalance in the titles."""
    world = len(assignment)
    work = predicted_work(bm, method, assignment)
    mask = bm.mask
    fig = Figure(figsize=(2.4 * world, 2.7))
    owner = tile_of_token(bm.grid, bm.tile)
    vmax = mask.shape[0]
    for r, part in enumerate(assignment):
        if method == "ulysses":
            img = mask[part].sum(0)
        else:
            rows = torch.zeros(mask.shape[1], dtype=torch.bool)
            rows[owner[part]] = True
            img = mask.sum(0) * rows[:, None]
        ax = fig.add_subplot(1, world, r + 1)
        ax.imshow(img.numpy(), cmap="Blues", vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"rank {r}: {work[r] / 1e3:.0f}k", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        if r == 0:
            ax.set_ylabel("query tile")
        ax.set_xlabel("key tile")
    fig.suptitle(f"{title} ({method}, imbalance {imbalance(work):.2f})", fontsize=10)
    fig.tight_layout()
    return fig


def work_bars(rows: dict[str, list[float]], title: str = "work per rank") -> Figure:
    """Grouped bars: for each label (a deal), each rank's work."""
    fig = Figure(figsize=(6.5, 2.6))
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(rows)
    for i, (label, work) in enumerate(rows.items()):
        xs = [r + i * width for r in range(len(work))]
        ax.bar(xs, [w / 1e3 for w in work], width=width,
               label=f"{label} (imbalance {imbalance(work):.2f})")
    ax.set_xticks([r + 0.4 - width / 2 for r in range(len(next(iter(rows.values()))))])
    ax.set_xticklabels([f"rank {r}" for r in range(len(next(iter(rows.values()))))])
    ax.set_ylabel("score entries (thousands)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
