"""Clips as pictures: animated GIFs, HTML animations for a notebook, frame strips.

    cpcourse generate --prompt square-up --gif /tmp/square.gif

A clip is `[T, 3, H, W]` in [0, 1] (what `cpcourse generate` saves). Pixels are scaled up by
whole numbers with no smoothing, so a 32 x 32 clip shows its real pixels, only larger.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
from matplotlib.figure import Figure

from cpcourse.support.errors import require


def _frames_uint8(clip: torch.Tensor, scale: int) -> np.ndarray:
    require(isinstance(clip, torch.Tensor) and clip.dim() == 4 and clip.shape[1] == 3,
            f"a clip is [T, 3, H, W], got {getattr(clip, 'shape', type(clip).__name__)}")
    arr = (clip.detach().double().clamp(0, 1) * 255).round().to(torch.uint8)
    arr = arr.permute(0, 2, 3, 1).cpu().numpy()                  # [T, H, W, 3]
    return arr.repeat(scale, axis=1).repeat(scale, axis=2)


def gif_bytes(clip: torch.Tensor, scale: int = 4, fps: float = 4.0) -> bytes:
    """An animated GIF (looping) of the clip, as bytes."""
    from PIL import Image

    frames = [Image.fromarray(f) for f in _frames_uint8(clip, scale)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:],
                   duration=int(1000 / fps), loop=0)
    return buf.getvalue()


def save_gif(clip: torch.Tensor, path: str, scale: int = 4, fps: float = 4.0,
             name: str | None = None) -> None:
    """Write the clip as a GIF at `path`; a failure to write is an InputError naming `name`
    (the flag or parameter that gave the path), else the path alone."""
    from cpcourse.support.out_files import replacing

    data = gif_bytes(clip, scale, fps)
    with replacing(path, name) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def clips_html(clips: dict[str, torch.Tensor], scale: int = 4, fps: float = 4.0) -> str:
    """HTML that plays each clip as a looping GIF, side by side, each titled by its key
    (embedded as data: no file, no external player)."""
    cells = []
    for title, clip in clips.items():
        b64 = base64.b64encode(gif_bytes(clip, scale, fps)).decode()
        cells.append(f'<figure style="display:inline-block;margin:0 12px 0 0;text-align:center">'
                     f'<img src="data:image/gif;base64,{b64}" style="image-rendering:pixelated">'
                     f'<figcaption style="font-size:12px">{title}</figcaption></figure>')
    return "<div>" + "".join(cells) + "</div>"


def strip_figure(rows: dict[str, torch.Tensor], title: str = "") -> Figure:
    """One row of frames per clip: `rows` maps a row label to a clip `[T, 3, H, W]`
    (a difference image can be passed scaled into [0, 1])."""
    t = max(c.shape[0] for c in rows.values())
    fig = Figure(figsize=(1.1 * t, 1.2 * len(rows) + 0.3))
    axes = np.array(fig.subplots(len(rows), t, squeeze=False))
    for r, (label, clip) in enumerate(rows.items()):
        frames = _frames_uint8(clip, 1)
        for i in range(t):
            ax = axes[r, i]
            ax.set_xticks([])
            ax.set_yticks([])
            if i < len(frames):
                ax.imshow(frames[i], interpolation="nearest")
            if i == 0:
                ax.set_ylabel(label, fontsize=8)
            if r == 0:
                ax.set_title(f"t={i}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
