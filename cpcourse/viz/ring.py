"""Figures for notebooks 03 to 05: the ring's block grid, K/V blocks travelling, per-rank timelines.

    python -m cpcourse.viz.ring artifacts      # writes the three figures of a 4-rank ring as PNG

Everything drawn comes from a `cpcourse.sim` trace (`simulate_ring(...).events`), a timeline
(`cpcourse.sim.timeline`, or `measured_timeline` from the per-step records `ring_attention(...,
stats=[])` returns) or the cost model. Figures are matplotlib `Figure` objects built without
pyplot, so they work headless and in a notebook alike.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from cpcourse.sim import block_grid
from cpcourse.support.shards import shard_sizes

_BLOCKS = colormaps["tab10"]
_KIND = {"compute": "#4c72b0", "comm": "#dd8452"}


def grid_figure(events: list, world: int) -> Figure:
    """The P x P block grid: row = query block (rank), column = K/V block, colour and label = the
    ring step at which that pair is computed. Each step is a wrapped diagonal: every rank busy."""
    grid = block_grid(events, world)
    fig = Figure(figsize=(1.2 + 0.55 * world, 1.0 + 0.5 * world))
    ax = fig.subplots()
    ax.imshow(grid, cmap=colormaps["viridis"], vmin=0, vmax=max(1, world - 1))
    for qb in range(world):
        for kb in range(world):
            ax.text(kb, qb, str(grid[qb][kb]), ha="center", va="center", fontsize=8,
                    color="white" if grid[qb][kb] < world / 2 else "black")
    ax.set_xticks(range(world))
    ax.set_yticks(range(world))
    ax.set_xlabel("K/V block (its owner rank)")
    ax.set_ylabel("query block = rank")
    ax.set_title(f"P = {world}: ring step of each block pair", fontsize=10)
    fig.tight_layout()
    return fig


def travel_figure(events: list, world: int) -> Figure:
    """Rows = ranks, columns = ring steps; each cell is the K/V block a rank holds (colour = the
    block's owner) and arrows show each send to the next rank, which computes on it next step."""
    held = {(e.step, e.rank): e.kv_block for e in events if e.kind == "compute"}
    sends = [e for e in events if e.kind == "send"]
    steps = 1 + max(s for s, _ in held)
    fig = Figure(figsize=(1.5 + 0.9 * steps, 0.9 + 0.55 * world))
    ax = fig.subplots()
    for (step, rank), block in held.items():
        ax.add_patch(_box(step, rank, _BLOCKS(block % 10)))
        ax.text(step, rank, f"KV{block}", ha="center", va="center", fontsize=8, color="white")
    for e in sends:
        ax.add_patch(FancyArrowPatch((e.step + 0.3, e.rank), (e.step + 0.7, e.peer),
                                     arrowstyle="->", mutation_scale=9, lw=0.8,
                                     color=_BLOCKS(e.kv_block % 10), alpha=0.8))
    ax.set_xlim(-0.6, steps - 0.4)
    ax.set_ylim(world - 0.5, -0.5)
    ax.set_xticks(range(steps))
    ax.set_yticks(range(world))
    ax.set_xlabel("ring step")
    ax.set_ylabel("rank")
    ax.set_title("K/V block held by each rank; arrows: sends to rank + 1", fontsize=9)
    fig.tight_layout()
    return fig


def _box(x: float, y: float, color) -> Rectangle:
    return Rectangle((x - 0.3, y - 0.35), 0.6, 0.7, color=color)


def measured_timeline(stats_per_rank: list[list[dict]]) -> list[dict]:
    """Rows like `cpcourse.sim.timeline`'s from measured per-step records (one list per rank, as
    `ring_attention(..., stats=stats)` fills it): compute, then the communication time that was
    NOT hidden (time spent in communication calls), back to back on each rank's own clock."""
    rows = []
    for rank, stats in enumerate(stats_per_rank):
        t = 0.0
        for s in sorted(stats, key=lambda s: s["step"]):
            rows.append({"rank": rank, "step": s["step"], "kind": "compute", "start": t,
                         "end": t + s["compute_s"]})
            t += s["compute_s"]
            rows.append({"rank": rank, "step": s["step"], "kind": "comm", "start": t,
                         "end": t + s["comm_s"]})
            t += s["comm_s"]
    return rows


def _draw_timeline(ax, rows: list[dict], world: int, title: str) -> None:
    for row in rows:
        # compute on the rank's own lane, communication in a thin lane just below it (the two
        # may run at the same time, so they must not cover each other)
        y, h = (row["rank"] - 0.32, 0.42) if row["kind"] == "compute" else (row["rank"] + 0.13,
                                                                             0.2)
        ax.broken_barh([(row["start"] * 1e3, (row["end"] - row["start"]) * 1e3)], (y, h),
                       color=_KIND[row["kind"]], edgecolor="white", linewidth=0.5)
    end = max((r["end"] for r in rows), default=0.0)
    ax.set_yticks(range(world))
    ax.set_ylim(world - 0.3, -0.6)
    ax.set_ylabel("rank")
    ax.set_title(f"{title}: {end * 1e3:.3g} ms", fontsize=9)


def timeline_figure(timelines: dict[str, list[dict]], world: int) -> Figure:
    """One panel per timeline ({title: rows}), ranks as lanes, milliseconds on the x axis; blue
    = attention compute, orange = a K/V transfer (for measured rows: exposed waiting)."""
    fig = Figure(figsize=(8, 0.6 + (0.35 + 0.32 * world) * len(timelines)))
    axes = fig.subplots(len(timelines), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (title, rows) in zip(axes, timelines.items(), strict=True):
        _draw_timeline(ax, rows, world, title)
    axes[-1].set_xlabel("ms")
    handles = [Patch(color=c, label=k) for k, c in _KIND.items()]
    axes[0].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def steps_figure(measured: list[dict], simulated: list[dict], world: int) -> Figure:
    """Measured against simulated, step by step: bars of each step's duration (the slowest rank)
    in the measured run and in the simulation's timeline."""
    def per_step(rows):
        out = {}
        for r in rows:
            out.setdefault(r["step"], {}).setdefault(r["rank"], [r["start"], r["end"]])
            span = out[r["step"]][r["rank"]]
            span[0], span[1] = min(span[0], r["start"]), max(span[1], r["end"])
        return [max(e - s for s, e in out[k].values()) * 1e3 for k in sorted(out)]

    m, s = per_step(measured), per_step(simulated)
    fig = Figure(figsize=(6, 2.6))
    ax = fig.subplots()
    xs = range(len(m))
    ax.bar([x - 0.2 for x in xs], m, width=0.4, label="measured", color="#4c72b0")
    ax.bar([x + 0.2 for x in range(len(s))], s, width=0.4, label="simulated", color="#8c8c8c")
    ax.set_xticks(list(xs))
    ax.set_xlabel("ring step")
    ax.set_ylabel("ms (slowest rank)")
    ax.set_title(f"P = {world}: each ring step, measured and simulated", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def hide_figure(rows: list[dict], marks: dict[str, int] | None = None) -> Figure:
    """compute / comm of one ring step against tokens per rank (log-log), one line per link
    ({"label", "tokens": [...], "ratio": [...]}); 1 = the hiding threshold; `marks` = vertical
    lines at named token counts (e.g. the current slider value)."""
    fig = Figure(figsize=(9, 3.2))
    ax = fig.subplots()
    for i, row in enumerate(rows):
        ax.loglog(row["tokens"], row["ratio"], label=row["label"], color=_BLOCKS(i % 10))
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.text(ax.get_xlim()[0], 1.05, "hidden above this line", fontsize=8, va="bottom")
    for name, x in (marks or {}).items():
        ax.axvline(x, color="grey", lw=0.8)
        ax.text(x, ax.get_ylim()[1], f" {name}", fontsize=8, va="top", rotation=90)
    ax.set_xlabel("tokens per rank (Lq)")
    ax.set_ylabel("compute / comm per ring step")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def image(fig: Figure, dpi: int = 80):
    """The figure as an IPython PNG `Image`: what the notebooks' widget callbacks return, so the
    picture is rendered once, at a fixed size, whatever the display's figure settings."""

    import io

    from IPython.display import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return Image(buf.getvalue())


def at_scale(events: list, tokens: int, heads: int, head_dim: int, elem_bytes: int = 2) -> list:
    """The same trace with the FLOPs and bytes of a real workload: `tokens` split over the
    trace's ranks like tensor_split, `heads` x `head_dim`, `elem_bytes` per element. The schedule
    comes from the simulator (run on tiny tensors); only the sizes change."""
    world = 1 + max(e.rank for e in events)
    sizes = shard_sizes(tokens, world)
    out = []
    for e in events:
        if e.kind == "compute":
            lq, lk = sizes[e.q_block], sizes[e.kv_block]
            out.append(replace(e, q_tokens=lq, kv_tokens=lk,
                               flops=4 * lq * lk * head_dim * heads))
        else:
            out.append(replace(e, nbytes=2 * sizes[e.kv_block] * heads * head_dim * elem_bytes))
    return out


def _main(argv: list[str]) -> int:
    import torch

    from cpcourse.sim import simulate_ring, timeline

    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    q = torch.randn(1, 2, 10, 8)
    res = simulate_ring(q, q, q, 4)
    tl = {"overlap": timeline(res.events, 4, 1e9, 2e7),
          "blocking": timeline(res.events, 4, 1e9, 2e7, overlap=False)}
    for name, fig in (("ring_grid", grid_figure(res.events, 4)),
                      ("ring_travel", travel_figure(res.events, 4)),
                      ("ring_timeline", timeline_figure(tl, 4))):
        fig.savefig(out / f"{name}.png", dpi=80)
        print(out / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
