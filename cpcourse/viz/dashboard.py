"""Notebook 00's dashboard: move a slider, see tokens, memory per GPU and ring traffic change.

    python -c "from cpcourse.viz.dashboard import numbers; print(numbers()['video_tokens'])"

`numbers(...)` is the whole calculation as a plain function (used by the dashboard and by tests);
`token_dashboard(...)` wraps it in ipywidgets. The dashboard works without a display: its
figure is rendered to PNG into an `ipywidgets.Image`, so it can be built and driven from a test.
Stable CSS classes for a browser: `cpc-dashboard` (the whole box), `cpc-token-count` (the
headline number, with a `data-tokens` attribute), `cpc-seconds`, `cpc-model`, `cpc-cp`.
"""

from __future__ import annotations

import html
import io
from dataclasses import replace

from matplotlib.figure import Figure

from cpcourse.planner.costs import comm
from cpcourse.planner.hardware import get_gpu, get_link, gpus, links
from cpcourse.planner.tokens import FrameRule, frames_for_clip, get_model, presets
from cpcourse.support.dtypes import nbytes
from cpcourse.support.errors import InputError
from cpcourse.viz import fmt
from cpcourse.viz.tokens import (
    CP_DEGREES,
    VAE,
    Growth,
    draw_cp_memory,
    draw_growth,
    gpu_memory,
    model_vae,
    seed_vaes,
    snap_to_grid,
)

RESOLUTIONS = {
    "model default": (0, 0),
    "480p (480 x 832)": (480, 832),
    "720p (720 x 1280)": (720, 1280),
    "1080p (1080 x 1920)": (1080, 1920),
    "4K (2160 x 3840)": (2160, 3840),
}
TIME_COMPRESSION = {"none": 1, "4x causal": 4, "6x causal": 6, "8x causal": 8}
PATCHES = {"1 x 2 x 2": (1, 2, 2), "1 x 1 x 1": (1, 1, 1), "2 x 2 x 2": (2, 2, 2)}


def manual_vae(vae_temporal: int, vae_spatial: int, patch: tuple[int, int, int]) -> VAE:
    rule = (FrameRule("causal", stride=vae_temporal, step=vae_temporal) if vae_temporal > 1
            else FrameRule("none"))
    return VAE(f"{vae_spatial}x space, {vae_temporal}x time, patch {patch}", vae_spatial, patch,
               rule)


def seconds_for(frames: int, fps: float, rule: FrameRule, step: float = 0.1,
                top: float = 30) -> float:
    """The clip length on a slider grid of `step` that gives `frames` frames (or the closest)."""
    grid = [round(step * i, 6) for i in range(1, int(top / step) + 1)]
    return min(grid, key=lambda s: (abs(frames_for_clip(fps, s, rule) - frames),
                                    abs(s * fps - frames)))


def numbers(model: str = "wan2.1-t2v-14b", resolution: tuple[int, int] | None = None,
            fps: float = 16, seconds: float = 5, cp: int = 8, gpu: str = "h100",
            link: str = "nvlink4", *, manual: tuple[int, int, tuple[int, int, int]] | None = None,
            dtype: str = "bf16") -> dict:
    """Everything the dashboard shows, for a clip of `seconds` at `fps` on `model`.

    `manual` = (vae_temporal, vae_spatial, patch) replaces the model's VAE and patch; the
    transformer (widths, heads, layers, text) stays the model's. Height and width snap to the
    nearest multiple of the pixels per token, frames to the nearest count the VAE accepts.
    """
    m = get_model(model)
    vae = manual_vae(*manual) if manual else model_vae(m)
    px = vae.px_per_token
    h0, w0 = resolution if resolution and all(resolution) else (m.default_height,
                                                                 m.default_width)
    h, w = snap_to_grid(h0, px), snap_to_grid(w0, px)
    wanted = max(1, round(fps * seconds)) + (1 if vae.rule.kind == "causal" else 0)
    frames = frames_for_clip(fps, seconds, vae.rule)
    t = vae.tokens(h, w, frames)
    text = m.text_tokens if m.text_joint else 0
    n = t.video_tokens + text
    if cp > n:
        raise InputError(f"CP degree {cp} is larger than the {n} tokens: pick a smaller CP")
    b = nbytes(dtype)
    mem = gpu_memory(m, n, cp, dtype=dtype, cfg_batch=1)
    g, lk = get_gpu(gpu), get_link(link)
    c = comm(n, cp, m.heads, m.head_dim, dtype=dtype, link=lk.id, gpu=g.id, layers=m.layers,
             cfg_forwards=m.cfg_forwards)
    notes = []
    if (h, w) != (h0, w0):
        notes.append(f"{h0}x{w0} snapped to {h}x{w}: a token covers {px}x{px} pixels")
    if frames != wanted:
        notes.append(f"{wanted} frames snapped to {frames}: this VAE takes {vae.rule.describe()}")
    return {
        "model": m.id, "model_name": m.name, "vae": vae.label, "px_per_token": px,
        "height": h, "width": w, "fps": fps, "seconds": seconds, "frames": frames,
        "frames_wanted": wanted, "latent_frames": t.latent_frames,
        "latent_grid": (t.latent_frames, t.latent_height, t.latent_width),
        "tokens_per_frame": t.tokens_per_frame, "token_frames": t.token_frames,
        "video_tokens": t.video_tokens, "text_tokens": text, "sequence_length": n,
        "attention_matrix_bytes_per_head": n * n * b,
        "qkv_bytes": 3 * n * m.hidden * b,
        "cp": cp, "tokens_per_rank": c["tokens_per_rank"],
        "per_gpu_fused_bytes": mem["fused"], "per_gpu_materialised_bytes": mem["materialised"],
        "weights_bytes": mem["weights"], "gpu": g.id, "hbm_bytes": g.hbm_bytes,
        "fits_fused": mem["fused"] <= g.hbm_bytes,
        "fits_materialised": mem["materialised"] <= g.hbm_bytes,
        "link": lk.id, "link_effective_GBps": lk.effective_gbps,
        "kv_bytes_per_hop": c["kv_bytes_per_hop"], "kv_bytes_per_layer": c["kv_bytes_total"],
        "kv_bytes_per_step": c["kv_bytes_per_forward"], "layers": m.layers,
        "cfg_forwards": m.cfg_forwards,
        "comm_seconds_per_hop": c["comm_seconds_per_hop"],
        "compute_seconds_per_step": c["compute_seconds_per_step"],
        "compute_to_comm_ratio": c["compute_to_comm_ratio"], "hidden": c["hidden"],
        "min_tokens_per_rank_to_hide": c["min_tokens_per_rank_to_hide"],
        "notes": notes, "_vae": vae,
    }


def headline_html(r: dict) -> str:
    """The token count, in an element a browser test can find (`.cpc-token-count`)."""
    text = (f" + {fmt.count(r['text_tokens'])} text" if r["text_tokens"] else "")
    notes = "".join(f"<div style='color:#8a6d00'>note: {html.escape(x)}</div>"
                    for x in r["notes"])
    return (
        "<div style='font-size:15px;margin:6px 0'>"
        f"<b><span class='cpc-token-count' data-tokens='{r['sequence_length']}'>"
        f"{fmt.count(r['sequence_length'])}</span> tokens</b> in each attention call: "
        f"{r['frames']} frames &rarr; {r['token_frames']} token frames &times; "
        f"{fmt.count(r['tokens_per_frame'])} tokens per frame{text}. "
        f"<span style='color:#555'>({html.escape(r['model_name'])}, {r['height']}x"
        f"{r['width']})</span>{notes}</div>")


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><td style='padding-right:10px'>{html.escape(k)}</td>"
                   f"<td style='text-align:right'><b>{html.escape(v)}</b></td></tr>"
                   for k, v in rows)
    return (f"<div style='flex:1;min-width:280px'><div style='font-weight:600'>"
            f"{html.escape(title)}</div><table style='font-size:13px'>{body}</table></div>")


def details_html(r: dict) -> str:
    yes = lambda ok: "yes" if ok else "NO"  # noqa: E731
    memory = _table(f"One layer's memory ({get_gpu(r['gpu']).name})", [
        ("one head's attention matrix", fmt.nbytes(r["attention_matrix_bytes_per_head"])),
        ("Q, K and V of the layer", fmt.nbytes(r["qkv_bytes"])),
        (f"per GPU at CP={r['cp']}, fused attention", fmt.nbytes(r["per_gpu_fused_bytes"])),
        ("  fits?", yes(r["fits_fused"])),
        (f"per GPU at CP={r['cp']}, scores stored", fmt.nbytes(r["per_gpu_materialised_bytes"])),
        ("  fits?", yes(r["fits_materialised"])),
    ])
    if r["cp"] == 1:
        ring = _table("The ring", [("CP=1", "no ring: one GPU holds everything")])
    else:
        ring = _table(f"The ring, CP={r['cp']} over {r['link']}", [
            ("tokens per rank", fmt.count(r["tokens_per_rank"])),
            ("K/V sent per hop", fmt.nbytes(r["kv_bytes_per_hop"])),
            (f"per layer ({r['cp'] - 1} hops)", fmt.nbytes(r["kv_bytes_per_layer"])),
            (f"per step ({r['layers']} layers x {r['cfg_forwards']} fwd)",
             fmt.nbytes(r["kv_bytes_per_step"])),
            ("comm per hop", fmt.seconds(r["comm_seconds_per_hop"])),
            ("compute per ring step", fmt.seconds(r["compute_seconds_per_step"])),
            ("hidden?", f"{yes(r['hidden'])} ({fmt.ratio(r['compute_to_comm_ratio'])})"),
            ("hides from tokens per rank", fmt.count(r["min_tokens_per_rank_to_hide"])),
        ])
    return f"<div style='display:flex;gap:24px;flex-wrap:wrap'>{memory}{ring}</div>"


def figure(r: dict, max_seconds: float = 20) -> Figure:
    """Left: tokens vs clip length (this recipe and the article's); right: bytes per GPU vs CP."""
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax_t, ax_c = fig.subplots(1, 2)
    vaes = [replace(seed_vaes()[0], label="the article's recipe (8x space, no time compression)"),
            replace(r["_vae"], label="this video's recipe")]
    clip = Growth(r["height"], r["width"], r["fps"], max_seconds=max(max_seconds, r["seconds"]),
                  mark_seconds=r["seconds"], text_tokens=r["text_tokens"])
    draw_growth(ax_t, None, clip, vaes, styles=(":", "-"))
    ax_t.set_title("Tokens vs clip length", fontsize=10)
    ax_t.legend(fontsize=8, loc="upper left")
    draw_cp_memory(ax_c, get_model(r["model"]), r["sequence_length"],
                   highlight_gpu=r["gpu"], mark_cp=r["cp"])
    ax_c.set_title(f"Bytes per GPU, {fmt.count(r['sequence_length'])} tokens", fontsize=10)
    return fig


def png(fig: Figure, dpi: int = 80) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


class TokenDashboard:
    """The widgets, their callbacks, and the last computed `numbers` (`.result`)."""

    def __init__(self, model: str = "wan2.1-t2v-14b", fps: int = 16, seconds: float = 5,
                 cp: int = 8, gpu: str = "h100-sxm", link: str = "nvlink4"):
        import ipywidgets as W

        style, wide = {"description_width": "110px"}, W.Layout(width="330px")
        opt = lambda label, **kw: {"description": label, "style": style, "layout": wide, **kw}  # noqa: E731
        self.model = W.Dropdown(options=[(p.name, k) for k, p in presets().items()],
                                value=model, **opt("model"))
        self.own_vae = W.Checkbox(value=True, description="the model's own VAE and patch",
                                  indent=False, layout=W.Layout(width="330px"))
        self.vae_t = W.Dropdown(options=list(TIME_COMPRESSION.items()), value=4,
                                **opt("VAE, time"))
        self.vae_s = W.Dropdown(options=[("8x", 8), ("16x", 16), ("32x", 32)], value=8,
                                **opt("VAE, space"))
        self.patch = W.Dropdown(options=list(PATCHES.items()), value=(1, 2, 2),
                                **opt("patch t x h x w"))
        self.resolution = W.Dropdown(options=list(RESOLUTIONS.items()), value=(0, 0),
                                     **opt("resolution"))
        self.fps = W.IntSlider(value=fps, min=4, max=60, **opt("fps"), continuous_update=False)
        self.seconds = W.FloatSlider(value=seconds, min=0.5, max=30, step=0.1,
                                     readout_format=".1f", **opt("seconds"),
                                     continuous_update=False)
        self.cp = W.SelectionSlider(options=list(CP_DEGREES), value=cp, **opt("CP degree"),
                                    continuous_update=False)
        self.gpu = W.Dropdown(options=[(g.name, k) for k, g in gpus().items()],
                              value=get_gpu(gpu).id, **opt("GPU"))
        self.link = W.Dropdown(options=[(lk.name, k) for k, lk in links().items()],
                               value=get_link(link).id, **opt("ring link"))
        self.headline, self.details = W.HTML(), W.HTML()
        self.plot = W.Image(format="png", layout=W.Layout(width="100%", max_width="1000px"))
        for wid, css in ((self.seconds, "cpc-seconds"), (self.model, "cpc-model"),
                         (self.cp, "cpc-cp"), (self.fps, "cpc-fps")):
            wid.add_class(css)
        col = lambda *ws: W.VBox(list(ws), layout=W.Layout(margin="0 12px 0 0"))  # noqa: E731
        controls = W.HBox([
            col(self.model, self.own_vae, self.vae_t, self.vae_s, self.patch),
            col(self.resolution, self.fps, self.seconds, self.cp, self.gpu, self.link),
        ], layout=W.Layout(flex_flow="row wrap"))
        self.widget = W.VBox([controls, self.headline, self.details, self.plot])
        self.widget.add_class("cpc-dashboard")
        self.result: dict = {}
        self.error: str | None = None
        self._quiet = False
        self.model.observe(self._model_changed, names="value")
        for wid in ( self.own_vae, self.vae_t, self.vae_s, self.patch,
                    self.resolution, self.fps, self.seconds, self.cp, self.gpu, self.link):
            wid.observe(self.refresh, names="value")
        self.refresh()

    def inputs(self) -> dict:
        manual = None if self.own_vae.value else (self.vae_t.value, self.vae_s.value,
                                                  tuple(self.patch.value))
        return {"model": self.model.value, "resolution": self.resolution.value,
                "fps": self.fps.value, "seconds": self.seconds.value, "cp": self.cp.value,
                "gpu": self.gpu.value, "link": self.link.value, "manual": manual}

    def _model_changed(self, change) -> None:
        """A new model starts at its own default clip (fps and length that give its frames)."""
        m = get_model(change["new"])
        self._quiet = True
        try:
            with self.widget.hold_sync():
                if m.default_fps:
                    self.fps.value = int(round(m.default_fps))
                self.seconds.value = seconds_for(m.default_frames, self.fps.value, m.rule,
                                                 self.seconds.step, self.seconds.max)
        finally:
            self._quiet = False
        self.refresh()

    def refresh(self, _change=None) -> None:
        if self._quiet:
            return
        for wid in (self.vae_t, self.vae_s, self.patch):
            wid.disabled = self.own_vae.value
        try:
            r = numbers(**self.inputs())
        except InputError as exc:  # say what to change instead of a traceback in a callback
            self.error = str(exc)
            self.headline.value = (f"<div style='color:#b00020'>cannot compute: "
                                   f"{html.escape(str(exc))}</div>")
            return
        self.error, self.result = None, r
        self.headline.value = headline_html(r)
        self.details.value = details_html(r)
        self.plot.value = png(figure(r))

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def token_dashboard(**initial) -> TokenDashboard:
    """Build the dashboard (no display needed); show it by making it a cell's last value."""
    return TokenDashboard(**initial)
