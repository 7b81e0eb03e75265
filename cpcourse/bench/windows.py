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
   stride does not divide (fewer ranks where there are fewer windows, or window frames).
The exactness runs go through `cpcourse.runs.long_video.run_long`, what `cpcourse generate
--window W` runs.
"""

from __future__ import annotations

import json
import statistics
import time

from cpcourse.runs.long_video import run_long
from cpcourse.support.errors import ArgumentParser, positive_int, require


def _clip_stats(model, frames, window, stride, blend, seeds, steps, prompt):
    from cpcourse.tinydit.moving_shapes import parse_prompt, track
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.training import to_clip
    from cpcourse.tinydit.windows import WindowSampling, boundaries, sample_windows, seam_metric

    ratios, present = [], []
    for seed in seeds:
        noise = initial_noise((1, 3, frames, 32, 32), seed)
        how = WindowSampling(steps, 4.0, window, stride, blend)
        clip = to_clip(sample_windows(model, noise, parse_prompt(prompt), how))
        ratios.append(seam_metric(clip, boundaries(frames, window, stride))["ratio"])
        seen = track(clip)["present"]
        present.append(sum(seen) / len(seen))
    return {"stride": stride, "blend": blend, "seam_ratio": statistics.mean(ratios),
            "seam_ratio_per_seed": ratios, "one_object_fraction": statistics.mean(present)}


def _parse(argv: list[str]):
    """The arguments, checked: (args, window, stride, seeds, steps)."""
    from cpcourse.tinydit.training import SAMPLE_STEPS

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
    n_seeds = positive_int("--seeds", args.seeds)
    require(n_seeds <= 32, "--seeds: use at most 32")  # len(range(2**63)) overflows
    seeds = range(n_seeds)
    steps = positive_int("--steps", args.steps)
    require(steps <= 100, "--steps: use at most 100")
    return args, window, stride, seeds, steps


def _lengths(model, label, window: int, stride: int, steps: int) -> list[dict]:
    """Memory and seconds at 1x, 2x and 4x the window, windowed and one-shot."""
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.sampling import initial_noise, sample
    from cpcourse.tinydit.windows import STATE_COPIES, WindowSampling, sample_windows

    rows = []
    warm = initial_noise((1, 3, window, 32, 32), 0)
    sample_windows(model, warm, label, WindowSampling(1, 4.0, window, stride))  # warm-up
    for k in (1, 2, 4):
        frames = k * window
        noise = initial_noise((1, 3, frames, 32, 32), 0)
        stats: dict = {}
        t0 = time.perf_counter()
        sample_windows(model, noise, label, WindowSampling(steps, 4.0, window, stride), None,
                       stats)
        t_win = time.perf_counter() - t0
        t0 = time.perf_counter()
        sample(model, noise, label, steps, 4.0)
        t_one = time.perf_counter() - t0
        # memory does not depend on the number of steps: measure 2 (the tracker is slow)
        _, peak = peak_memory(sample_windows, model, noise, label,
                              WindowSampling(2, 4.0, window, stride), None, stats, True)
        _, one_shot = peak_memory(sample, model, noise, label, 2, 4.0)
        state = STATE_COPIES * noise.numel() * noise.element_size()
        rows.append({
            "frames": frames, "windows": stats["windows"], "peak_bytes": int(peak),
            "window_forward_peak_bytes": stats["window_peak_bytes"],
            "latent_state_bytes": state, "peak_minus_state_bytes": int(peak) - state,
            "seconds": t_win, "seconds_per_window": t_win / stats["windows"],
            "one_shot_peak_bytes": int(one_shot), "one_shot_seconds": t_one})
    return rows


def _growth(report: dict) -> None:
    """4x over 1x for peak memory, memory past the state, seconds per window and one-shot."""
    first, last = report["lengths"][0], report["lengths"][-1]
    report["peak_4x_over_1x"] = last["peak_bytes"] / first["peak_bytes"]
    report["peak_minus_state_4x_over_1x"] = (last["peak_minus_state_bytes"]
                                             / first["peak_minus_state_bytes"])
    report["seconds_per_window_4x_over_1x"] = (last["seconds_per_window"]
                                               / first["seconds_per_window"])
    report["one_shot_peak_4x_over_1x"] = last["one_shot_peak_bytes"] / first["one_shot_peak_bytes"]


def _exactness_cases(prompt: str, window: int, stride: int, steps: int) -> list[tuple]:
    """(parallel, nproc) for the exactness runs, checked before anything is measured: both
    modes on P = 1, 2, 4 ranks, less where the video has fewer windows (parallel windows) or
    the window fewer frames (parallel cp) than ranks."""
    from cpcourse.runs.long_video import check_request
    from cpcourse.tinydit.windows import window_starts

    odd = 3 * window - 2  # a length the stride does not divide
    most = {"windows": len(window_starts(odd, window, stride)), "cp": window}
    cases = [(parallel, nproc) for parallel in ("windows", "cp") for nproc in (1, 2, 4)
             if nproc <= most[parallel]]
    for parallel, nproc in cases:
        check_request(nproc, 0, prompt=prompt, frames=odd, window=window, stride=stride,
                      parallel=parallel, steps=steps)
    return cases


def _exactness(cases: list[tuple], prompt: str, window: int, stride: int,
               steps: int) -> list[dict]:
    """Each (parallel, nproc) case against one process."""
    rows = []
    for parallel, nproc in cases:
        r = run_long(nproc, 0, prompt=prompt, frames=3 * window - 2, window=window,
                     stride=stride, parallel=parallel, steps=steps, compare=True)
        rep = r["report"]
        rows.append({k: rep[k] for k in (
            "parallel", "nproc", "frames", "windows_per_rank",
            "bytes_per_step_per_rank", "peak_bytes_per_rank",
            "max_abs_diff_vs_single_process", "seconds")})
    return rows


def _print(report: dict) -> None:
    kb = lambda x: f"{x / 1e3:,.0f} kB"  # noqa: E731  (SI, as cpcourse.viz.fmt.nbytes)
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


def main(argv: list[str]) -> int:
    from cpcourse.tinydit.moving_shapes import parse_prompt
    from cpcourse.tinydit.training import load_shapes_model

    args, window, stride, seeds, steps = _parse(argv)
    cases = [] if args.no_ranks else _exactness_cases(args.prompt, window, stride, steps)
    model, label = load_shapes_model(), parse_prompt(args.prompt)
    report = {"window": window, "stride": stride, "steps": steps, "prompt": args.prompt,
              "lengths": _lengths(model, label, window, stride, steps)}
    _growth(report)
    frames = 4 * window
    report["seams"] = [_clip_stats(model, frames, window, s, b, seeds, steps, args.prompt)
                       for s, b in ((window, "flat"), (stride, "flat"), (stride, "pyramid"))]
    report["pyramid_over_no_overlap"] = (report["seams"][2]["seam_ratio"]
                                         / report["seams"][0]["seam_ratio"])
    if not args.no_ranks:
        report["exactness"] = _exactness(cases, args.prompt, window, stride, steps)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    _print(report)
    return 0
