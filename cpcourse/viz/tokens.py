"""Figures for notebook 00: how many tokens a video makes, and what that costs per GPU.

    python -m cpcourse.viz.tokens artifacts   # writes tokens_growth.png and cp_memory.png

Thin compositions of the calculators (`cpcourse.planner.tokens`, `cpcourse.planner.costs`,
`cpcourse.planner.hardware`); every number drawn comes from them. Figures are
`matplotlib.figure.Figure` objects built without pyplot, so nothing is shown twice in a notebook
and nothing leaks when a dashboard redraws.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from cpcourse.planner.costs import planned_shard_sizes
from cpcourse.planner.facts import facts
from cpcourse.planner.tokens import (
    FrameRule,
    ModelPreset,
    frames_for_clip,
    hunyuan_split_axis,
    model_tokens,
    presets,
    video_tokens,
)
from cpcourse.support.dtypes import nbytes
from cpcourse.viz import fmt
from cpcourse.viz.cp_memory import (  # noqa: F401 (re-exported: notebook 00 reads them here)
    CP_DEGREES,
    cp_memory_figure,
    draw_cp_memory,
    gb_axis,
    gpu_memory,
    hbm_lines,
)


@dataclass(frozen=True)
class VAE:
    """A VAE + patchify recipe: what turns pixels into tokens (no transformer attached)."""

    label: str
    vae_spatial: int = 8
    patch: tuple[int, int, int] = (1, 2, 2)
    rule: FrameRule = FrameRule("none")

    @property
    def px_per_token(self) -> int:
        return self.vae_spatial * self.patch[1]

    def tokens(self, height: int, width: int, frames: int):
        return video_tokens(height, width, frames, vae_spatial=self.vae_spatial,
                            patch=self.patch, rule=self.rule)


def seed_vaes() -> list[VAE]:
    """The seed article's recipe (no time compression) next to the causal VAEs real models use."""
    return [
        VAE("8x space, no time compression (the article)"),
        VAE("8x space, 4x causal time (Wan, HunyuanVideo, CogVideoX)",
            rule=FrameRule("causal", stride=4, step=4)),
        VAE("8x space, 8x causal time (Cosmos-1.0)",
            rule=FrameRule("causal", stride=8, step=8)),
        # LTX-Video compresses 32x in space and patchifies 1x1: 32 px per token, not 16
        VAE("32x space, 8x causal time, 1x1 patch (LTX-Video)", vae_spatial=32,
            patch=(1, 1, 1), rule=FrameRule("causal", stride=8, step=8)),
    ]


def model_vae(m: ModelPreset) -> VAE:
    return VAE(m.name, m.vae_spatial, m.patch, m.rule)


def snap_to_grid(size: int, px: int) -> int:
    """The multiple of `px` nearest to `size` (at least `px`): 720 at 32 px -> 704."""
    return max(px, round(size / px) * px)


def short_parallel(text: str, axis: str | None = None) -> str:
    """The official multi-GPU recipe in a few words, read from the facts sheet's description;
    `axis` when computed from the model's own rule (a keyword would name its first branch)."""
    t = text.lower()
    if t.startswith("none") or "none in official" in t:
        return "none (single GPU)"
    if "usp" in t or ("ulysses" in t and "ring" in t and "no ring" not in t):
        algo = "Ulysses x ring (USP)"
    elif "p2p" in t or "ring_attn" in t or "te p2p" in t:
        algo = "ring"
    elif re.search(r"ulysses|a2a|all_to_all", t):
        algo = "Ulysses all-to-all"
    else:
        algo = "TP only"
    axis = axis or next((a for key, a in (("split along t", "time"), ("t-split", "time"),
                                          ("temporal axis", "time"),
                                          ("spatial axis", "space")) if key in t), None)
    extras = [x for key, x in (("fsdp", "FSDP"), ("cfg", "CFG-parallel"), ("tensor_par", "TP"))
              if key in t]
    return algo + (f", split over {axis}" if axis else "") + "".join(f" + {x}" for x in extras)


def _split_axis(m, world: int) -> str | None:
    """The axis HunyuanVideo's rule (`hunyuan_split_axis`) splits at its default size."""
    if not m.split_rule or "height or else width" not in m.split_rule[0]:
        return None
    axis = hunyuan_split_axis(m.default_height, m.default_width, world)
    return f"{axis} at {world} GPUs" if axis else "refused at this size"


def _default_video(m) -> str:
    """A preset's default video, with the facts sheet's `default_note` where it has one."""
    fps = f" @ {m.default_fps:g} fps" if m.default_fps else ""
    note = next((f.get("default_note") for f in facts()["models"] if f["id"] == m.id), None)
    return (f"{m.default_height}x{m.default_width}, {m.default_frames} f{fps}"
            + (f" ({note})" if note else ""))


def model_rows(dtype: str = "bf16") -> list[dict]:
    """One row per preset at its default video: tokens, attention memory, Q/K/V, parallelism."""
    b = nbytes(dtype)
    rows = []
    for m in presets().values():
        t = model_tokens(m.id)
        n = t.sequence_length
        rows.append({
            "model": m.name, "id": m.id,
            "default video": _default_video(m),
            "latent grid": f"{t.latent_frames}x{t.latent_height}x{t.latent_width}",
            "video tokens": fmt.count(t.video_tokens),
            "sequence": fmt.count(n) + (" (+text)" if m.text_joint else ""),
            "attention / head": fmt.gb(n * n * b),
            "Q/K/V / layer": fmt.gb(3 * n * m.hidden * b),
            "forwards / step": m.cfg_forwards,
            "attention": "factored" if m.factored else "full 3D",
            "official multi-GPU": short_parallel(m.parallel, _split_axis(m, 8)),
            "parallel_full": m.parallel,
            "_tokens": n,
        })
    return rows


@dataclass(frozen=True)
class Growth:
    """The clip `draw_growth` grows: its size and frame rate, the lengths drawn (0.5 s steps up
    to `max_seconds`, a dot at `mark_seconds`), the score matrix's dtype and the text tokens
    that join the sequence."""

    height: int
    width: int
    fps: float
    max_seconds: float = 20
    mark_seconds: float | None = None
    dtype: str = "bf16"
    text_tokens: int = 0


def draw_growth(ax_t, ax_m, clip: Growth, vaes: Sequence[VAE],
                styles: Sequence[str] = ()) -> None:
    """Tokens (on `ax_t`) and one head's score matrix (on `ax_m`, if given) vs clip length."""
    height, width, fps, mark_seconds = clip.height, clip.width, clip.fps, clip.mark_seconds
    b, dtype, text_tokens = nbytes(clip.dtype), clip.dtype, clip.text_tokens
    secs = [0.5 * i for i in range(1, int(clip.max_seconds * 2) + 1)]
    for i, v in enumerate(vaes):
        h, w = snap_to_grid(height, v.px_per_token), snap_to_grid(width, v.px_per_token)
        n = [v.tokens(h, w, frames_for_clip(fps, s, v.rule)).video_tokens + text_tokens
             for s in secs]
        color, ls = f"C{i}", (styles[i] if i < len(styles) else "-")
        ax_t.plot(secs, n, ls, color=color, label=v.label)
        if ax_m is not None:
            ax_m.plot(secs, [x * x * b for x in n], ls, color=color)
        if mark_seconds is not None:
            k = min(range(len(secs)), key=lambda j: abs(secs[j] - mark_seconds))
            ax_t.plot(secs[k], n[k], "o", color=color)
            ax_t.annotate(fmt.count(n[k]), (secs[k], n[k]), textcoords="offset points",
                          xytext=(6, -10), fontsize=8, color=color)
            if ax_m is not None:
                ax_m.plot(secs[k], n[k] ** 2 * b, "o", color=color)
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt.sci(v)))
    ax_t.set_ylabel("tokens in the attention sequence")
    for ax in (ax_t, ax_m):
        if ax is not None:
            ax.set_xlabel(f"clip length (s) at {fps:g} fps, {height}x{width}")
            ax.grid(True, which="major", alpha=0.3)
    if ax_m is not None:
        gb_axis(ax_m)
        hbm_lines(ax_m)
        ax_m.set_ylabel(f"one head's score matrix, {dtype}")


def growth_figure(height: int = 720, width: int = 1280, fps: float = 24, *,
                  vaes: Sequence[VAE] | None = None, max_seconds: float = 20,
                  mark_seconds: float | None = 5, dtype: str = "bf16") -> Figure:
    """Left: tokens vs clip length; right: one head's attention matrix (if stored) vs length."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_t, ax_m = fig.subplots(1, 2)
    draw_growth(ax_t, ax_m, Growth(height, width, fps, max_seconds, mark_seconds, dtype),
                list(vaes or seed_vaes()))
    ax_t.set_title("Tokens grow linearly with the clip")
    ax_m.set_title("One head's attention matrix grows with the square")
    ax_t.legend(fontsize=8, loc="upper left")
    return fig


def tokens_per_rank(tokens: int, cp: int) -> int:
    """The largest shard: the rank that sets the pace."""
    return max(planned_shard_sizes(tokens, cp))


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    growth_figure().savefig(out / "tokens_growth.png", dpi=100)
    t = model_tokens("hunyuanvideo-13b").sequence_length
    cp_memory_figure("hunyuanvideo-13b", t).savefig(out / "cp_memory.png", dpi=100)
    print(f"wrote {out / 'tokens_growth.png'} and {out / 'cp_memory.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
