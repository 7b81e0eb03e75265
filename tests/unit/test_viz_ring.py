"""The ring's and Ulysses' figures and the helpers behind them (cpcourse.viz), headless.

    python -m pytest tests/unit/test_viz_ring.py -q
"""

from __future__ import annotations

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from cpcourse import sim  # noqa: E402
from cpcourse.planner import costs  # noqa: E402
from cpcourse.viz import ring as vr  # noqa: E402


def _events(world: int, length: int | None = None):
    x = torch.randn(1, 1, world if length is None else length, 2)
    return sim.simulate_ring(x, x, x, world).events


def test_grid_figure_labels_every_pair_with_its_step():
    world = 5
    fig = vr.grid_figure(_events(world), world)
    labels = [t.get_text() for t in fig.axes[0].texts]
    grid = sim.block_grid(_events(world), world)
    assert labels == [str(grid[q][k]) for q in range(world) for k in range(world)]
    assert sorted(labels) == sorted(str(s) for s in range(world) for _ in range(world))


def test_travel_figure_draws_one_box_per_rank_and_step_and_one_arrow_per_send():
    world = 4
    events = _events(world)
    fig = vr.travel_figure(events, world)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == world * world and texts.count("KV0") == world
    arrows = [p for p in fig.axes[0].patches if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == sum(e.kind == "send" for e in events) == world * (world - 1)


def test_at_scale_gives_the_cost_models_bytes_and_flops():
    world, tokens, heads, head_dim = 8, 75600, 40, 128
    scaled = vr.at_scale(_events(world), tokens, heads, head_dim, 2)
    c = costs.comm(tokens, world, heads, head_dim, link="nvlink4")
    assert sum(sim.bytes_sent(scaled, world)) == c["kv_bytes_total"] * world  # even split
    step0 = [e for e in scaled if e.kind == "compute" and e.step == 0]
    assert all(e.flops == c["flops_per_step"] for e in step0)
    uneven = vr.at_scale(_events(3), 10, 1, 1, 1)  # shards 4, 3, 3: K and V of each block
    assert [e.nbytes for e in uneven if e.kind == "send" and e.step == 0] == [8, 6, 6]


def test_measured_timeline_lays_steps_back_to_back():
    stats = [[{"step": 1, "compute_s": 2.0, "comm_s": 0.5}, {"step": 0, "compute_s": 1.0,
                                                             "comm_s": 0.25}]]
    rows = vr.measured_timeline(stats)
    assert [(r["kind"], r["start"], r["end"]) for r in rows] == [
        ("compute", 0.0, 1.0), ("comm", 1.0, 1.25), ("compute", 1.25, 3.25), ("comm", 3.25, 3.75)]


def test_timeline_steps_and_hide_figures_build():
    world = 3
    events = vr.at_scale(_events(world), 3000, 4, 32, 4)
    over = sim.timeline(events, world, 1e11, 1e9, overlap=True)
    block = sim.timeline(events, world, 1e11, 1e9, overlap=False)
    fig = vr.timeline_figure({"overlap": over, "blocking": block}, world)
    assert len(fig.axes) == 2 and "overlap" in fig.axes[0].get_title()
    assert max(r["end"] for r in over) < max(r["end"] for r in block)
    assert len(vr.steps_figure(over, block, world).axes[0].patches) == 2 * world
    fig = vr.hide_figure([{"label": "x", "tokens": [1, 10], "ratio": [0.1, 1.0]}], {"you": 5})
    assert fig.axes[0].get_lines()[0].get_label() == "x"


def test_image_is_a_png():
    fig = vr.grid_figure(_events(2), 2)
    assert vr.image(fig, dpi=30).data[:8] == b"\x89PNG\r\n\x1a\n"


def test_ulysses_ownership_and_figure():
    from cpcourse.viz.ulysses import ownership, transpose_figure

    for world, heads, tokens in ((1, 2, 3), (3, 6, 8), (4, 8, 5), (2, 4, 1)):
        before, after = ownership(world, heads, tokens)
        sizes = [len(t) for t in torch.tensor_split(torch.arange(tokens), world)]
        assert [int((before[0] == r).sum()) for r in range(world)] == sizes
        assert all((after[h] == h // (heads // world)).all() for h in range(heads))
        for r in range(world):  # a rank keeps 1/P of its shard: its own head group
            assert ((before == r) & (after == r)).sum() * world == (before == r).sum()
    fig = transpose_figure(3, 6, 8)
    assert len(fig.axes) == 2 and "67%" in fig._suptitle.get_text()
    with pytest.raises(ValueError, match="divide the heads"):
        ownership(4, 6, 8)
