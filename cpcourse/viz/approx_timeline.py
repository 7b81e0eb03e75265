"""One denoising step of each approximate method as bars: compute, and communication that the
step waits on (exposed) or that runs beside it (hidden).

    jupyter lab notebooks/13_trading_exactness_for_communication.ipynb

A schematic drawn to the methods' own byte counts (`cpcourse.approx.costs`), at equal per-rank
compute: every method does 1/P of the model's work per step, the patch methods all L layers on
1/P of the frames, PipeFusion and AsyncDiff L/P layers on all of them. One unit is 1/P of one
layer's work over the whole clip (so a step's compute is L units on every rank, whatever the
method), and a message takes `comm` units per layer's worth of exact CP's K/V (`comm` says how
slow the link is against the GPU). Rank 0's view, after the warm-up.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from cpcourse.approx.costs import bytes_per_step

COLORS = {"compute": "tab:blue", "exposed": "tab:red", "hidden": "tab:green"}


def step_segments(method: str, cfg, shape, world: int, comm: float, patches: int = 2) -> list:
    """[(lane, start, length, kind), ...] of rank 0's step; lane 0 the compute stream, lane 1
    the link; kind "compute", "exposed" (the compute stream waits) or "hidden"."""
    layers = cfg.depth
    per_layer = bytes_per_step("exact", cfg, shape, world, 0, 0) / layers
    sent = bytes_per_step(method, cfg, shape, world, 0, step=layers + 1)
    msg = comm * sent / per_layer  # this method's bytes in units of one layer's exact gather
    out, t = [], 0.0
    if method in ("exact", "naive", "displaced"):
        for _ in range(layers):
            out.append((0, t, 1.0, "compute"))
            t += 1.0
            if method == "exact":  # the next layer needs every rank's K/V: wait for it
                out.append((1, t, msg / layers, "exposed"))
                t += msg / layers
            elif method == "displaced":  # waited on at this layer one step later
                out.append((1, t, msg / layers, "hidden"))
        return out
    # pipefusion and asyncdiff: rank 0 runs 1 / P of the blocks, but on every frame: the same
    # work as a patch rank's L layers on 1 / P of the frames (PipeFusion, arXiv 2405.14430;
    # AsyncDiff, arXiv 2406.06911)
    stage = float(layers)  # L / P blocks x P times the tokens of a patch rank
    chunks = patches if method == "pipefusion" else 1
    for _ in range(chunks):  # each patch's hidden state leaves while the next one computes
        out.append((0, t, stage / chunks, "compute"))
        t += stage / chunks
        out.append((1, t, msg / chunks, "hidden"))
    return out


def timeline_figure(methods, cfg, shape, world: int, comm: float, patches: int = 2) -> Figure:
    """One row per method: its step's compute and link lanes (`step_segments`)."""
    fig = Figure(figsize=(10, 0.9 * len(methods) + 0.8))
    axes = fig.subplots(len(methods), 1, sharex=True, squeeze=False)[:, 0]
    for ax, method in zip(axes, methods, strict=True):
        for lane, start, length, kind in step_segments(method, cfg, shape, world, comm, patches):
            ax.barh(1 - lane, length, left=start, height=0.7, color=COLORS[kind],
                    edgecolor="white")
        ax.set_yticks([1, 0], ["compute", "link"])
        ax.set_ylabel(method, rotation=0, ha="right", va="center")
        ax.set_ylim(-0.5, 1.5)
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], ncol=3,
               loc="upper right", fontsize=8)
    axes[-1].set_xlabel("time, in units of 1/P of one layer's work on the whole clip (rank 0, "
                       "one step after warm-up; every method computes the same per step)")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
