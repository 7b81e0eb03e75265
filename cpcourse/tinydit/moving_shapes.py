"""Procedural moving shapes: the tiny video model's training data, prompts, and a tracker.

    cpcourse generate --prompt circle-right --nproc 2 --gif /tmp/circle.gif

A clip is `[T, 3, H, W]` floats in [0, 1]: one bright shape (a circle or a square) on a dark
background, moving left, right, up or down at a constant speed. Position, speed, size and
colours vary per clip; the label is the pair (shape, direction), and the prompt id names both
(`circle-right`, `square-up`, ...). Clips are rendered with soft edges (pixel coverage of the
shape), so a sub-pixel move changes the pixels and the model can learn speed.

The size, 8 frames of 32 x 32, is what a 2-core CPU trains in minutes: with 8 x 8 patches a
clip is 8 x 16 = 128 tokens (the model's cost), 8 frames split evenly over 1, 2, 4 and 8
ranks, and a shape of radius 3.5 to 6 pixels still travels 9 to 17 pixels across the clip.

`track(clip)` is how the course measures what the model drew: per frame, threshold the
brightness halfway between background and shape, find the connected blobs, keep the centroid of
the one that is large enough; then fit a line through the centroids. It reports whether one
object is present in each frame, the direction of motion, the speed, and the shape (a square
lights the corners of its bounding box, a circle leaves them dark).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cpcourse.support.errors import did_you_mean, require

SHAPES = ("circle", "square")
DIRECTIONS = ("left", "right", "up", "down")
PROMPTS = tuple(f"{s}-{d}" for s in SHAPES for d in DIRECTIONS)
FRAMES, SIZE = 8, 32
# (dx, dy) per direction, y pointing down the image as rows do
_STEP = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "up": (0.0, -1.0), "down": (0.0, 1.0)}
RADIUS = (3.5, 6.0)       # circle radius, or half the square's side, pixels
SPEED = (1.25, 2.5)       # pixels per frame
MIN_AREA = 8              # pixels: a blob smaller than this is a speck, not an object
STILL = 0.4               # pixels per frame: slower than this is "no motion"
CORNER = 1.3              # (u, v) in the box scaled to [-1, 1]: u^2 + v^2 > this is a corner
SQUARE = 0.3              # a blob lighting more of its corners than this is a square


def parse_prompt(prompt: str) -> tuple[int, int]:
    """`"circle-right"` -> (shape id, direction id); an unknown id lists the valid ones."""
    require(prompt in PROMPTS, f"unknown prompt {prompt!r}: {did_you_mean(prompt, PROMPTS)}use "
            f"one of {', '.join(PROMPTS)}")
    shape, direction = prompt.split("-")
    return SHAPES.index(shape), DIRECTIONS.index(direction)


def prompt_name(shape_id: int, direction_id: int) -> str:
    return f"{SHAPES[shape_id]}-{DIRECTIONS[direction_id]}"


def random_clips(n: int, generator: torch.Generator, frames: int = FRAMES, size: int = SIZE,
                 shape_ids: torch.Tensor | None = None,
                 direction_ids: torch.Tensor | None = None):
    """`n` random clips `[n, T, 3, H, W]` in [0, 1], with their shape and direction ids `[n]`.

    Ids default to uniform draws; everything else (size, speed, start, colours) is always drawn
    from `generator`, so the same generator state gives the same clips.
    """
    n, frames, size = int(n), int(frames), int(size)
    require(n >= 0 and frames >= 2 and size >= 16,
            f"need n >= 0, frames >= 2 and size >= 16, got {n}, {frames}, {size}")
    g = generator
    u = lambda *shape: torch.rand(shape, generator=g, dtype=torch.float64)  # noqa: E731
    if shape_ids is None:
        shape_ids = torch.randint(len(SHAPES), (n,), generator=g)
    if direction_ids is None:
        direction_ids = torch.randint(len(DIRECTIONS), (n,), generator=g)
    radius = RADIUS[0] + (RADIUS[1] - RADIUS[0]) * u(n)
    # slower for long clips, so the path always fits inside the frame
    room = size - 2 * radius - 1
    speed = torch.minimum(SPEED[0] + (SPEED[1] - SPEED[0]) * u(n), room / (frames - 1))
    step = torch.tensor([_STEP[DIRECTIONS[d]] for d in direction_ids.tolist()],
                        dtype=torch.float64).reshape(n, 2) * speed[:, None]
    travel = step * (frames - 1)
    lo = radius[:, None] + 0.5 - torch.clamp(travel, max=0)       # [n, 2]: (x, y)
    hi = size - radius[:, None] - 0.5 - torch.clamp(travel, min=0)
    start = lo + (hi - lo).clamp(min=0) * u(n, 2)
    t = torch.arange(frames, dtype=torch.float64)
    centre = start[:, None] + t[None, :, None] * step[:, None]    # [n, T, 2]
    pix = torch.arange(size, dtype=torch.float64) + 0.5
    dx = pix[None, None, None, :] - centre[..., 0, None, None]    # [n, T, 1, W]
    dy = pix[None, None, :, None] - centre[..., 1, None, None]    # [n, T, H, 1]
    dist = torch.where(shape_ids[:, None, None, None] == SHAPES.index("circle"),
                       torch.sqrt(dx ** 2 + dy ** 2), torch.maximum(dx.abs(), dy.abs()))
    cover = (radius[:, None, None, None] + 0.5 - dist).clamp(0, 1)  # soft edge, one pixel wide
    background = 0.12 * u(n, 3)
    colour = 0.35 + 0.65 * u(n, 3)
    colour = colour / colour.max(dim=1, keepdim=True).values * (0.75 + 0.25 * u(n, 1))
    clip = (background[:, None, :, None, None] + cover[:, :, None]
            * (colour - background)[:, None, :, None, None])
    return clip.float(), shape_ids, direction_ids


def clip_for(prompt: str, seed: int = 0, frames: int = FRAMES, size: int = SIZE) -> torch.Tensor:
    """One training-style clip `[T, 3, H, W]` for a prompt id (what the model should draw)."""
    s, d = parse_prompt(prompt)
    gen = torch.Generator().manual_seed(seed)
    clip, _, _ = random_clips(1, gen, frames, size, torch.tensor([s]), torch.tensor([d]))
    return clip[0]


def _blobs(mask: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean `[H, W]` mask, each as an `[n, 2]` array of (y, x)."""
    seen = np.zeros_like(mask, dtype=bool)
    h, w = mask.shape
    out = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        stack, pts = [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pts.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        out.append(np.array(pts))
    return out


def _corner_fill(ys: np.ndarray, xs: np.ndarray) -> float:
    """How much of its bounding box's corners a blob lights: the corners are the parts of the
    box outside the ellipse inscribed in it. A square fills them (1), a circle leaves them dark
    (0). Holes or texture inside the shape do not matter, which a plain area / box ratio
    would count against a square."""
    y0, x0 = ys.min(), xs.min()
    h, w = np.ptp(ys) + 1, np.ptp(xs) + 1
    gy, gx = np.mgrid[0:h, 0:w]
    u, v = (gx + 0.5 - w / 2) / (w / 2), (gy + 0.5 - h / 2) / (h / 2)
    corner = u ** 2 + v ** 2 > CORNER
    if not corner.any():
        return 0.0
    lit = np.zeros((h, w), dtype=bool)
    lit[ys - y0, xs - x0] = True
    return float(lit[corner].mean())


def track(clip: torch.Tensor) -> dict:
    """What a clip `[T, 3, H, W]` (values in [0, 1]) shows.

    Returns `present` (per frame: exactly one blob of at least MIN_AREA pixels), `centroids`
    (per frame, (x, y) or None), `velocity` (dx, dy) in pixels per frame from a least-squares
    line through the centroids, `direction` (one of DIRECTIONS, or "none" when slower than
    STILL or fewer than 2 frames have an object), `shape` (majority vote over frames: a blob
    that lights over SQUARE of its bounding box's corners is a square), `fill` (the mean corner
    fill: about 0 for a circle, 1 for a square).
    """
    require(isinstance(clip, torch.Tensor) and clip.dim() == 4 and clip.shape[1] == 3,
            f"a clip is [T, 3, H, W], got {getattr(clip, 'shape', type(clip).__name__)}")
    bright = clip.detach().double().amax(dim=1).cpu().numpy()       # [T, H, W]
    present, centroids, fills = [], [], []
    for frame in bright:
        low, high = np.percentile(frame, 50), frame.max()
        blobs = [] if high - low < 0.2 else [
            b for b in _blobs(frame > (low + high) / 2) if len(b) >= MIN_AREA]
        present.append(len(blobs) == 1)
        if len(blobs) == 1:
            ys, xs = blobs[0][:, 0], blobs[0][:, 1]
            centroids.append((float(xs.mean()) + 0.5, float(ys.mean()) + 0.5))
            fills.append(_corner_fill(ys, xs))
        else:
            centroids.append(None)
    t = np.array([i for i, c in enumerate(centroids) if c is not None], dtype=float)
    velocity, direction = (0.0, 0.0), "none"
    if len(t) >= 2:
        pts = np.array([c for c in centroids if c is not None])
        vx, vy = (float(np.polyfit(t, pts[:, k], 1)[0]) for k in (0, 1))
        velocity = (vx, vy)
        if math.hypot(vx, vy) >= STILL:
            direction = (("right" if vx > 0 else "left") if abs(vx) >= abs(vy)
                         else ("down" if vy > 0 else "up"))
    squares = sum(f > SQUARE for f in fills)
    shape = "none" if not fills else ("square" if squares * 2 > len(fills) else "circle")
    return {"present": present, "centroids": centroids, "velocity": velocity,
            "direction": direction, "shape": shape,
            "fill": float(np.mean(fills)) if fills else 0.0}


def matches(prompt: str, report: dict) -> dict:
    """Does a `track` report show what the prompt asked for? Per-criterion booleans."""
    shape, direction = prompt.split("-")
    return {"direction": report["direction"] == direction, "shape": report["shape"] == shape,
            "present_fraction": sum(report["present"]) / len(report["present"])}
