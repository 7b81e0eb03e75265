"""The ring's hiding threshold as a roofline: a step's FLOPs per byte sent against each link's.

    python -m cpcourse.viz.overlap artifacts    # writes the figure: A100, H100, B200, CP = 8

One ring step computes 4 Lq^2 D H FLOPs while it sends 2 Lq D H b bytes, so its arithmetic
intensity is I = 2 Lq / b FLOPs per byte (Lq itself in bf16): it grows with the tokens a rank
holds. A link hides the step's transfer once I >= F / B, the GPU's FLOP/s over the link's
bytes/s: the critical intensity, one vertical line per link. With the hop overlapped a step
takes max(compute, comm), so the share of the kernel's rate it achieves is min(1, I B / F).
Every number comes from `cpcourse.planner.costs.comm` (the figures of `cpcourse comm`), each GPU
with its own links from `cpcourse.planner.hardware`.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cpcourse.planner import costs
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.tokens import get_model, model_tokens
from cpcourse.viz import fmt

GPUS = ("a100-80gb-sxm", "h100-sxm", "b200")
MODELS = ("ltx-video-13b", "cogvideox-5b", "mochi-1", "wan2.1-t2v-14b", "hunyuanvideo-13b")
LINK_KINDS = (("NVLink", "nvlink"), ("PCIe", "pcie"), ("InfiniBand", "nic"))
_COLORS = {"NVLink": "C2", "PCIe": "C1", "InfiniBand": "C3"}
_MARKERS = "os^Dv<>p*h"


def thresholds(gpu_ids=GPUS, dtype: str = "bf16") -> list[dict]:
    """One row per GPU and each of its own links (its NVLink if it has one, its PCIe, its
    InfiniBand NIC): `flops_per_s` and `bytes_per_s` as `costs.comm` uses them,
    `critical_intensity` F / B (FLOPs per byte) and `min_tokens_per_rank_to_hide` as
    `costs.comm` (and `cpcourse comm`) reports it."""
    rows = []
    for gid in gpu_ids:
        g = get_gpu(gid)
        for kind, attr in LINK_KINDS:
            lid = getattr(g, attr)
            if lid is None:  # a PCIe-only GPU has no NVLink
                continue
            c = costs.comm(1024, 1, 1, 128, dtype=dtype, link=lid, gpu=g.id)
            flops, bw = c["effective_tflops"] * 1e12, c["effective_GBps"] * 1e9
            rows.append({"gpu": g.id, "gpu_name": g.name, "kind": kind, "link": lid,
                         "link_name": get_link(lid).name, "flops_per_s": flops,
                         "bytes_per_s": bw, "critical_intensity": flops / bw,
                         "min_tokens_per_rank_to_hide": c["min_tokens_per_rank_to_hide"]})
    return rows


def model_points(model_ids=MODELS, cp: int = 8, dtype: str = "bf16") -> list[dict]:
    """Each model at its default size on `cp` ranks: `tokens_per_rank` and the ring step's
    `intensity`, `costs.comm`'s flops_per_step / kv_bytes_per_hop (the same on every link)."""
    out = []
    for mid in model_ids:
        m = get_model(mid)
        c = costs.comm(model_tokens(mid).sequence_length, cp, m.heads, m.head_dim, dtype=dtype,
                       link="nvlink4")
        out.append({"model": mid, "name": m.name, "cp": cp, "tokens": c["tokens"],
                    "tokens_per_rank": c["tokens_per_rank"],
                    "intensity": c["flops_per_step"] / c["kv_bytes_per_hop"]})
    return out


def achieved_share(intensity: float, critical_intensity: float) -> float:
    """Share of the attention kernel's rate an overlapped ring step reaches: min(1, I / I*)."""
    return min(1.0, intensity / critical_intensity)


def short_name(name: str) -> str:
    """'NVIDIA H100 SXM5 80GB' -> 'H100 SXM5 80GB', 'B200 (HGX/DGX B200)' -> 'B200'."""
    return name.split(" (")[0].removeprefix("NVIDIA ")


def roofline_figure(rows: list[dict], points: list[dict], dtype: str = "bf16") -> Figure:
    """One panel per GPU: for each of its links the roof min(1, I / I*) and a vertical line at
    the critical intensity I* (labelled with the tokens per rank that hide); each model's ring
    step as a dotted line at its intensity, marked where it meets every roof."""
    gpu_ids = list(dict.fromkeys(r["gpu"] for r in rows))
    xs_all = [r["critical_intensity"] for r in rows] + [p["intensity"] for p in points]
    lo, hi = min(xs_all) / 4, max(xs_all) * 4
    grid = [lo * (hi / lo) ** (t / 199) for t in range(200)]
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    axes = fig.subplots(1, len(gpu_ids), sharey=True, squeeze=False)[0]
    for ax, gid in zip(axes, gpu_ids, strict=True):
        for p in points:
            ax.axvline(p["intensity"], color="0.5", ls=":", lw=0.8)
        for r in (r for r in rows if r["gpu"] == gid):
            color = _COLORS[r["kind"]]
            ax.plot(grid, [achieved_share(x, r["critical_intensity"]) for x in grid], color=color,
                    lw=2, gid=f"roof:{r['link']}",
                    label=f"{short_name(r['link_name'])}: hides from "
                          f"{fmt.count(r['min_tokens_per_rank_to_hide'])} tokens/rank")
            ax.axvline(r["critical_intensity"], color=color, ls="--", lw=1,
                       gid=f"threshold:{r['link']}")
            for p, mark in zip(points, _MARKERS, strict=False):
                ax.plot([p["intensity"]], [achieved_share(p["intensity"],
                                                          r["critical_intensity"])],
                        mark, color=color, mec="k", mew=0.5, ms=6,
                        gid=f"model:{p['model']}:{r['link']}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(0.01, 1.6)
        ax.yaxis.set_major_formatter(lambda y, _: f"{y:.0%}")
        ax.xaxis.set_major_formatter(lambda x, _: fmt.count(x))
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(short_name(get_gpu(gid).name), fontsize=10)
        ax.set_xlabel(f"ring step's FLOPs per byte sent, 2 Lq / b ({dtype})", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("share of the attention kernel's rate\nreached by an overlapped step")
    if points:
        fig.legend([Line2D([], [], marker=mark, ls="", color="w", mec="k")
                    for _, mark in zip(points, _MARKERS, strict=False)],
                   [f"{short_name(p['name'])}: {fmt.count(p['tokens_per_rank'])} tokens per rank"
                    for p in points], loc="outside lower center", ncols=min(3, len(points)),
                   fontsize=8, title=f"models at their default size, CP = {points[0]['cp']}",
                   title_fontsize=8)
    fig.suptitle("Where the ring hides its traffic: right of a link's dashed line (its critical "
                 "intensity F / B), a step computes longer than its hop takes", fontsize=10)
    return fig


if __name__ == "__main__":
    from cpcourse.viz import write_figures

    write_figures({"hiding_roofline": roofline_figure(thresholds(), model_points())})
