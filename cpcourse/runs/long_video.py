"""A video longer than the model's window, sampled on P ranks: the runner of `generate --window`.

    cpcourse generate --frames 32 --window 8 --stride 4 --nproc 2 --compare --json

`run_long(nproc, ...)` checks its arguments into a `LongVideoRequest`, runs the windowed sampler
on the ranks (`cpcourse.tinydit.windows.windows_rank`: whole windows per rank, or each window
under CP), and reports the schedule, the bytes each rank sends per step, the peak working memory
of one window's forward beside the whole run's peak and the latent state, and the seam metric;
`compare=True` also samples in this process. `print_report` prints that report.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.support.errors import guidance_scale, positive_int, require, seed_int
from cpcourse.support.tolerance import describe
from cpcourse.tinydit.windows import (
    BLENDS,
    NOISES,
    PARALLEL,
    boundaries,
    seam_metric,
    window_starts,
)

MAX_FRAMES = 512


@dataclass(frozen=True)
class LongVideoRequest:
    """One long video, checked: `shape` is the latents' [1, C, T, Hl, Wl], `starts` the first
    frame of each window, `cond` the prompt's (shape, direction) ids or the random model's label,
    `path` the weights file (None: the seeded random DiT)."""

    nproc: int
    seed: int
    path: str | None
    model: dict
    shape: tuple[int, int, int, int, int]
    starts: list
    window: int
    stride: int
    blend: str
    noise: str
    parallel: str
    steps: int
    cfg_scale: float
    cond: object
    prompt: str | None
    dtype: str

    @property
    def trained(self) -> bool:
        return self.path is not None

    def rank_spec(self) -> dict:
        """What every rank (and the one-process reference) is handed."""
        return {"model": self.model, "weights": self.path, "dtype": self.dtype,
                "weight_seed": 0, "seed": self.seed, "shape": list(self.shape),
                "steps": self.steps, "cfg_scale": self.cfg_scale, "label": self.cond,
                "window": self.window, "stride": self.stride, "blend": self.blend,
                "noise": self.noise, "parallel": self.parallel}


def run_long(nproc: int, seed: int = 0, *, prompt: str | None = None, weights: str = "shipped",
             frames: int = 32, height: int | None = None, width: int | None = None,
             window: int = 8, stride: int = 4, blend: str = "pyramid",
             noise: str = "independent", parallel: str = "windows", steps: int | None = None,
             cfg_scale: float = 4.0, label: int | None = None, dtype: str = "fp32",
             compare: bool = False, timeout: float = 300.0, stream=False) -> dict:
    """Sample a long video on `nproc` ranks. Returns {"latents" [1, C, T, Hl, Wl], "clip"
    [T, 3, H, W] in [0, 1] (trained weights only, else None), "report"}."""
    from cpcourse.launch import launch

    request = check_request(nproc, seed, prompt=prompt, weights=weights, frames=frames,
                            height=height, width=width, window=window, stride=stride,
                            blend=blend, noise=noise, parallel=parallel, steps=steps,
                            cfg_scale=cfg_scale, label=label, dtype=dtype)
    results = launch("cpcourse.tinydit.windows:windows_rank", request.nproc, timeout=timeout,
                     args=(request.rank_spec(),), stream=stream)
    latents, clip, report = build_report(request, results)
    if compare:
        from cpcourse.support.tolerance import verdict
        from cpcourse.tinydit.windows import windows_rank

        single = windows_rank(request.rank_spec())["latents"]
        report.update(verdict(float((single - latents).abs().max()), float(single.abs().max()),
                              "ring" if request.parallel == "cp" else "windows", request.dtype,
                              request.cfg_scale))
    return {"latents": latents, "clip": clip, "report": report}


def check_request(nproc: int, seed: int = 0, *, prompt=None, weights="shipped", frames=32,
                  height=None, width=None, window=8, stride=4, blend="pyramid",
                  noise="independent", parallel="windows", steps=None, cfg_scale=4.0, label=None,
                  dtype="fp32") -> LongVideoRequest:
    """`run_long`'s arguments as a `LongVideoRequest`, or an InputError naming the parameter."""
    from cpcourse.launch import check_nproc
    from cpcourse.runs.generate import check_frame_size
    from cpcourse.tinydit.sampling import DTYPES
    from cpcourse.tinydit.training import RANDOM_DEFAULTS, TRAINED_DEFAULTS, weights_config

    nproc, seed = check_nproc(nproc), seed_int("seed", seed)
    frames = positive_int("frames", frames)
    require(frames <= MAX_FRAMES, f"frames {frames}: use at most {MAX_FRAMES}")
    starts = window_starts(frames, positive_int("window", window),
                           positive_int("stride", stride))
    require(blend in BLENDS, f"blend must be one of {', '.join(BLENDS)}")
    require(noise in NOISES, f"noise must be one of {', '.join(NOISES)}")
    require(parallel in PARALLEL, f"parallel must be one of {', '.join(PARALLEL)}")
    require(dtype in DTYPES, f"dtype must be one of {sorted(DTYPES)}")
    cfg_scale = guidance_scale("cfg_scale", cfg_scale)
    if parallel == "windows":
        require(nproc <= len(starts), f"parallel=windows gives each rank whole windows, and "
                f"there are {len(starts)}: use nproc={len(starts)} or fewer, or parallel=cp")
    else:
        require(nproc <= window, f"parallel=cp splits each {window}-frame window over the "
                f"ranks: use nproc={window} or fewer, or parallel=windows")
    path, trained_cfg = weights_config(weights)
    defaults = TRAINED_DEFAULTS if path is not None else RANDOM_DEFAULTS
    steps = positive_int("steps", defaults["steps"] if steps is None else steps)
    require(steps <= 1000, f"steps {steps}: use at most 1000")
    cfg, prompt, cond = _model_and_condition(path, trained_cfg, defaults, window, prompt, label)
    height = defaults["height"] if height is None else height
    width = defaults["width"] if width is None else width
    check_frame_size(cfg, height, width)
    shape = (1, cfg.in_channels, frames, height, width)
    return LongVideoRequest(nproc=nproc, seed=seed, path=path, model=cfg.as_dict(), shape=shape,
                            starts=starts, window=window, stride=stride, blend=blend,
                            noise=noise, parallel=parallel, steps=steps, cfg_scale=cfg_scale,
                            cond=cond, prompt=prompt, dtype=dtype)


def _model_and_condition(path, trained_cfg, defaults: dict, window: int, prompt, label):
    """(config, prompt, condition): the trained weights take --prompt, the random DiT --label."""
    from cpcourse.tinydit.model import DiTConfig
    from cpcourse.tinydit.moving_shapes import PROMPTS, parse_prompt

    if path is not None:
        cfg, prompt = trained_cfg, prompt or PROMPTS[1]
        require(label is None, "label conditions the random model; the trained one takes "
                "`prompt`")
        require(window <= 4 * defaults["frames"], f"window {window}: the model was trained on"
                f" {defaults['frames']} frames; use at most {4 * defaults['frames']}")
        return cfg, prompt, parse_prompt(prompt)
    require(prompt is None, "prompt needs trained weights; the random model takes `label`")
    cfg = DiTConfig(attention="factored")
    cond = 3 if label is None else label
    require(0 <= cond < cfg.num_classes, f"label must be in [0, {cfg.num_classes})")
    return cfg, prompt, cond


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
