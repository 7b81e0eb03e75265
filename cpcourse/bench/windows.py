"""`cpcourse bench windows`: long videos from the trained shapes model, measured.

    cpcourse bench windows --json

Three measurements, each in one run:
1. memory and time against the video length (1x, 2x, 4x the window): the windowed sampler's
   peak tensor memory (one process), the part one window's forward needs, the latent state it
   keeps, and seconds; beside one-shot sampling of the whole video (all frames in one
   attention), which the model was not trained for but which shows how memory grows;
2. seams: the change between frames across window ends over the change inside windows, for
   separate clips (stride = window, no overlap) and for overlapping windows with flat and
   pyramid blending, averaged over seeds, plus how often the tracker sees one object;
3. exactness: both parallel modes on P = 1, 2, 4 ranks against one process, at a length the
   stride does not divide.
`run_long` is also what `cpcourse generate --window W` runs: the windowed sampler on P ranks
(`cpcourse.tinydit.windows.windows_rank`), with the schedule, the bytes each rank sends per step,
the peak working memory of one window's forward beside the whole run's peak and the latent state,
and the seam metric in its report.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from cpcourse.support.errors import (
    ArgumentParser,
    finite_float,
    positive_int,
    require,
)
from cpcourse.tinydit.windows import (
    BLENDS,
    NOISES,
    PARALLEL,
    boundaries,
    seam_metric,
    window_starts,
)

MAX_FRAMES = 512


def run_long(nproc: int, seed: int = 0, *, prompt: str | None = None, weights: str = "shipped",
             frames: int = 32, window: int = 8, stride: int = 4, blend: str = "pyramid",
             noise: str = "independent", parallel: str = "windows", steps: int | None = None,
             cfg_scale: float = 4.0, label: int | None = None, dtype: str = "fp32",
             compare: bool = False, timeout: float = 300.0, stream=False) -> dict:
    """Sample a long video on `nproc` ranks. Returns {"latents", "clip", "report"}."""
    from cpcourse.launch import check_nproc, launch
    from cpcourse.tinydit.model import DiTConfig
    from cpcourse.tinydit.moving_shapes import PROMPTS, matches, parse_prompt, track
    from cpcourse.tinydit.sampling import DTYPES
    from cpcourse.tinydit.training import RANDOM_DEFAULTS, TRAINED_DEFAULTS, to_clip, weights_config

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
    path, trained_cfg = weights_config(weights)
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
    results = launch("cpcourse.tinydit.windows:windows_rank", nproc, timeout=timeout, args=(spec,),
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
        from cpcourse.tinydit.windows import windows_rank

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


def _clip_stats(model, frames, window, stride, blend, seeds, steps, prompt):
    from cpcourse.tinydit.moving_shapes import parse_prompt, track
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.training import to_clip
    from cpcourse.tinydit.windows import boundaries, sample_windows, seam_metric

    ratios, present = [], []
    for seed in seeds:
        noise = initial_noise((1, 3, frames, 32, 32), seed)
        clip = to_clip(sample_windows(model, noise, parse_prompt(prompt), steps, 4.0, window,
                                      stride, blend))
        ratios.append(seam_metric(clip, boundaries(frames, window, stride))["ratio"])
        seen = track(clip)["present"]
        present.append(sum(seen) / len(seen))
    return {"stride": stride, "blend": blend, "seam_ratio": statistics.mean(ratios),
            "seam_ratio_per_seed": ratios, "one_object_fraction": statistics.mean(present)}


def main(argv: list[str]) -> int:
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.moving_shapes import parse_prompt
    from cpcourse.tinydit.sampling import initial_noise, sample
    from cpcourse.tinydit.training import SAMPLE_STEPS, load_shapes_model
    from cpcourse.tinydit.windows import STATE_COPIES, sample_windows

    p = ArgumentParser(prog="cpcourse bench windows", description=__doc__.split("\n")[0])
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--stride", type=int, default=4)
    p.add_argument("--seeds", type=int, default=4, help="seeds for the seam metric (4)")
    p.add_argument("--prompt", default="circle-right")
    p.add_argument("--steps", type=int, default=SAMPLE_STEPS)
    p.add_argument("--no-ranks", action="store_true", help="skip the multi-process checks")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    window, stride = positive_int("--window", args.window), positive_int("--stride", args.stride)
    require(window <= 32 and stride <= window, "use --window <= 32 and --stride <= --window")
    seeds = range(positive_int("--seeds", args.seeds))
    require(len(seeds) <= 32, "--seeds: use at most 32")
    steps = positive_int("--steps", args.steps)
    require(steps <= 100, "--steps: use at most 100")
    model, label = load_shapes_model(), parse_prompt(args.prompt)
    report = {"window": window, "stride": stride, "steps": steps, "prompt": args.prompt,
              "lengths": []}
    warm = initial_noise((1, 3, window, 32, 32), 0)
    sample_windows(model, warm, label, 1, 4.0, window, stride)  # warm-up: first-call costs
    for k in (1, 2, 4):
        frames = k * window
        noise = initial_noise((1, 3, frames, 32, 32), 0)
        stats: dict = {}
        t0 = time.perf_counter()
        sample_windows(model, noise, label, steps, 4.0, window, stride, "pyramid", None,
                       "windows", stats)
        t_win = time.perf_counter() - t0
        t0 = time.perf_counter()
        sample(model, noise, label, steps, 4.0)
        t_one = time.perf_counter() - t0
        # memory does not depend on the number of steps: measure 2 (the tracker is slow)
        _, peak = peak_memory(sample_windows, model, noise, label, 2, 4.0, window, stride,
                              "pyramid", None, "windows", stats, True)
        _, one_shot = peak_memory(sample, model, noise, label, 2, 4.0)
        state = STATE_COPIES * noise.numel() * noise.element_size()
        report["lengths"].append({
            "frames": frames, "windows": stats["windows"], "peak_bytes": int(peak),
            "window_forward_peak_bytes": stats["window_peak_bytes"],
            "latent_state_bytes": state, "peak_minus_state_bytes": int(peak) - state,
            "seconds": t_win, "seconds_per_window": t_win / stats["windows"],
            "one_shot_peak_bytes": int(one_shot), "one_shot_seconds": t_one})
    first, last = report["lengths"][0], report["lengths"][-1]
    report["peak_4x_over_1x"] = last["peak_bytes"] / first["peak_bytes"]
    report["peak_minus_state_4x_over_1x"] = (last["peak_minus_state_bytes"]
                                             / first["peak_minus_state_bytes"])
    report["seconds_per_window_4x_over_1x"] = (last["seconds_per_window"]
                                               / first["seconds_per_window"])
    report["one_shot_peak_4x_over_1x"] = last["one_shot_peak_bytes"] / first["one_shot_peak_bytes"]
    frames = 4 * window
    report["seams"] = [_clip_stats(model, frames, window, s, b, seeds, steps, args.prompt)
                       for s, b in ((window, "flat"), (stride, "flat"), (stride, "pyramid"))]
    report["pyramid_over_no_overlap"] = (report["seams"][2]["seam_ratio"]
                                         / report["seams"][0]["seam_ratio"])
    if not args.no_ranks:
        report["exactness"] = []
        odd = 3 * window - 2  # a length the stride does not divide
        for parallel in ("windows", "cp"):
            for nproc in (1, 2, 4):
                r = run_long(nproc, 0, prompt=args.prompt, frames=odd, window=window,
                             stride=stride, parallel=parallel, steps=steps, compare=True)
                rep = r["report"]
                report["exactness"].append({k: rep[k] for k in (
                    "parallel", "nproc", "frames", "windows_per_rank",
                    "bytes_per_step_per_rank", "peak_bytes_per_rank",
                    "max_abs_diff_vs_single_process", "seconds")})
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    kb = lambda x: f"{x / 1024:,.0f} KiB"  # noqa: E731
    for row in report["lengths"]:
        print(f"{row['frames']:4d} frames, {row['windows']} windows: peak {kb(row['peak_bytes'])}"
              f" (one window's forward {kb(row['window_forward_peak_bytes'])}, latent state "
              f"{kb(row['latent_state_bytes'])}), {row['seconds']:.2f} s "
              f"({row['seconds_per_window']:.3f} s per window); one-shot peak "
              f"{kb(row['one_shot_peak_bytes'])}")
    for row in report["seams"]:
        print(f"stride {row['stride']}, {row['blend']}: seam ratio {row['seam_ratio']:.2f}, one "
              f"object in {100 * row['one_object_fraction']:.0f}% of frames")
    for row in report.get("exactness", []):
        print(f"{row['parallel']:8s} P={row['nproc']}: max diff "
              f"{row['max_abs_diff_vs_single_process']:.1e}, sends "
              f"{[kb(b) for b in row['bytes_per_step_per_rank']]} per step")
    return 0
