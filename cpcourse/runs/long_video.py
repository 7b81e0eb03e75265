"""A video longer than the model's window, sampled on P ranks: the runner of `generate --window`.

    cpcourse generate --frames 32 --window 8 --stride 4 --nproc 2 --compare --json

`run(LongVideoRequest(window=8, nproc=2))`: the Request is the run's parameters, declared once
(the window flags of `cpcourse generate` are its fields) and checked when made; `rank(req)`
runs the windowed sampler on every rank (`cpcourse.tinydit.windows.windows_rank`: whole windows
per rank, or each window under CP) reading the Request's fields; the report gives the schedule,
the bytes each rank sends per step, the peak working memory of one window's forward beside the
whole run's peak and the latent state, and the seam metric; `compare` also samples in this
process. `run_long(nproc, seed, **fields)` is the same in one call; `print_report` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpcourse.support.errors import guidance_scale, positive_float, positive_int, require
from cpcourse.support.request import check_common, flag, set_derived
from cpcourse.support.tolerance import describe
from cpcourse.tinydit.sampling import DTYPES
from cpcourse.tinydit.windows import (
    BLENDS,
    NOISES,
    PARALLEL,
    boundaries,
    seam_metric,
    window_starts,
    windows_rank,
)

MAX_FRAMES = 512


def _derived():
    return field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class LongVideoRequest:
    """One long video, checked: the fields are `cpcourse generate --window`'s flags (those
    it shares with one clip, `prompt` to `timeout`, are spelled by GenerateRequest). None
    takes the default when made: `frames` 4 x window, `stride` window / 2, the weights' size
    and steps. Derived: `path` the weights file (None: the seeded random DiT), `cfg` its
    DiTConfig, `shape` the latents' [1, C, T, Hl, Wl], `starts` the first frame of each
    window, `cond` the prompt's (shape, direction) ids or the random model's label."""

    prompt: str | None = flag(None, "what the trained model draws")
    weights: str = flag("shipped", "shipped, a file from `cpcourse train`, or random")
    nproc: int = flag(2, "ranks")
    seed: int = flag(0, "noise seed")
    frames: int | None = flag(None, "frames T (default 4 x window)")
    height: int | None = flag(None, "height (the weights')")
    width: int | None = flag(None, "width (the weights')")
    window: int = flag(8, "long video: denoise overlapping windows of W frames and blend them",
                       acts="plain")
    stride: int | None = flag(None, "frames between window starts (default W / 2)",
                              acts="windows")
    blend: str = flag("pyramid", "how overlapping windows are weighed", choices=BLENDS,
                      acts="windows")
    noise: str = flag("independent", "each window's own noise, or FreeNoise's reshuffled "
                      "copies", choices=NOISES, acts="windows")
    parallel: str = flag("windows", "whole windows per rank (windows), or each window under "
                         "CP (cp)", choices=PARALLEL, acts="windows")
    steps: int | None = flag(None, "Euler steps (the weights')")
    cfg_scale: float = flag(4.0, "guidance scale")
    label: int | None = flag(None, "class id for weights=random (default 3)")
    dtype: str = flag("fp32", "what sampling runs in", choices=sorted(DTYPES))
    compare: bool = flag(False, "also sample in this process")
    timeout: float = flag(300.0, "seconds the ranks may run")
    weight_seed: int = flag(0, "the random DiT's weights", cli=False)
    path: str | None = _derived()
    cfg: object = _derived()
    shape: tuple = _derived()
    starts: list = _derived()
    cond: object = _derived()

    def __post_init__(self):
        from cpcourse.runs.generate import check_frame_size
        from cpcourse.tinydit.training import RANDOM_DEFAULTS, TRAINED_DEFAULTS, weights_config

        check_common(self)
        window = positive_int("window", self.window)
        set_derived(self, frames=4 * window if self.frames is None else self.frames,
                  stride=max(1, window // 2) if self.stride is None else self.stride)
        frames = positive_int("frames", self.frames)
        require(frames <= MAX_FRAMES, f"frames {frames}: use at most {MAX_FRAMES}")
        starts = window_starts(frames, window, positive_int("stride", self.stride))
        set_derived(self, starts=starts, cfg_scale=guidance_scale("cfg_scale", self.cfg_scale))
        positive_float("timeout", self.timeout, high=3600)
        if self.parallel == "windows":
            require(self.nproc <= len(starts), f"parallel=windows gives each rank whole "
                    f"windows, and there are {len(starts)}: use nproc={len(starts)} or fewer, "
                    "or parallel=cp")
        else:
            require(self.nproc <= window, f"parallel=cp splits each {window}-frame window over "
                    f"the ranks: use nproc={window} or fewer, or parallel=windows")
        path, trained_cfg = weights_config(self.weights)
        defaults = TRAINED_DEFAULTS if path is not None else RANDOM_DEFAULTS
        set_derived(self, path=path, **{k: defaults[k] for k in ("height", "width", "steps")
                                if getattr(self, k) is None})
        require(positive_int("steps", self.steps) <= 1000, f"steps {self.steps}: use at most "
                "1000")
        self._model_and_condition(trained_cfg, defaults)
        check_frame_size(self.cfg, self.height, self.width)
        set_derived(self, shape=(1, self.cfg.in_channels, frames, self.height, self.width))

    def _model_and_condition(self, trained_cfg, defaults: dict) -> None:
        """The trained weights take `prompt`, the random DiT `label`."""
        from cpcourse.tinydit.model import DiTConfig
        from cpcourse.tinydit.moving_shapes import PROMPTS, parse_prompt

        if self.path is not None:
            prompt = self.prompt or PROMPTS[1]
            require(self.label is None, "label conditions the random model; the trained one "
                    "takes `prompt`")
            require(self.window <= 4 * defaults["frames"], f"window {self.window}: the model "
                    f"was trained on {defaults['frames']} frames; use at most "
                    f"{4 * defaults['frames']}")
            set_derived(self, cfg=trained_cfg, prompt=prompt, cond=parse_prompt(prompt))
            return
        require(self.prompt is None, "prompt needs trained weights; the random model takes "
                "`label`")
        cfg = DiTConfig(attention="factored")
        cond = 3 if self.label is None else self.label
        require(0 <= cond < cfg.num_classes, f"label must be in [0, {cfg.num_classes})")
        set_derived(self, cfg=cfg, cond=cond)

    @property
    def trained(self) -> bool:
        return self.path is not None


def rank(req: LongVideoRequest) -> dict:
    """On each rank: the whole video's latents [1, C, T, Hl, Wl] (every rank ends with all of
    them), its windows, peak memory, times and bytes (`windows_rank`)."""
    return windows_rank(req)


def run(req: LongVideoRequest, stream=False) -> dict:
    """Sample a long video on `req.nproc` ranks. Returns {"latents" [1, C, T, Hl, Wl], "clip"
    [T, 3, H, W] in [0, 1] (trained weights only, else None), "report"}."""
    from cpcourse.launch import launch

    results = launch(rank, req.nproc, timeout=req.timeout, args=(req,), stream=stream)
    latents, clip, report = build_report(req, results)
    if req.compare:
        from cpcourse.support.tolerance import verdict

        single = windows_rank(req)["latents"]
        report.update(verdict(float((single - latents).abs().max()), float(single.abs().max()),
                              "ring" if req.parallel == "cp" else "windows", req.dtype,
                              req.cfg_scale))
    return {"latents": latents, "clip": clip, "report": report}


def run_long(nproc: int = 2, seed: int = 0, *, stream=False, **fields) -> dict:
    """`run(LongVideoRequest(nproc=nproc, seed=seed, **fields))`: the notebooks' one line."""
    return run(LongVideoRequest(nproc=nproc, seed=seed, **fields), stream=stream)


def check_request(nproc: int = 2, seed: int = 0, **fields) -> LongVideoRequest:
    """`LongVideoRequest(nproc=nproc, seed=seed, **fields)`, or an InputError naming the
    parameter."""
    return LongVideoRequest(nproc=nproc, seed=seed, **fields)


def build_report(request: LongVideoRequest, results) -> tuple[torch.Tensor, object, dict]:
    """(latents, clip or None, report) from the ranks' results: rank 0's latents (every rank
    holds the whole video), what each rank did and measured, the seams and the tracker."""
    from cpcourse.tinydit.moving_shapes import matches, track
    from cpcourse.tinydit.training import to_clip

    latents = results[0]["latents"]
    frames, window, stride = request.shape[2], request.window, request.stride
    report = {"nproc": request.nproc, "seed": request.seed, "frames": frames, "window": window,
              "stride": stride, "blend": request.blend, "noise": request.noise,
              "parallel": request.parallel, "windows": len(request.starts),
              "starts": request.starts, "steps": request.steps,
              "windows_per_rank": [len(r["my_windows"]) for r in results],
              "bytes_per_step_per_rank": [int(r["bytes_per_step"]) for r in results],
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "window_peak_bytes_per_rank": [int(r["window_peak_bytes"]) for r in results],
              "state_bytes": int(results[0]["state_bytes"]),
              "seconds": round(max(sum(r["step_seconds"]) for r in results), 4),
              "ranks_identical": all(torch.equal(latents, r["latents"]) for r in results),
              "launch_seconds": round(results.seconds, 3), "shape": list(request.shape),
              "dtype": request.dtype}
    clip = to_clip(latents) if request.trained else None
    if request.trained:
        seen = track(clip)
        report.update(prompt=request.prompt,
                      seam=seam_metric(clip, boundaries(frames, window, stride)),
                      track={"direction": seen["direction"], "shape": seen["shape"],
                             "present_fraction": matches(request.prompt, seen)[
                                 "present_fraction"]})
    return latents, clip, report


def print_report(report: dict) -> None:
    """`run_long`'s report, a few lines for a terminal."""
    kb = lambda x: f"{x / 1e3:,.0f} kB"  # noqa: E731  (SI, as cpcourse.viz.fmt.nbytes)
    many = lambda n, word: f"{n} {word}{'s' * (n != 1)}"  # noqa: E731
    print(f"{report['frames']} frames as {many(report['windows'], 'window')} of "
          f"{report['window']} (stride {report['stride']}, {report['blend']} blend, "
          f"{report['noise']} noise), parallel {report['parallel']} on "
          f"{many(report['nproc'], 'rank')}: {report['seconds']:.2f} s")
    for r, (p, w, b) in enumerate(zip(report["peak_bytes_per_rank"],
                                      report["window_peak_bytes_per_rank"],
                                      report["bytes_per_step_per_rank"], strict=True)):
        print(f"  rank {r}: {many(report['windows_per_rank'][r], 'window')}, peak {kb(p)} (one "
              f"window's forward {kb(w)}, latent state {kb(report['state_bytes'])}), sends "
              f"{kb(b)}/step")
    if "seam" in report:
        s = report["seam"]
        print(f"  seam: change across window ends / inside = {s['ratio']:.2f}" if s["ratio"]
              else "  seam: no window ends inside the video")
        tr = report["track"]
        print(f"  the tracker sees a {tr['shape']} moving {tr['direction']}, one object in "
              f"{100 * tr['present_fraction']:.0f}% of frames")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  {describe(report)}")
