"""Notebook 09's mesh figure draws what the mesh does: boxes labelled with each rank's
coordinates, grouped by node, and one line per pair of ranks that talk over a dim, solid inside a
node and dashed across nodes.

    python -m pytest tests/unit/test_viz_mesh.py -q
"""

from __future__ import annotations

from itertools import combinations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from cpcourse.support.errors import InputError  # noqa: E402
from cpcourse.support.layout import DIMS, Layout, layouts  # noqa: E402
from cpcourse.viz import mesh as vm  # noqa: E402

ARTICLE = ("tp", "cfg", "ring", "ulysses")  # CP inside a node, TP across nodes (the seed article)


def _mesh_groups(layout: Layout, dim: str) -> list[list[int]]:
    """Groups as DeviceMesh makes them from arange(world).view(cfg, ring, ulysses, tp)."""
    d = DIMS.index(dim)
    grid = torch.arange(layout.world).view(layout.shape)
    return grid.movedim(d, -1).reshape(-1, layout.shape[d]).tolist()


def _expected_pairs(layout: Layout, gpus_per_node: int, groups_of) -> set[tuple]:
    want = set()
    for dim in DIMS:
        size = getattr(layout, dim)
        if size == 1:
            continue
        for g in groups_of(layout, dim):
            pairs = ({tuple(sorted((g[i], g[(i + 1) % size]))) for i in range(size)}
                     if dim == "ring" else set(combinations(g, 2)))
            for a, b in pairs:
                link = "nvlink" if a // gpus_per_node == b // gpus_per_node else "ib"
                want.add((dim, a, b, link))
    return want


def _drawn(fig) -> tuple[set, dict, dict]:
    """(links, rank box coordinate labels, styles) as drawn, read back from the artists' gids."""
    links, labels, styles = set(), {}, {}
    for ax in fig.axes[:1]:
        for line in ax.get_lines():
            gid = line.get_gid() or ""
            if gid.startswith("link:"):
                _, dim, pair, link = gid.split(":")
                a, b = map(int, pair.split("-"))
                links.add((dim, a, b, link))
                styles[(dim, a, b)] = (line.get_color(), line.get_linestyle())
        for text in ax.texts:
            gid = text.get_gid() or ""
            if gid.startswith("coords:"):
                labels[int(gid.split(":")[1])] = text.get_text()
    return links, labels, styles


@pytest.mark.parametrize("text, per_node", [("ring=2,ulysses=4", 4), ("cfg=2,ring=2,ulysses=2", 4),
                                            ("tp=2,ulysses=2,ring=2", 4), ("cfg=2,ring=3", 2),
                                            ("ring=4", 8)])
def test_the_links_drawn_are_the_mesh_groups_on_their_links(text, per_node):
    layout = Layout.parse(text)
    fig = vm.mesh_figure([layout], gpus_per_node=per_node)
    links, labels, styles = _drawn(fig)
    assert links == _expected_pairs(layout, per_node, _mesh_groups)
    for (dim, a, b, link) in links:
        colour, style = styles[(dim, a, b)]
        assert colour == vm.COLOURS[dim] and style == vm.LINK_STYLE[link]
    short = {"cfg": "c", "ring": "r", "ulysses": "u", "tp": "t"}
    for rank in range(layout.world):
        co = layout.coords(rank)
        assert labels[rank] == " ".join(f"{short[d]}{co[d]}" for d in DIMS
                                        if getattr(layout, d) > 1)
    nodes = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("node:")]
    boxes = [p for p in fig.axes[0].patches if (p.get_gid() or "").startswith("rank:")]
    assert len(nodes) == -(-layout.world // per_node) and len(boxes) == layout.world
    for box in boxes:  # every rank's box lies inside its node's frame
        rank = int(box.get_gid().split(":")[1])
        frame = nodes[rank // per_node]
        assert frame.get_x() <= box.get_x() and (box.get_x() + box.get_width()
                                                 <= frame.get_x() + frame.get_width())


def test_two_dimensional_and_three_dimensional_examples():
    """ring2 x ulysses4 on 2 nodes of 4: Ulysses stays on NVLink, the ring crosses; cfg2 x ring2
    x ulysses2: only cfg crosses."""
    summary = {r["dim"]: r for r in vm.link_summary(Layout(ring=2, ulysses=4), 4)}
    assert summary["ulysses"] == {"dim": "ulysses", "degree": 4, "pairs": 12, "nvlink": 12, "ib": 0}
    assert summary["ring"]["ib"] == summary["ring"]["pairs"] == 4
    summary = {r["dim"]: r for r in vm.link_summary(Layout(cfg=2, ring=2, ulysses=2), 4)}
    assert {d: r["ib"] for d, r in summary.items()} == {"cfg": 4, "ring": 0, "ulysses": 0}
    fig = vm.mesh_figure(["ring=2,ulysses=4", "cfg=2,ring=2,ulysses=2"], gpus_per_node=4)
    assert len(fig.axes) == 2 and "ring2 x ulysses4" in fig.axes[0].get_title()


def test_coords_follow_layout_and_another_order_moves_tp_across_nodes():
    for world in (1, 4, 6, 8, 12):
        for layout in layouts(world):
            for rank in range(world):
                assert vm.coords(layout, rank) == layout.coords(rank)
            for dim in DIMS:
                assert sorted(vm.groups(layout, dim)) == sorted(_mesh_groups(layout, dim))
    art = Layout(ring=8, tp=2)  # the article: CP=8 inside each node, TP=2 across 2 nodes
    ours = {r["dim"]: r["ib"] for r in vm.link_summary(art, 8)}
    theirs = {r["dim"]: r["ib"] for r in vm.link_summary(art, 8, order=ARTICLE)}
    assert ours == {"ring": 4, "tp": 0} and theirs == {"ring": 0, "tp": 8}  # 2 rings, 2 hops each
    assert vm.groups(art, "tp", order=ARTICLE)[0] == [0, 8]
    with pytest.raises(InputError):
        vm.coords(art, 0, order=("tp", "ring"))


def test_traffic_by_link_sums_each_ranks_bytes_once():
    layout = Layout(cfg=2, ring=2, ulysses=2)
    sent = [{"cfg": 10, "ring": 100, "ulysses": 1000, "tp": 0} for _ in range(layout.world)]
    out = vm.traffic_by_link(layout, sent, 4)
    assert out == {"cfg": {"nvlink": 0.0, "ib": 80.0}, "ring": {"nvlink": 800.0, "ib": 0.0},
                   "ulysses": {"nvlink": 8000.0, "ib": 0.0}}
    flipped = vm.traffic_by_link(layout, sent, 4, order=("ulysses", "ring", "cfg", "tp"))
    assert flipped["ulysses"] == {"nvlink": 0.0, "ib": 8000.0}
    assert flipped["cfg"] == {"nvlink": 80.0, "ib": 0.0}
