"""Ulysses' transpose drawn: who holds which (head, token) before and after the all-to-all.

    python -m cpcourse.viz.ulysses artifacts     # writes the figure for 6 heads over 3 ranks

Before, rank r holds every head of its sequence shard (tokens split like tensor_split); after,
it holds every token of its head group (H/P neighbouring heads). A cell whose owner changes is
one that travels: each rank keeps only the cells of its own shard AND its own head group, the
1/P of its shard in its head group, and sends the other (P-1)/P away.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from cpcourse.support.errors import require
from cpcourse.support.shards import shard_offsets, shard_sizes

_RANKS = colormaps["tab10"]


def ownership(world: int, heads: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(before, after): `[heads, tokens]` arrays of the rank holding each (head, token) cell."""
    require(world >= 1 and heads % world == 0, f"Ulysses needs the world size to divide the "
            f"heads: {world} ranks, {heads} heads")
    require(tokens >= 1, "need at least one token")
    before = np.zeros((heads, tokens), dtype=int)
    for r, (start, n) in enumerate(zip(shard_offsets(shard_sizes(tokens, world)),
                                       shard_sizes(tokens, world), strict=True)):
        before[:, start:start + n] = r
    after = np.repeat(np.arange(heads) // (heads // world), tokens).reshape(heads, tokens)
    return before, after


def transpose_figure(world: int = 3, heads: int = 6, tokens: int = 8) -> Figure:
    """Two grids, heads down and tokens across, coloured by the rank holding each cell, before
    and after the sequence -> heads all-to-all; hatched cells are the ones that travel."""
    before, after = ownership(world, heads, tokens)
    moved = before != after
    fig = Figure(figsize=(10.5, 0.45 * heads + 1.6))
    axes = fig.subplots(1, 2)
    titles = ("before: rank r holds ALL heads of its tokens",
              "after: rank r holds ALL tokens of its heads")
    for ax, owner, title in zip(axes, (before, after), titles, strict=True):
        for h in range(heads):
            for t in range(tokens):
                ax.add_patch(Rectangle((t, h), 1, 1, facecolor=_RANKS(owner[h, t] % 10),
                                       edgecolor="white", hatch="//" if moved[h, t] else None,
                                       alpha=0.9))
        ax.set_xlim(0, tokens)
        ax.set_ylim(heads, 0)
        ax.set_xticks(np.arange(tokens) + 0.5, [str(t) for t in range(tokens)], fontsize=7)
        ax.set_yticks(np.arange(heads) + 0.5, [f"h{h}" for h in range(heads)], fontsize=7)
        ax.set_xlabel("token")
        ax.set_title(title, fontsize=9)
    for r in range(world):
        axes[1].add_patch(Rectangle((0, 0), 0, 0, facecolor=_RANKS(r % 10), label=f"rank {r}"))
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.suptitle(f"Ulysses, {heads} heads over {world} ranks, {tokens} tokens: hatched cells "
                 f"travel ({moved.mean():.0%} of all)", fontsize=10)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    transpose_figure().savefig(out / "ulysses_transpose.png", dpi=100)
    print(f"wrote {out / 'ulysses_transpose.png'}")
