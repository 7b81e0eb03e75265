"""Figures for notebooks 06 and 07: the T split, bytes per method, sampled frames, memory per rank.

    python -m cpcourse.viz.video artifacts     # writes the layout and byte-model figures as PNG

Every number drawn comes from `cpcourse` (the split from `cpcourse.support.shards.shard_sizes`,
bytes from `cpcourse.course.video_lab` / `cpcourse.planner.video_costs`, memory from
`cpcourse.tinydit.sampling`). Figures are matplotlib `Figure` objects built without pyplot.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from cpcourse.support.shards import shard_sizes
from cpcourse.viz import fmt

_RANK_COLORS = colormaps["tab10"]


def split_figure(frames: int, positions: int, world: int) -> Figure:
    """Two grids (frames x positions), coloured by the rank that holds each token: the time
    split every rank starts with, and the space split the temporal all-to-all produces."""
    fig = Figure(figsize=(9, 2.8))
    for ax, (title, dim) in zip(fig.subplots(1, 2), (("time split (T sharded)", 0),
                                                       ("space split (S sharded)", 1)),
                                strict=True):
        owner = torch.zeros(frames, positions)
        sizes = shard_sizes(frames if dim == 0 else positions, world)
        start = 0
        for r, n in enumerate(sizes):
            if dim == 0:
                owner[start:start + n] = r
            else:
                owner[:, start:start + n] = r
            start += n
        ax.imshow(owner, cmap=_RANK_COLORS, vmin=0, vmax=9, aspect="auto")
        ax.set_title(f"{title}: {sizes}", fontsize=9)
        ax.set_xlabel("spatial position s")
        ax.set_ylabel("frame t")
    fig.suptitle(f"T = {frames} frames, S = {positions} positions, P = {world} ranks "
                 "(colour = rank)", fontsize=10)
    fig.tight_layout()
    return fig


def bytes_figure(summary: list[dict], title: str = "") -> Figure:
    """Bars: bytes sent by the busiest rank per method, measured, with the prediction marked."""
    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    names = [f"{r['attention']}\n{r['method']}" for r in summary]
    measured = [r["bytes_max_rank"] for r in summary]
    predicted = [r["predicted_max_rank"] for r in summary]
    ax.bar(names, measured, color="#4c72b0", label="measured (count_bytes)")
    ax.scatter(names, predicted, color="#dd8452", marker="_", s=900, linewidths=3,
               label="predicted (video_costs)", zorder=3)
    for i, m in enumerate(measured):
        ax.annotate(fmt.nbytes(m), (i, m), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("bytes sent, busiest rank")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def frames_figure(latents: dict, channel: int = 0, max_frames: int = 8) -> Figure:
    """Rows: one sample per P (`{P: [B, C, T, H, W]}`); columns: frames; one latent channel."""
    rows = list(latents.items())
    t = min(max_frames, rows[0][1].shape[2])
    fig = Figure(figsize=(1.3 * t, 1.4 * len(rows)))
    axes = fig.subplots(len(rows), t, squeeze=False)
    lo = min(float(x[0, channel, :t].min()) for _, x in rows)
    hi = max(float(x[0, channel, :t].max()) for _, x in rows)
    for i, (p, x) in enumerate(rows):
        for j in range(t):
            ax = axes[i][j]
            ax.imshow(x[0, channel, j].float().numpy(), cmap="viridis", vmin=lo, vmax=hi)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"frame {j}", fontsize=8)
            if j == 0:
                ax.set_ylabel(f"P = {p}", fontsize=9)
    fig.suptitle(f"latent channel {channel} of the same sample generated at each P", fontsize=10)
    fig.tight_layout()
    return fig


def memory_figure(reports: dict) -> Figure:
    """Peak tensor memory per rank vs P: measured bars, predicted marks (`{P: report}`)."""
    fig = Figure(figsize=(7, 3))
    ax = fig.subplots()
    x, ticks, labels = 0.0, [], []
    for p, rep in reports.items():
        for r, (m, pred) in enumerate(zip(rep["peak_bytes_per_rank"],
                                          rep["predicted_peak_bytes_per_rank"], strict=True)):
            ax.bar(x, m / 1e6, color=_RANK_COLORS(r))
            ax.scatter([x], [pred / 1e6], color="black", marker="_", s=300, zorder=3)
            ticks.append(x)
            labels.append(f"P={p}\nrank {r}")
            x += 1
        x += 0.5
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("peak tensor memory per rank (MB)")
    ax.set_title("bars: measured (support.peak_memory); black marks: predicted (tinydit.costs)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def _main(argv: list[str]) -> int:
    from cpcourse.planner.video_costs import video_bytes_table

    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    split_figure(7, 12, 3).savefig(out / "video_split.png", dpi=90)
    rows = [{**r, "bytes_max_rank": r["max_rank_bytes"], "predicted_max_rank": r["max_rank_bytes"]}
            for r in video_bytes_table(1, 16, 120, 3600, 72, 8, elem_bytes=2)]
    title = "Open-Sora 1.2 at its largest trained size (720p, 16 s), P = 8 (predicted)"
    bytes_figure(rows, title).savefig(out / "video_bytes.png", dpi=90)
    print(f"wrote {out}/video_split.png and {out}/video_bytes.png")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
