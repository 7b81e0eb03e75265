"""Notebook 08's pictures: where CP cuts a Wan model, and where joined text sits in a ring.

    python -m cpcourse.viz.models artifacts     # writes both figures

`split_points_figure()` draws Wan's forward as a column of stages (patch embedding, the rotary
table, the blocks with their self- and cross-attention, proj_out) with the five hooks of
`cpcourse.models.parallelize` marked where they act. `text_ring_figure(world)` draws, for each
ring step and rank, whose video block the rank holds (`cpcourse.sim.ring_schedule`) and where
the text keys enter a softmax under the course's placement and xDiT's `joint_strategy="rear"`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

from cpcourse.sim import ring_schedule
from cpcourse.support.errors import require

_RANKS = colormaps["tab10"]
# (stage, what it holds on a rank, hook number that acts there or None)
WAN_STAGES = (
    ("latents [B, C, T, H, W]", "whole, on every rank", 1),
    ("patch embedding, time + text embeddings", "whole: cheap, left untouched", None),
    ("rope: rotary table", "this rank's rows, global frame numbers", 2),
    ("blocks[0] input [B, L, C]", "cut to this rank's L_r tokens", 3),
    ("block: norm, modulation", "token by token: runs on the shard", None),
    ("attn1: self-attention softmax", "over every rank's keys (ring / Ulysses)", 4),
    ("attn2: cross-attention to text", "whole text on every rank: local", None),
    ("MLP, norms (x num_layers blocks)", "token by token: runs on the shard", None),
    ("proj_out [B, L_r, C']", "all-gathered back to [B, L, C']", 5),
    ("unpatchify -> output", "whole, on every rank", None),
)


def split_points_figure() -> Figure:
    """Wan's forward, top to bottom; the stages where a hook splits, rewires or gathers the
    sequence carry its number (1-5) and a coloured border; the shaded band is what runs on a
    shard of L_r = L / P tokens."""
    fig = Figure(figsize=(8.5, 0.55 * len(WAN_STAGES) + 0.6))
    ax = fig.subplots()
    n = len(WAN_STAGES)
    first, last = (next(i for i, s in enumerate(WAN_STAGES) if s[2] == k) for k in (3, 5))
    ax.add_patch(Rectangle((-0.05, first - 0.45), 1.1, last - first + 0.9, facecolor="#eef4fb",
                           edgecolor="none"))
    ax.text(1.07, (first + last) / 2, "on the shard\n(L_r tokens)", rotation=90, va="center",
            fontsize=8, color="#3b6ea5")
    for i, (stage, holds, hook) in enumerate(WAN_STAGES):
        colour = "#d9480f" if hook else "#868e96"
        ax.add_patch(FancyBboxPatch((0.02, i - 0.32), 0.5, 0.64, boxstyle="round,pad=0.01",
                                    facecolor="white", edgecolor=colour,
                                    linewidth=2.2 if hook else 0.8))
        ax.text(0.04, i, stage, va="center", fontsize=8)
        ax.text(0.56, i, holds, va="center", fontsize=8, color="#333333")
        if hook:
            ax.text(-0.03, i, str(hook), va="center", ha="center", fontsize=9, color="white",
                    bbox={"boxstyle": "circle", "facecolor": colour, "edgecolor": "none"})
        if i < n - 1:
            ax.annotate("", (0.27, i + 0.68), (0.27, i + 0.32),
                        arrowprops={"arrowstyle": "->", "color": "#868e96"})
    ax.set_xlim(-0.08, 1.12)
    ax.set_ylim(n - 0.4, -0.6)
    ax.axis("off")
    ax.set_title("Wan under CP: the five hooks of parallelize (numbered)", fontsize=10)
    return fig


def text_cells(world: int, strategy: str) -> list[list[tuple[int, bool, bool]]]:
    """cells[step][rank] = (whose video block the rank holds, whether its queries meet the text
    keys at that step, whether the text arrived in the held block rather than from the rank's
    own copy)."""
    require(strategy in ("course", "rear"), f"strategy must be course or rear, got {strategy!r}")
    cells = []
    for step, row in enumerate(ring_schedule(world)):
        if strategy == "course":  # the last rank's block carries the text around
            cells.append([(b, b == world - 1, b == world - 1 and step > 0) for b in row])
        else:  # every rank's own copy, appended at the last step; nothing travels
            cells.append([(b, step == world - 1, False) for b in row])
    return cells


def text_ring_figure(world: int = 3) -> Figure:
    """Two grids, ring steps down and ranks across: each cell is coloured by the rank whose
    video block is held there, and marked "+T" where the text keys join that softmax, hatched
    where they arrived over a link."""
    fig = Figure(figsize=(10, 0.55 * world + 1.5))
    titles = {"course": "course: the last rank's block carries the text",
              "rear": "xDiT joint_strategy='rear': own copy, last step"}
    for ax, strategy in zip(fig.subplots(1, 2), titles, strict=True):
        for step, row in enumerate(text_cells(world, strategy)):
            for rank, (block, text, travelled) in enumerate(row):
                ax.add_patch(Rectangle((rank, step), 1, 1, facecolor=_RANKS(block % 10),
                                       alpha=0.75, edgecolor="white",
                                       hatch="//" if travelled else None))
                ax.text(rank + 0.5, step + 0.5, f"v{block}" + (" +T" if text else ""),
                        ha="center", va="center", fontsize=9,
                        fontweight="bold" if text else "normal")
        ax.set_xlim(0, world)
        ax.set_ylim(world, 0)
        ax.set_xticks([r + 0.5 for r in range(world)], [f"rank {r}" for r in range(world)])
        ax.set_yticks([s + 0.5 for s in range(world)], [f"step {s}" for s in range(world)])
        ax.set_title(titles[strategy], fontsize=9)
    fig.suptitle("v j: rank j's video K/V block; +T: the text keys join this softmax; hatched: "
                 "they came over a link", fontsize=9)
    fig.subplots_adjust(top=0.8)
    return fig


def _main(out: str) -> None:
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    split_points_figure().savefig(path / "wan_split_points.png", dpi=110)
    text_ring_figure(3).savefig(path / "text_ring.png", dpi=110)
    print(f"wrote {path / 'wan_split_points.png'} and {path / 'text_ring.png'}")


if __name__ == "__main__":
    _main(sys.argv[1] if len(sys.argv) > 1 else "artifacts")
