"""Notebook 09's mesh figure: every rank a box labelled with its mesh coordinates, grouped by node,
and a line for every pair of ranks that talk over each mesh dim, drawn by the link it rides.

    python -m cpcourse.viz.mesh artifacts   # mesh.png: ring2 x ulysses4, cfg2 x ring2 x ulysses2

Everything drawn is computed from `cpcourse.support.layout.Layout.coords` (ranks laid out cfg, ring,
ulysses, tp from outer to inner, the order `make_mesh` uses) and `gpus_per_node`: ranks
0 .. gpus_per_node - 1 are node 0, and so on, so two ranks share NVLink when they share a node
and talk over InfiniBand otherwise. `order` lays the same degrees out in another nesting (the
first name outermost), to draw what a different choice would put on the slow link.

Who talks to whom over a dim: in a ring group each rank sends to the next ring rank (a cycle);
in a Ulysses, TP or CFG group every member exchanges with every other (all-to-all, all-reduce,
all-gather), so every pair is drawn.
"""

from __future__ import annotations

import sys
from itertools import combinations
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyBboxPatch, Rectangle

from cpcourse.support.errors import positive_int, require
from cpcourse.support.layout import DIMS, Layout

COLOURS = {"cfg": "#8172b3", "ring": "#dd8452", "ulysses": "#4c72b0", "tp": "#55a868"}
LINK_STYLE = {"nvlink": "-", "ib": "--"}
LINK_NAME = {"nvlink": "NVLink (inside a node)", "ib": "InfiniBand (across nodes)"}
SHORT = {"cfg": "c", "ring": "r", "ulysses": "u", "tp": "t"}
# Arcs above the row of ranks for the inner dims, below for the outer ones; a base height each
# so arcs of different dims between the same two ranks do not lie on one another.
_SIDE = {"tp": (1, 0.55), "ulysses": (1, 0.85), "ring": (-1, 0.55), "cfg": (-1, 0.85)}
_NODE_GAP = 0.7


def _order(order) -> tuple[str, ...]:
    order = DIMS if order is None else tuple(order)
    require(sorted(order) == sorted(DIMS), f"order must name each of {', '.join(DIMS)} once, "
            f"outermost first, got {order}")
    return order


def coords(layout: Layout, rank: int, order=None) -> dict[str, int]:
    """Mesh coordinates of `rank`: `layout.coords(rank)` in the mesh's own order, else read from
    the rank as a mixed-radix number whose digits are `order` (outermost first)."""
    order = _order(order)
    if order == DIMS:
        return layout.coords(rank)
    require(0 <= rank < layout.world, f"rank {rank} is not in a layout of {layout.world} ranks")
    out, rest = {}, rank
    for name in reversed(order):
        size = getattr(layout, name)
        out[name], rest = rest % size, rest // size
    return {name: out[name] for name in DIMS}


def groups(layout: Layout, dim: str, order=None) -> list[list[int]]:
    """The groups of `dim`: ranks whose other coordinates agree, each in `dim`'s order."""
    require(dim in DIMS, f"dim must be one of {', '.join(DIMS)}, got {dim!r}")
    found: dict[tuple, list[tuple[int, int]]] = {}
    for rank in range(layout.world):
        co = coords(layout, rank, order)
        key = tuple(co[d] for d in DIMS if d != dim)
        found.setdefault(key, []).append((co[dim], rank))
    return [[rank for _, rank in sorted(members)] for members in found.values()]


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def links(layout: Layout, gpus_per_node: int, order=None) -> list[dict]:
    """One row per pair of ranks that talk over a dim: {"dim", "a", "b", "link"}, with `link`
    "nvlink" when both are in one node, else "ib". Ring groups give the cycle r -> r + 1 (one
    pair when R = 2); the other dims give every pair of each group. Dims of degree 1 give none."""
    gpus_per_node = positive_int("gpus_per_node", gpus_per_node)
    rows = []
    for dim in DIMS:
        if getattr(layout, dim) == 1:
            continue
        for group in groups(layout, dim, order):
            if dim == "ring":
                pairs = {tuple(sorted((group[i], group[(i + 1) % len(group)])))
                         for i in range(len(group))}
            else:
                pairs = set(combinations(group, 2))
            for a, b in sorted(pairs):
                same = node_of(a, gpus_per_node) == node_of(b, gpus_per_node)
                rows.append({"dim": dim, "a": a, "b": b, "link": "nvlink" if same else "ib"})
    return rows


def link_summary(layout: Layout, gpus_per_node: int, order=None) -> list[dict]:
    """Per active dim: its degree, how many pairs talk over it, how many of them cross nodes."""
    rows = links(layout, gpus_per_node, order)
    out = []
    for dim in DIMS:
        mine = [r for r in rows if r["dim"] == dim]
        if mine:
            out.append({"dim": dim, "degree": getattr(layout, dim), "pairs": len(mine),
                        "nvlink": sum(r["link"] == "nvlink" for r in mine),
                        "ib": sum(r["link"] == "ib" for r in mine)})
    return out


def traffic_by_link(layout: Layout, bytes_by_rank: list[dict], gpus_per_node: int,
                    order=None) -> dict[str, dict[str, float]]:
    """Bytes per step on each link, per dim, summed over ranks: {dim: {"nvlink": B, "ib": B}}.

    bytes_by_rank[rank]: what rank `rank` of the mesh's own layout sends per dim per step
    (`predicted_bytes_per_step`, or a run's `bytes_per_step_by_dim`); under another `order` the
    rank with the same coordinates sends the same. Where it goes: a ring rank sends to the next
    ring rank; in the other dims a rank's bytes are split evenly over its group's other members
    (an all-to-all of equal shards, an all-gather; for a ring all-reduce, an approximation).
    """
    require(len(bytes_by_rank) == layout.world,
            f"need one row of bytes per rank, got {len(bytes_by_rank)} for {layout.world} ranks")
    out = {dim: {"nvlink": 0.0, "ib": 0.0} for dim in DIMS}
    for dim in DIMS:
        size = getattr(layout, dim)
        if size == 1:
            continue
        for group in groups(layout, dim, order):
            for i, rank in enumerate(group):
                co = coords(layout, rank, order)
                sent = bytes_by_rank[_mesh_rank(layout, co)].get(dim, 0)
                peers = [group[(i + 1) % size]] if dim == "ring" else \
                    [p for p in group if p != rank]
                for p in peers:
                    same = node_of(p, gpus_per_node) == node_of(rank, gpus_per_node)
                    out[dim]["nvlink" if same else "ib"] += sent / len(peers)
    return {dim: v for dim, v in out.items() if getattr(layout, dim) > 1}


def _mesh_rank(layout: Layout, co: dict) -> int:
    """The rank with coordinates `co` in the mesh's own order."""
    return ((co["cfg"] * layout.ring + co["ring"]) * layout.ulysses + co["ulysses"]) \
        * layout.tp + co["tp"]


def _x(rank: int, gpus_per_node: int) -> float:
    return rank + _NODE_GAP * node_of(rank, gpus_per_node)


def _arc(x0: float, x1: float, y: float, side: int, base: float, n: int = 40):
    """Points of a parabola from (x0, y) to (x1, y), bulging `side`ways (+1 up, -1 down)."""
    span = abs(x1 - x0)
    height = side * (base + 0.16 * span)
    xs, ys = [], []
    for i in range(n + 1):
        s = i / n
        xs.append(x0 + (x1 - x0) * s)
        ys.append(y + height * 4 * s * (1 - s))
    return xs, ys


def coords_label(co: dict, layout: Layout) -> str:
    """"c1 r0 u1": the coordinates of the dims of degree > 1, as the boxes show them."""
    active = [d for d in DIMS if getattr(layout, d) > 1]
    return " ".join(f"{SHORT[d]}{co[d]}" for d in active) or "-"


def _panel(ax, layout: Layout, gpus_per_node: int, order, title: str | None) -> None:
    world = layout.world
    nodes = -(-world // gpus_per_node)
    for n in range(nodes):
        first, last = n * gpus_per_node, min(world, (n + 1) * gpus_per_node) - 1
        x0, x1 = _x(first, gpus_per_node) - 0.5, _x(last, gpus_per_node) + 0.5
        ax.add_patch(FancyBboxPatch((x0, -0.55), x1 - x0, 1.1, boxstyle="round,pad=0.04",
                                    facecolor="#f2f2f2", edgecolor="#999999", zorder=0,
                                    gid=f"node:{n}"))
        ax.text(x0 + 0.06, -0.47, f"node {n}", ha="left", va="center", fontsize=6.5,
                color="#555555", zorder=3, gid=f"node-label:{n}")
    for rank in range(world):
        x = _x(rank, gpus_per_node)
        ax.add_patch(Rectangle((x - 0.38, -0.38), 0.76, 0.76, facecolor="white",
                               edgecolor="#333333", zorder=2, gid=f"rank:{rank}"))
        ax.text(x, 0.1, str(rank), ha="center", va="center", fontsize=9, weight="bold", zorder=3,
                gid=f"rank-label:{rank}")
        ax.text(x, -0.18, coords_label(coords(layout, rank, order), layout), ha="center",
                va="center", fontsize=6.5, zorder=3, gid=f"coords:{rank}")
    for row in links(layout, gpus_per_node, order):
        side, base = _SIDE[row["dim"]]
        xa, xb = _x(row["a"], gpus_per_node), _x(row["b"], gpus_per_node)
        xs, ys = _arc(xa, xb, 0.38 * side, side, base)
        ax.add_line(Line2D(xs, ys, color=COLOURS[row["dim"]], linestyle=LINK_STYLE[row["link"]],
                           linewidth=1.6 if row["link"] == "nvlink" else 1.3, zorder=1,
                           gid=f"link:{row['dim']}:{row['a']}-{row['b']}:{row['link']}"))
    right = _x(world - 1, gpus_per_node) + 0.6
    ax.set_xlim(-0.6, right)
    ax.set_ylim(-0.95 - 0.16 * right - 0.9, 0.95 + 0.16 * right + 0.9)
    ax.set_aspect("auto")
    ax.axis("off")
    nest = " > ".join(_order(order))
    ax.set_title(title or f"{layout} on {world} GPUs, {gpus_per_node} per node "
                 f"(outer > inner: {nest})", fontsize=9)


def mesh_figure(layouts, gpus_per_node: int = 4, order=None, titles=None) -> Figure:
    """One panel per layout (a Layout or its text, "ring=2,ulysses=4"): ranks as boxes labelled
    with their coordinates (c, r, u, t = cfg, ring, ulysses, tp) in node frames, and an arc per
    pair of ranks that talk: colour = the dim, solid = NVLink, dashed = InfiniBand. Arcs of
    tp and ulysses go above the row, ring and cfg below. `order` applies to every panel."""
    gpus_per_node = positive_int("gpus_per_node", gpus_per_node)
    layouts = [Layout.parse(x) if isinstance(x, str) else x for x in
               (layouts if isinstance(layouts, (list, tuple)) else [layouts])]
    require(layouts, "give at least one layout")
    widest = max(_x(lay.world - 1, gpus_per_node) for lay in layouts)
    fig = Figure(figsize=(max(6.0, 1.0 + 0.72 * widest), 2.6 * len(layouts) + 0.5))
    axes = fig.subplots(len(layouts), 1, squeeze=False)[:, 0]
    for i, (ax, lay) in enumerate(zip(axes, layouts, strict=True)):
        _panel(ax, lay, gpus_per_node, order, titles[i] if titles else None)
    used = {d for lay in layouts for d in DIMS if getattr(lay, d) > 1}
    handles = [Line2D([], [], color=COLOURS[d], linewidth=2, label=f"{d} ({SHORT[d]})")
               for d in DIMS if d in used]
    handles += [Line2D([], [], color="#555555", linestyle=LINK_STYLE[k], label=LINK_NAME[k])
                for k in ("nvlink", "ib")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    fig = mesh_figure(["ring=2,ulysses=4", "cfg=2,ring=2,ulysses=2"], gpus_per_node=4)
    fig.savefig(out / "mesh.png", dpi=100)
    print(out / "mesh.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
