"""`cpcourse generate --window W --stride S`: a video longer than the model's window, on P ranks.

    cpcourse generate --prompt circle-right --frames 32 --window 8 --stride 4 --nproc 2 --json

The sampler is `cpcourse.windows.sample_windows`: overlapping windows co-denoised at every step,
their predictions blended (`--blend pyramid|flat`), optionally from FreeNoise-rescheduled noise
(`--noise freenoise`). `--parallel windows` spreads whole windows over the ranks (one all-reduce
of the blended prediction per step); `--parallel cp` runs each window under CP on all ranks.
The report adds the schedule, the bytes each rank sends per step, the peak working memory of
one window's forward beside the whole run's peak and the latent state, and the seam metric.
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import finite_float, positive_int, require
from cpcourse.windows import BLENDS, NOISES, PARALLEL, boundaries, seam_metric, window_starts

MAX_FRAMES = 512


def run_long(nproc: int, seed: int = 0, *, prompt: str | None = None, weights: str = "shipped",
             frames: int = 32, window: int = 8, stride: int = 4, blend: str = "pyramid",
             noise: str = "independent", parallel: str = "windows", steps: int | None = None,
             cfg_scale: float = 4.0, label: int | None = None, dtype: str = "fp32",
             compare: bool = False, timeout: float = 300.0, stream=False) -> dict:
    """Sample a long video on `nproc` ranks. Returns {"latents", "clip", "report"}."""
    from cpcourse.cli.generate import RANDOM_DEFAULTS, TRAINED_DEFAULTS, _trained_config
    from cpcourse.dit import DiTConfig
    from cpcourse.launch import check_nproc, launch
    from cpcourse.sampling import DTYPES
    from cpcourse.shapes import PROMPTS, matches, parse_prompt, track
    from cpcourse.shapes_model import to_clip

    nproc = check_nproc(nproc)
    frames = positive_int("--frames", frames)
    require(frames <= MAX_FRAMES, f"--frames {frames}: use at most {MAX_FRAMES}")
    starts = window_starts(frames, positive_int("--window", window),
                           positive_int("--stride", stride))
    require(blend in BLENDS, f"--blend must be one of {', '.join(BLENDS)}")
    require(noise in NOISES, f"--noise must be one of {', '.join(NOISES)}")
    require(parallel in PARALLEL, f"--parallel must be one of {', '.join(PARALLEL)}")
    require(dtype in DTYPES, f"--dtype must be one of {sorted(DTYPES)}")
    cfg_scale = finite_float("--cfg-scale", cfg_scale)
    require(abs(cfg_scale) <= 100, "--cfg-scale must be between -100 and 100")
    if parallel == "windows":
        require(nproc <= len(starts), f"--parallel windows gives each rank whole windows, and "
                f"there are {len(starts)}: use --nproc {len(starts)} or fewer, or --parallel cp")
    else:
        require(nproc <= window, f"--parallel cp splits each {window}-frame window over the "
                f"ranks: use --nproc {window} or fewer, or --parallel windows")
    path, trained_cfg = _trained_config(weights)
    trained = path is not None
    defaults = TRAINED_DEFAULTS if trained else RANDOM_DEFAULTS
    steps = positive_int("--steps", defaults["steps"] if steps is None else steps)
    require(steps <= 1000, f"--steps {steps}: use at most 1000")
    if trained:
        cfg, prompt = trained_cfg, prompt or PROMPTS[1]
        require(label is None, "--label conditions the random model; the trained one takes "
                "--prompt")
        require(window <= 4 * defaults["frames"], f"--window {window}: the model was trained on"
                f" {defaults['frames']} frames; use at most {4 * defaults['frames']}")
        cond = parse_prompt(prompt)
    else:
        require(prompt is None, "--prompt needs trained weights; the random model takes --label")
        cfg = DiTConfig(attention="factored")
        cond = 3 if label is None else label
        require(0 <= cond < cfg.num_classes, f"--label must be in [0, {cfg.num_classes})")
    shape = [1, cfg.in_channels, frames, defaults["height"], defaults["width"]]
    spec = {"model": cfg.as_dict(), "weights": path, "dtype": dtype, "weight_seed": 0,
            "seed": seed, "shape": shape, "steps": steps, "cfg_scale": cfg_scale,
            "label": cond, "window": window, "stride": stride, "blend": blend, "noise": noise,
            "parallel": parallel}
    results = launch("cpcourse.windows:windows_rank", nproc, timeout=timeout, args=(spec,),
                     stream=stream)
    latents = results[0]["latents"]
    report = {"nproc": nproc, "seed": seed, "frames": frames, "window": window,
              "stride": stride, "blend": blend, "noise": noise, "parallel": parallel,
              "windows": len(starts), "starts": starts, "steps": steps,
              "windows_per_rank": [len(r["my_windows"]) for r in results],
              "bytes_per_step_per_rank": [int(r["bytes_per_step"]) for r in results],
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "window_peak_bytes_per_rank": [int(r["window_peak_bytes"]) for r in results],
              "state_bytes": int(results[0]["state_bytes"]),
              "seconds": round(max(sum(r["step_seconds"]) for r in results), 4),
              "ranks_identical": all(torch.equal(latents, r["latents"]) for r in results),
              "launch_seconds": round(results.seconds, 3), "shape": shape, "dtype": dtype}
    clip = to_clip(latents) if trained else None
    if trained:
        seen = track(clip)
        report.update(prompt=prompt, seam=seam_metric(clip, boundaries(frames, window, stride)),
                      track={"direction": seen["direction"], "shape": seen["shape"],
                             "present_fraction": matches(prompt, seen)["present_fraction"]})
    if compare:
        from cpcourse.windows import windows_rank

        single = windows_rank(spec)["latents"]
        report["max_abs_diff_vs_single_process"] = float((single - latents).abs().max())
    return {"latents": latents, "clip": clip, "report": report}


def print_report(report: dict) -> None:
    kb = lambda x: f"{x / 1024:.0f} KiB"  # noqa: E731
    print(f"{report['frames']} frames as {report['windows']} windows of {report['window']} "
          f"(stride {report['stride']}, {report['blend']} blend, {report['noise']} noise), "
          f"parallel {report['parallel']} on {report['nproc']} rank(s): {report['seconds']:.2f} s")
    for r, (p, w, b) in enumerate(zip(report["peak_bytes_per_rank"],
                                      report["window_peak_bytes_per_rank"],
                                      report["bytes_per_step_per_rank"], strict=True)):
        print(f"  rank {r}: {report['windows_per_rank'][r]} window(s), peak {kb(p)} (one window's"
              f" forward {kb(w)}, latent state {kb(report['state_bytes'])}), sends {kb(b)}/step")
    if "seam" in report:
        s = report["seam"]
        print(f"  seam: change across window ends / inside = {s['ratio']:.2f}" if s["ratio"]
              else "  seam: no window ends inside the video")
        tr = report["track"]
        print(f"  the tracker sees a {tr['shape']} moving {tr['direction']}, one object in "
              f"{100 * tr['present_fraction']:.0f}% of frames")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  max |difference| vs one process: {report['max_abs_diff_vs_single_process']:.3g}")
