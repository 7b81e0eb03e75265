"""Long videos: co-denoise overlapping temporal windows, blend them, and parallelise it two ways.

    cpcourse generate --prompt circle-right --frames 32 --window 8 --stride 4 --nproc 2 --json

A model trained on W frames (the shapes model: 8) makes a longer video by denoising windows of W
frames that overlap: at EVERY step each window predicts its frames, and a frame covered by
several windows takes the weighted mean of their predictions (MultiDiffusion / Gen-L-Video).
Overlaps must agree step after step, which is what ties the windows into one video; cutting the
video into separate clips (stride = W) leaves seams. The work grows with the number of windows
(linear in the length), and the attention inside a window stays W frames long, so the working
memory is flat in the length: only the latent video itself (a few KB per frame) grows.

Schedule: windows start at 0, S, 2S, ... and a last one ends on the last frame (`window_starts`).
Weights per window: "flat" (all 1) or "pyramid" (1, 2, ..., peak, ..., 2, 1: a window's edge
frames, which see the least context, count least); normalised so every frame's weights sum to 1
(`frame_weights`). `noise="freenoise"` reuses the first window's noise, shuffled, for later
frames (FreeNoise's rescheduling), so windows start from correlated noise.
Parallel: "windows" gives each rank whole windows and sums the blended predictions with one
all-reduce per step; "cp" runs every window on all ranks under CP (its frames split, as in
`cpcourse.tinydit.model`) and all-gathers the window's prediction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpcourse.support.bytecount import count_bytes
from cpcourse.support.errors import finite_float, positive_int, require, seed_int
from cpcourse.support.groups import tracked
from cpcourse.support.shards import shard_offsets, shard_sizes
from cpcourse.tinydit.model import CPContext, patchify, unpatchify
from cpcourse.tinydit.sampling import class_labels, initial_noise
from cpcourse.video import gather_frames

BLENDS = ("flat", "pyramid")
PARALLEL = ("windows", "cp")
NOISES = ("independent", "freenoise")
STATE_COPIES = 2  # the sampler holds the latent video twice: x and the blended prediction


MAX_FRAMES = 1 << 16  # a long video's frames: past this, the weights alone fill memory


def window_starts(frames: int, window: int, stride: int) -> list[int]:
    """First frame of every window: 0, stride, 2 * stride, ..., and frames - window at the end.

    Every frame is covered; consecutive windows overlap by window - stride frames (the last
    pair may overlap more). A window longer than the video, or a stride longer than the window
    (frames between windows no one covers), is refused with the choices that work.
    """
    for name, n in (("frames", frames), ("window", window), ("stride", stride)):
        require(isinstance(n, int) and not isinstance(n, bool) and n >= 1,
                f"{name} must be a whole number >= 1, got {n!r}")
    require(frames <= MAX_FRAMES, f"frames {frames}: use at most {MAX_FRAMES}")
    require(window <= frames, f"a window of {window} frames is longer than the {frames}-frame "
            f"video: use a window of 1 .. {frames} frames (or a longer video)")
    require(stride <= window, f"a stride of {stride} frames after a {window}-frame window leaves"
            f" {stride - window} frame(s) between windows uncovered: use a stride of 1 .. "
            f"{window}")
    starts = list(range(0, frames - window + 1, stride))
    if starts[-1] + window < frames:
        starts.append(frames - window)
    return starts


def blend_weights(window: int, blend: str = "pyramid") -> torch.Tensor:
    """One window's weights over its frames `[W]` (float64) before normalising."""
    require(blend in BLENDS, f"blend must be one of {BLENDS}, got {blend!r}")
    window = positive_int("window", window)
    require(window <= MAX_FRAMES, f"window {window}: use at most {MAX_FRAMES} frames")
    i = torch.arange(window, dtype=torch.float64)
    return torch.ones(window, dtype=torch.float64) if blend == "flat" else torch.minimum(
        i + 1, window - i)


def frame_weights(frames: int, starts: list[int], window: int, blend: str = "pyramid"):
    """`[K, frames]` float64: window k's weight on each frame, 0 outside it; columns sum to 1.

    Every window must lie inside the video and every frame be covered by one (as
    `window_starts` makes them): an uncovered frame would have no prediction to take.
    """
    frames, window = positive_int("frames", frames), positive_int("window", window)
    require(frames <= MAX_FRAMES, f"frames {frames}: use at most {MAX_FRAMES}")
    require(window <= frames, f"a window of {window} frames is longer than the {frames}-frame "
            "video")
    require(len(starts) > 0, "starts is empty: give at least one window start "
            "(window_starts makes them)")
    for s in starts:
        require(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= frames - window,
                f"window start {s!r} is outside the video: starts must be whole numbers in "
                f"[0, {frames - window}]")
    w = torch.zeros(len(starts), frames, dtype=torch.float64)
    for k, s in enumerate(starts):
        w[k, s:s + window] = blend_weights(window, blend)
    cover = w.sum(dim=0, keepdim=True)
    gaps = (cover[0] == 0).nonzero().flatten().tolist()
    require(not gaps, f"frames {gaps[:8]} are in no window: add window starts that cover them "
            "(window_starts covers every frame)")
    return w / cover


def reschedule_noise(noise: torch.Tensor, window: int, stride: int, seed: int) -> torch.Tensor:
    """FreeNoise-style: frames from `window` on reuse earlier frames' noise, shuffled.

    Each block of `stride` frames starting at f >= window copies a seeded permutation of the
    frames window frames earlier, so every window starts from the same handful of noise frames
    in a different order. `noise` `[B, C, T, H, W]` -> a new tensor of the same shape.
    """
    require(noise.dim() == 5, f"noise must be [B, C, T, H, W], got shape {tuple(noise.shape)}")
    window, stride = positive_int("window", window), positive_int("stride", stride)
    seed = seed_int("seed", seed)
    out = noise.clone()
    gen = torch.Generator().manual_seed(seed + 104729)
    for f in range(window, noise.shape[2], stride):
        n = min(stride, noise.shape[2] - f)
        src = torch.arange(f - window, f - window + n)
        out[:, :, f:f + n] = out[:, :, src[torch.randperm(n, generator=gen)]]
    return out


def _guided(model, x, y, t: float, cfg_scale: float, ctx: CPContext) -> torch.Tensor:
    """The guided prediction for latent frames x `[B, C, T_w, Hl, Wl]` (same shape)."""
    cfg = model.cfg
    tok = patchify(x, cfg.patch)  # [B, T_w, S, C*p*p]
    # the conditional and unconditional halves in one batch: [2B, T_w, S, C*p*p]
    out = model(torch.cat([tok, tok]), torch.full((2 * x.shape[0],), t, dtype=x.dtype), y, ctx)
    cond, uncond = out.chunk(2)  # [B, T_w, S, C*p*p] each
    return unpatchify(uncond + cfg_scale * (cond - uncond), x.shape[1], cfg.patch, ctx.grid)


@dataclass(frozen=True)
class WindowPlan:
    """What one rank does in every step of `sample_windows`: the windows' first frames
    (`starts`), the ones it predicts (`mine`), the blend `weights` `[n_windows, T]`, the window
    length, where its frames start inside a window (`frame_offset`) and how many it holds
    (`frames_held`), the mode (`parallel`: windows or cp) and its process group and world size."""

    starts: list[int]
    mine: list[int]
    weights: torch.Tensor
    window: int
    frame_offset: int
    frames_held: int
    parallel: str
    group: object
    world: int


@dataclass(frozen=True)
class WindowSampling:
    """How `sample_windows` samples a long video: `steps` Euler steps at guidance `cfg_scale`,
    windows of `window` frames starting every `stride` frames, blended `blend` (flat or
    pyramid), spread over the ranks by `parallel` (windows or cp). Checked where it is used.
    `cpcourse.runs.long_video.LongVideoRequest` has these same attributes, so a rank passes
    the Request itself."""

    steps: int = 12
    cfg_scale: float = 4.0
    window: int = 8
    stride: int = 4
    blend: str = "pyramid"
    parallel: str = "windows"


@torch.no_grad()
def sample_windows(model, noise: torch.Tensor, label,
                   sampling: WindowSampling = WindowSampling(), group=None,
                   stats: dict | None = None, measure: bool = False) -> torch.Tensor:
    """Denoise a whole video `[B, C, T, Hl, Wl]` window by window; returns the sample.

    `sampling`: the steps, guidance, window geometry and parallel mode (`WindowSampling`, or
    any object with those attributes, such as a `LongVideoRequest`). With one window (window
    = T) it is the plain sampler (`cpcourse.tinydit.sampling.sample`), bit for bit. Each
    window is a clip of its own: positions start at 0 in every window. `group` None: one
    process. `stats`, when given, receives the schedule, per-step seconds and the bytes this
    rank sent in step 0, measured (`bytes_per_step`, `bytes_by_op`: the ring inside attention
    under "cp", the all-reduce under "windows"); with `measure`, also the peak working memory
    of one window's forward (`window_peak_bytes`, measured once, which slows that forward).
    """
    steps, cfg_scale, parallel = sampling.steps, sampling.cfg_scale, sampling.parallel
    window, stride, blend = sampling.window, sampling.stride, sampling.blend
    require(parallel in PARALLEL, f"parallel must be one of {PARALLEL}, got {parallel!r}")
    steps, cfg_scale = positive_int("steps", steps), finite_float("cfg_scale", cfg_scale)
    require(noise.dim() == 5, f"noise must be [B, C, T, Hl, Wl], got shape {tuple(noise.shape)}")
    cfg = model.cfg
    b, c, frames, hl, wl = noise.shape
    grid = (hl // cfg.patch, wl // cfg.patch)
    starts = window_starts(frames, window, stride)
    weights = frame_weights(frames, starts, window, blend).to(noise.dtype)  # [K, T], K windows
    rank, world = (0, 1) if group is None and not dist.is_initialized() else (
        dist.get_rank(group), dist.get_world_size(group))
    if parallel == "windows":  # whole windows per rank, contiguous runs (tensor_split order)
        per_rank = shard_sizes(len(starts), world)
        first = shard_offsets(per_rank)[rank]
        mine, w_sizes, w_rank = list(range(first, first + per_rank[rank])), [window], 0
    else:
        mine, w_sizes = list(range(len(starts))), shard_sizes(window, world)
        w_rank = rank
        require(min(w_sizes) >= 1, f"CP inside a {window}-frame window needs at most {window} "
                f"ranks, got {world}: use parallel=windows, or fewer ranks")
    f_off = shard_offsets(w_sizes)[w_rank]
    ctx = CPContext(group=group if world > 1 and parallel == "cp" else None, frame_offset=f_off,
                    grid=grid)
    y = class_labels(cfg, label, b)
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    x = noise.clone()
    record = stats if stats is not None else {}
    plan = WindowPlan(starts, mine, weights, window, f_off, w_sizes[w_rank], parallel, group, world)
    record.update(windows=len(starts), starts=starts, my_windows=mine, step_seconds=[],
                  bytes_per_step=0, bytes_by_op={}, window_peak_bytes=0)
    for i in range(steps):
        t0, t = time.perf_counter(), float(times[i])
        with count_bytes() as sent:  # cheap: a wrapper around each collective call
            x0 = _step(model, x, y, t, cfg_scale, ctx, plan, record if measure and i == 0 else None)
        if i == 0:
            record.update(bytes_per_step=sent.total, bytes_by_op=dict(sent.by_op))
        # x <- x + dt * v in place, v = (x - x0) / t for an x0-predicting model: the video is
        # held twice (x and the blend), never more, and the bits equal the plain sampler's
        if cfg.prediction == "sample":
            torch.sub(x, x0, out=x0)
            x0.div_(t)
        x.add_(x0.mul_(float(times[i + 1] - times[i])))
        record["step_seconds"].append(time.perf_counter() - t0)
    return x


def _step(model, x, y, t, cfg_scale, ctx, plan: WindowPlan, record) -> torch.Tensor:
    """One step's blended prediction over the whole video (summed over ranks)."""
    from cpcourse.support.peak_memory import peak_memory

    starts, mine, weights, window = plan.starts, plan.mine, plan.weights, plan.window
    f_off, n_mine, group = plan.frame_offset, plan.frames_held, plan.group

    x0 = torch.zeros_like(x)
    for k in mine:
        s = starts[k]
        # [B, C, W_r, Hl, Wl]: this rank's frames of window k (W_r = W, or W/P under cp)
        xw = x[:, :, s + f_off:s + f_off + n_mine]
        if record is not None and k == mine[0]:  # the working memory of one window's forward
            pred, peak = peak_memory(_guided, model, xw, y, t, cfg_scale, ctx)
            record["window_peak_bytes"] = int(peak)
        else:
            pred = _guided(model, xw, y, t, cfg_scale, ctx)
        if ctx.group is not None:  # every rank needs the whole window's prediction
            pred = gather_frames(pred, group)  # [B, C, W/P, Hl, Wl] -> [B, C, W, Hl, Wl]
        # window k's weights [W] -> [1, 1, W, 1, 1], broadcast over pred [B, C, W, Hl, Wl]
        x0[:, :, s:s + window] += weights[k, s:s + window].view(1, 1, -1, 1, 1) * pred
    if plan.parallel == "windows" and plan.world > 1:
        with tracked("all_reduce (window predictions)", group=group):
            dist.all_reduce(x0, group=group)
    return x0


def seam_metric(clip: torch.Tensor, boundaries: list[int]) -> dict:
    """How much a clip `[T, 3, H, W]` changes across window boundaries vs inside windows.

    d_f = mean |frame f+1 - frame f|. A boundary b is a frame where a window ends (b = start +
    W < T): the pair (b - 1, b). Returns seam (mean d over boundary pairs), inside (mean over
    the other pairs) and ratio = seam / inside: about 1 when the windows join without a seam.
    """
    d = (clip[1:] - clip[:-1]).abs().flatten(1).mean(dim=1).double()
    at = sorted({b - 1 for b in boundaries if 0 < b < clip.shape[0]})
    inside = [f for f in range(d.shape[0]) if f not in at]
    seam = float(d[at].mean()) if at else None
    rest = float(d[inside].mean()) if inside else None
    return {"seam": seam, "inside": rest, "ratio": seam / rest if at and inside else None,
            "boundaries": [f + 1 for f in at]}


def boundaries(frames: int, window: int, stride: int) -> list[int]:
    """Frames where a window ends inside the video (what `seam_metric` looks at)."""
    return [s + window for s in window_starts(frames, window, stride) if s + window < frames]


def windows_rank(req) -> dict:
    """What each rank of `cpcourse generate --window` runs: the sample, memory, times, bytes.
    `req`: a `cpcourse.runs.long_video.LongVideoRequest` (its fields are read here)."""
    from cpcourse.support.dtypes import torch_dtype
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.sampling import spec_model

    model = spec_model(req)
    noise = initial_noise(tuple(req.shape), req.seed, torch_dtype(req.dtype))  # [1, C, T, Hl, Wl]
    if req.noise == "freenoise":
        noise = reschedule_noise(noise, req.window, req.stride, req.seed)
    stats: dict = {}
    group = dist.group.WORLD if dist.is_initialized() else None
    # the Request has WindowSampling's attributes (steps .. parallel): it is the sampling;
    # out: the whole video [1, C, T, Hl, Wl] on every rank
    out, peak = peak_memory(sample_windows, model, noise, req.cond, req, group, stats, True)
    return {"latents": out, "peak_bytes": int(peak), **stats,
            "state_bytes": STATE_COPIES * noise.numel() * noise.element_size()}
