"""Notebook 10's planner figures: every published run beside the planner's prediction.

    python -m cpcourse.viz.planner artifacts   # planner_validation.png: one panel per table

`validation_figure(validate())` draws, for each published table
(`cpcourse.planner.validation.validate`), the published seconds and the predicted seconds against
the GPU count, and the published one-GPU time divided by P (perfect scaling) for scale. Every point
drawn is a number of `validate()`;
each artist carries a gid ("published:TABLE:GPUS", "predicted:TABLE:GPUS") so a test reads them
back.

`video_parts_figure(alternatives)` is the planner's core picture: for each costed layout (a
`cpcourse.planner.deployment.cost` dict, e.g. `plan(...)["alternatives"]`), one horizontal bar
of the whole video's seconds split into what the planner adds up: linear layers, attention,
element-wise work, exposed communication (all-to-alls, ring hops that did not hide, TP
all-reduces, FSDP gathers, the CFG exchange) and the fixed costs (VAE decode, text encoder).
Each bar segment carries a gid ("part:LAYOUT:NAME") so a test reads the seconds back.

`amdahl_speedup` is Amdahl's law for a run whose time is a part that does not shrink with P
plus a part that divides by P: what a serial term does to a speedup
(`cpcourse.planner.validation.amdahl_fit` finds the two parts in a published table).

`STEP_VIDEO_XDIT_H20` holds figures xDiT publishes for Step-Video-T2V 30B (quoted, so typed on
purpose, with their source); the planner's own numbers for the same layouts come from `plan`.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator

from cpcourse.planner.hardware import get_gpu
from cpcourse.support.layout import Layout

# xdit-project/xDiT docs/performance/stepvideo.md, "Nvidia H20 Cluster (8xNVLink)": latency and
# memory usage per GPU count and parallel type (SP = ulysses_degree). The page states neither
# the resolution, the frame count nor the steps.
STEP_VIDEO_XDIT_H20 = {
    "source": "xdit-project/xDiT docs/performance/stepvideo.md (Step-Video-T2V 30B, H20, 8x "
              "NVLink; SP is ulysses_degree; resolution, frames and steps not stated)",
    "model": "step-video-t2v-30b", "gpu": "h20",
    "runs": [
        {"gpus": 1, "layout": "", "latency_s": 213.60, "memory_MB": 92_170},
        {"gpus": 2, "layout": "tp=2", "latency_s": 108.97, "memory_MB": 57_458},
        {"gpus": 2, "layout": "ulysses=2", "latency_s": 108.13, "memory_MB": 86_258},
        {"gpus": 4, "layout": "tp=4", "latency_s": 57.61, "memory_MB": 36_566},
        {"gpus": 4, "layout": "ulysses=4", "latency_s": 57.01, "memory_MB": 78_226},
        {"gpus": 8, "layout": "tp=8", "latency_s": 30.40, "memory_MB": 30_028},
        {"gpus": 8, "layout": "ulysses=8", "latency_s": 30.10, "memory_MB": 79_684},
    ],
}


PARTS = {"linear": ("linear",), "attention": ("attention", "ring_merge"),
         "element-wise": ("elementwise",),
         "exposed communication": ("ulysses", "ring_exposed", "tp_allreduce", "fsdp_exposed",
                                   "attn2d")}


def video_parts(c: dict) -> dict[str, float]:
    """A `cost` dict's whole-video seconds by part (`PARTS`, plus "fixed"); they sum to
    `seconds_total`."""
    steps_s = c["seconds_total"] - c["seconds_fixed"]
    per_step = c["seconds_per_step"]
    steps = steps_s / per_step if per_step else 0.0
    per_forward = c["breakdown"]["per_forward_seconds"]
    out = {name: steps * c["forwards_per_step"] * sum(per_forward.get(k, 0.0) for k in keys)
           for name, keys in PARTS.items()}
    out["exposed communication"] += steps * c["breakdown"]["cfg_exchange_seconds"]
    out["fixed"] = c["seconds_fixed"]
    return out


def video_parts_figure(alternatives: list[dict], title: str = "") -> Figure:
    """One stacked horizontal bar per layout: the whole video's seconds by part (`video_parts`),
    fastest at the top, each bar labelled with its total."""
    rows = sorted(alternatives, key=lambda c: c["seconds_total"])
    labels = [str(Layout(**c["layout"])) for c in rows]
    fig = Figure(figsize=(9, 0.45 * len(rows) + 1.4), layout="constrained")
    ax = fig.subplots()
    left = [0.0] * len(rows)
    for i, name in enumerate([*PARTS, "fixed"]):
        widths = [video_parts(c)[name] for c in rows]
        bars = ax.barh(range(len(rows)), widths, left=left, color=f"C{i}", label=name)
        for bar, label in zip(bars, labels, strict=True):
            bar.set_gid(f"part:{label}:{name}")
        left = [a + w for a, w in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.annotate(f"{total:,.0f} s", (total, y), xytext=(3, -3), textcoords="offset points",
                    fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds for one video")
    fig.legend(loc="outside lower center", ncols=len(PARTS) + 1, fontsize=7)
    ax.set_title(title or "where one video's seconds go, layout by layout", fontsize=10)
    return fig


def amdahl_speedup(t1: float, serial: float, p: float) -> float:
    """Speedup on p GPUs of a t1-second run whose `serial` seconds do not divide:
    t1 / (serial + (t1 - serial) / p). Its ceiling (p -> infinity) is t1 / serial."""
    return t1 / (serial + (t1 - serial) / p)


def tables(v: dict) -> dict[str, list[dict]]:
    """`validate()`'s rows grouped by table, each group in GPU order."""
    out: dict[str, list[dict]] = {}
    for row in v["rows"]:
        out.setdefault(row["table"], []).append(row)
    return {k: sorted(rs, key=lambda r: r["gpus"]) for k, rs in out.items()}


def _gpu_of(table: str) -> str:
    return {"4090": "rtx4090"}.get(table.rsplit("-", 1)[-1], table.rsplit("-", 1)[-1])


def validation_figure(v: dict, ncols: int = 4,
                      title: str = "Every published run beside cpcourse plan's prediction",
                      ) -> Figure:
    """One panel per table of `validate()`: published (black) and predicted (blue) seconds for
    one video against the GPU count, log-log, the prediction's interval shaded (every uncertain
    input at either end: `cpcourse.planner.uncertainty`), with perfect scaling of the published
    one-GPU time (grey) for scale,
    and each prediction's ratio to the published time written beside it.
    `v` may also be `validate()["holdout"]` (the same keys)."""
    groups = tables(v)
    nrows = -(-len(groups) // ncols)
    fig = Figure(figsize=(3.2 * ncols, 2.9 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (name, rows) in zip(axes, groups.items(), strict=False):
        gpus = [r["gpus"] for r in rows]
        pub = [r["published_s"] for r in rows]
        pred = [r["predicted_s"] for r in rows]
        ax.plot(gpus, [pub[0] * gpus[0] / g for g in gpus], ":", color="0.6", lw=1,
                gid=f"ideal:{name}", label="published 1st point / P")
        ax.plot(gpus, pub, "-", color="k", lw=1.2)
        ax.plot(gpus, pred, "--", color="C0", lw=1.2)
        if all("interval_s" in r for r in rows):  # every uncertain input at either end
            ax.fill_between(gpus, [r["interval_s"][0] for r in rows],
                            [r["interval_s"][1] for r in rows], color="C0", alpha=0.15, lw=0,
                            gid=f"interval:{name}")
        for g, p_s, q_s in zip(gpus, pub, pred, strict=True):
            ax.plot([g], [p_s], "o", color="k", ms=5, gid=f"published:{name}:{g}")
            ax.plot([g], [q_s], "s", color="C0", ms=5, mfc="white",
                    gid=f"predicted:{name}:{g}")
            ax.annotate(f"{q_s / p_s:.2f}", (g, q_s), textcoords="offset points",
                        xytext=(4, -10), fontsize=7, color="C0")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.minorticks_off()
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(lambda y, _: f"{y:,.0f} s")
        ax.set_xlim(gpus[0] / 1.3, gpus[-1] * 1.6)
        ax.grid(True, alpha=0.3)
        model = name.rsplit("-", 2)[0]  # tables are named model-resolution-gpu
        gpu_name = get_gpu(_gpu_of(name)).name.removeprefix("NVIDIA ")
        ax.set_title(f"{model}, {name.rsplit('-', 2)[-2]}\n{gpu_name}", fontsize=8)
        ax.set_xlabel("GPUs", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(groups):]:
        ax.axis("off")
    axes[0].set_ylabel("seconds for one video", fontsize=8)
    handles = [axes[0].plot([], [], "o-", color="k", ms=5)[0],
               axes[0].plot([], [], "s--", color="C0", ms=5, mfc="white")[0],
               axes[0].plot([], [], ":", color="0.6")[0]]
    labels = ["published", "predicted (ratio to published beside it)",
              "published fewest-GPU time / P: perfect scaling"]
    covered = v.get("interval_coverage")
    if covered is not None:
        handles.append(axes[0].fill_between([], [], [], color="C0", alpha=0.15, lw=0))
        labels.append(f"interval (every input at either end): {covered:.0%} of published inside")
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle(f"{title}: median |predicted / published - 1| = "
                 f"{v['median_abs_rel_error']:.1%}, worst {v['worst_abs_rel_error']:.1%}",
                 fontsize=10)
    return fig


if __name__ == "__main__":
    from cpcourse.planner.validation import validate
    from cpcourse.viz import write_figures

    write_figures({"planner_validation": validation_figure(validate())})
