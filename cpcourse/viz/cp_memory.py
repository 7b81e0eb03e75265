"""Notebook 00's memory figure: the bytes one GPU holds for one layer, against each GPU's HBM.

    python -m cpcourse.viz.tokens artifacts   # writes tokens_growth.png and cp_memory.png

`gpu_memory` composes `cpcourse.planner.costs.memory` (weights, one layer's activations, the
ring's K/V buffers) with the score matrix naive attention would store; `draw_cp_memory` draws
both against the CP degree, with a dotted line at each HBM size of the hardware table
(`hbm_lines`, also under `cpcourse.viz.tokens`' growth figure).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

from cpcourse.planner.costs import memory
from cpcourse.planner.hardware import get_gpu, gpus
from cpcourse.planner.tokens import ModelPreset, get_model
from cpcourse.support.dtypes import nbytes
from cpcourse.viz import fmt

CP_DEGREES = (1, 2, 4, 8, 16, 32)


def gpu_memory(m: ModelPreset, tokens: int, cp: int, *, dtype: str = "bf16",
               cfg_batch: int = 1) -> dict:
    """Bytes one GPU holds while one layer of `m` runs on `tokens` tokens split over `cp` ranks.

    fused: weights (replicated: CP never divides them) + that layer's activations for the local
    shard + the ring's K/V buffers, as with FlashAttention-style kernels that never store scores.
    materialised: fused plus the score matrix of every head, local queries x all keys, which is
    what naive attention would store.
    """
    mem = memory(tokens, m.hidden, m.heads, dtype=dtype, cp=cp, ffn=m.ffn, layers=m.layers,
                 params_b=m.params_b, cfg_batch=cfg_batch)
    scores = mem["tokens_per_rank"] * tokens * m.heads * nbytes(dtype) * cfg_batch
    return {
        "cp": cp, "tokens_per_rank": mem["tokens_per_rank"],
        "weights": mem["weights_bytes"],
        "activations": mem["activation_bytes_per_layer_per_rank"],
        "ring_kv": mem["ring_kv_buffer_bytes_per_rank"] if cp > 1 else 0,
        "scores": scores,
        "fused": mem["per_gpu_bytes"] - (0 if cp > 1 else mem["ring_kv_buffer_bytes_per_rank"]),
        "materialised": mem["per_gpu_bytes"] + scores,
    }


def gb_axis(ax) -> None:
    """Log axis in GB with ticks at 1, 2, 5 x 10^k, so even a short range is labelled."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: f"{v / 1e9:,.0f} GB" if v >= 1e9 else f"{v / 1e9:g} GB"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def hbm_lines(ax, highlight: str | None = None) -> None:
    """Dotted lines at each distinct HBM size of the GPUs in the hardware table, labelled on
    the left (far from curves that grow or fall): the top label above its line, the others
    under theirs, so that labels of close sizes (141 and 180 GB) never overlap; a label under its
    line that sits close above the previous one (96 over 80 GB) moves right, out of its way."""
    sizes: dict[int, list[str]] = {}
    for g in gpus().values():
        sizes.setdefault(g.hbm_bytes, []).append(g.id.split("-")[0].upper())
    ordered = sorted(sizes.items())
    x_prev = None
    for i, (size, names) in enumerate(ordered):
        hot = highlight is not None and get_gpu(highlight).id.split("-")[0].upper() in names
        color = "crimson" if hot else "0.35"
        ax.axhline(size, color=color, lw=1.6 if hot else 1, ls=":")
        top = i == len(ordered) - 1
        close = i > 0 and size < 1.35 * ordered[i - 1][0]
        x = 0.5 if close and not top and x_prev == 0.01 else 0.01
        x_prev = x
        ax.annotate(f"{size / 1e9:g} GB: {', '.join(names)}", (x, size), ha="left",
                    va="bottom" if top else "top", fontsize=8, color=color,
                    xycoords=("axes fraction", "data"),
                    bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 0.3})


def draw_cp_memory(ax, m: ModelPreset, tokens: int, *, cp_degrees: Sequence[int] = CP_DEGREES,
                   dtype: str = "bf16", cfg_batch: int = 1, highlight_gpu: str | None = None,
                   mark_cp: int | None = None) -> list[dict]:
    """Bytes per GPU vs CP degree for one layer of `m`, against each GPU's HBM; returns rows."""
    cps = [p for p in cp_degrees if p <= tokens]
    rows = [gpu_memory(m, tokens, p, dtype=dtype, cfg_batch=cfg_batch) for p in cps]
    ax.plot(cps, [r["materialised"] for r in rows], "s-", color="C3",
            label="naive attention (every head's scores stored)")
    ax.plot(cps, [r["fused"] for r in rows], "o-", color="C0",
            label="fused attention (weights + one layer's activations)")
    ax.plot(cps, [r["weights"] for r in rows], "--", color="0.5",
            label="weights alone (CP does not split them)")
    if mark_cp in cps:
        r = rows[cps.index(mark_cp)]
        ax.plot([mark_cp] * 2, [r["fused"], r["materialised"]], "o", ms=13, mfc="none",
                color="k")
    hbm_lines(ax, highlight_gpu)
    low = min(r["weights"] for r in rows)
    ax.set_ylim(bottom=low / 1.6)  # room for a labelled tick under the weights floor
    ax.set_xscale("log", base=2)
    ax.set_xticks(cps, [str(p) for p in cps])
    ax.xaxis.set_minor_locator(NullLocator())
    gb_axis(ax)
    ax.set_xlabel("CP degree (GPUs sharing the sequence)")
    ax.set_ylabel(f"bytes per GPU, {dtype}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return rows


def cp_memory_figure(model_id: str, tokens: int, *, cp_degrees: Sequence[int] = CP_DEGREES,
                     dtype: str = "bf16", cfg_batch: int = 1, highlight_gpu: str | None = None,
                     mark_cp: int | None = None, title: str | None = None) -> Figure:
    """Bytes per GPU vs CP degree for one layer of a preset, against each GPU's HBM."""
    m = get_model(model_id)
    fig = Figure(figsize=(7.5, 4), layout="constrained")
    ax = fig.subplots()
    draw_cp_memory(ax, m, tokens, cp_degrees=cp_degrees, dtype=dtype, cfg_batch=cfg_batch,
                   highlight_gpu=highlight_gpu, mark_cp=mark_cp)
    ax.set_title(title or f"{m.name}: {fmt.count(tokens)} tokens, per GPU", fontsize=10)
    return fig
