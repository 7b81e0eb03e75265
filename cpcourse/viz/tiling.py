"""Notebook 15's pictures: who scores which tile of the S x S score matrix, and bytes per rank.

    python -m cpcourse.viz.tiling artifacts      # writes both figures

`owners(method, world)` is a `[P, P]` array over (query shard, key shard) blocks: the rank that
scores each block (ring and all-gather K/V: the query's owner; all-gather Q: the key's owner;
Attention2D: the grid rank whose row holds the query shard and whose column holds the key
shard). Ulysses does not tile the matrix: every rank scores all of it for H / P heads.
`bytes_figure` plots `cpcourse.planner.costs.tiling_bytes_per_rank` against P.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.support.errors import require
from cpcourse.tiling import squarest_grid, tile

PANELS = (("ring (and all-gather K/V)", "ring", None), ("all-gather Q", "grid", (1, 4)),
          ("Attention2D 2x2", "grid", (2, 2)), ("Ulysses", "ulysses", None))


def owners(method: str, world: int, grid: tuple[int, int] | None = None,
           tiles: list | None = None) -> np.ndarray:
    """`[P, P]`: which rank scores block (query shard i, key shard j). method "ring" or "grid"
    (Attention2D on `grid`, or on `tiles`: (query shards, key shards) per rank)."""
    require(method in ("ring", "grid"), f"method must be ring or grid, got {method!r}")
    out = np.full((world, world), -1, dtype=int)
    if method == "ring":
        return np.repeat(np.arange(world), world).reshape(world, world)
    tiles = tiles or [tile(r, *grid) for r in range(world)]
    for r, (q_shards, kv_shards) in enumerate(tiles):
        for i in q_shards:
            out[i, kv_shards] = r
    return out


def tilings_figure(world: int = 4) -> Figure:
    """One panel per algorithm: the score matrix of `world` shards, each block coloured by the
    rank that scores it, labelled with that rank."""
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    cmap = colormaps["tab10"]
    for ax, (title, method, grid) in zip(axes, PANELS, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(world), [f"k{j}" for j in range(world)], fontsize=7)
        ax.set_yticks(range(world), [f"q{i}" for i in range(world)], fontsize=7)
        if method == "ulysses":
            ax.imshow(np.zeros((world, world)), cmap="Greys", vmin=0, vmax=4)
            ax.text((world - 1) / 2, (world - 1) / 2, f"rank r: every block,\nheads of group r\n"
                    f"(H/{world} each)", ha="center", va="center", fontsize=8)
            continue
        own = owners(method, world, grid or squarest_grid(world))
        ax.imshow(own, cmap=cmap, vmin=0, vmax=9)
        for i in range(world):
            for j in range(world):
                ax.text(j, i, str(own[i, j]), ha="center", va="center", fontsize=8, color="w")
    fig.suptitle(f"who scores which block of q k^T ({world} ranks; query shards down, key "
                 "shards across)", fontsize=10)
    return fig


def bytes_figure(tokens: int = 75_600, heads: int = 40, head_dim: int = 128,
                 worlds=(4, 8, 9, 16, 20, 36, 40, 64, 144)) -> Figure:
    """Bytes the busiest rank sends in one attention layer (bf16) against P: ring, all-gather,
    Ulysses (only where P divides the heads) and Attention2D on the squarest grid."""
    fig = Figure(figsize=(6.5, 3.6), layout="constrained")
    ax = fig.subplots()
    for method in ("ring", "allgather", "ulysses", "attn2d"):
        xs = [p for p in worlds if method != "ulysses" or heads % p == 0]
        ys = [tiling_bytes_per_rank(method, tokens, heads, head_dim, p,
                                    squarest_grid(p) if method == "attn2d" else None) / 1e9
              for p in xs]
        ax.plot(xs, ys, marker="o", ls="--" if method == "allgather" else "-",
                label={"attn2d": "Attention2D (squarest grid)",
                       "ulysses": f"Ulysses (P divides {heads} heads)"}.get(method, method))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ranks P")
    ax.set_ylabel("GB sent per rank per layer")
    ax.set_title(f"{tokens:,} tokens, {heads} heads of {head_dim}, bf16", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    tilings_figure().savefig(out / "tilings.png", dpi=100)
    bytes_figure().savefig(out / "tiling_bytes.png", dpi=100)
    print(out / "tilings.png", out / "tiling_bytes.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
