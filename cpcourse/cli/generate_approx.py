"""`cpcourse generate --approx` and `--cache`: a clip from approximate CP, against the exact one.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --compare --json

Parses nothing itself: `cpcourse.cli.generate` hands over its arguments. Flags that choose how
exact CP runs, or the clip's size, have no effect here and are refused before anything starts.
The run is `cpcourse.runs.approx.run_approx`.
"""

from __future__ import annotations

import json

from cpcourse.support.errors import InputError, positive_float
from cpcourse.support.modes import given, option

# What an approximate run does not take: exact CP's methods, meshes, windows, other sizes.
NOT_HERE = ("weights", "layout", "temporal_method", "full_method", "compare_to", "window",
            "stride", "blend", "noise", "parallel", "frames", "height", "width", "dtype",
            "label", "attention")


def main_approx(parser, args) -> int:
    from cpcourse.cli.clip_files import check_outputs, write_outputs
    from cpcourse.cli.progress import rank_lines, running
    from cpcourse.runs.approx import approx_report, check_approx, launch_approx

    for dest in NOT_HERE:
        if given(parser, args, dest):
            raise InputError(f"{option(parser, dest)} has no effect with --approx or --cache: "
                             "they sample the shipped model's clip, split by --split")
    timeout = positive_float("--timeout", 120.0 if args.timeout is None else args.timeout,
                             high=3600)
    check_outputs(args)
    request = check_approx(
        2 if args.nproc is None else args.nproc, args.seed, prompt=args.prompt,
        approx=args.approx, warmup=0 if args.warmup is None else args.warmup,
        patches=args.patches, split=args.split or "time", cache=args.cache,
        cache_threshold=args.cache_threshold, steps=args.steps, cfg_scale=args.cfg_scale)
    with running(request.run.nproc, f"{args.prompt} with {args.approx or 'exact CP'}"
                 + (f", cache {args.cache}" if args.cache else "")):
        results = launch_approx(request, timeout=timeout, stream=rank_lines if args.json else True)
    clip, report = approx_report(request, results, compare=args.compare)
    write_outputs(args, {"report": report, "clip": clip}, clip)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    tr = report["track"]
    print(f"sampled '{report['prompt']}' with {report['approx']} (warm-up {report['warmup']} of "
          f"{report['steps']} steps) on {report['nproc']} processes: a {tr['shape']} moving "
          f"{tr['direction']} ({'matches' if report['matches_prompt'] else 'does NOT match'} "
          f"the prompt)")
    print(f"  sent {report['bytes_per_step'] / 1e3:.1f} kB per step (the busiest rank), waited "
          f"{report['exposed_comm_seconds']:.3f} s on communication, skipped "
          f"{report['steps_skipped']} steps")
    if args.compare:
        psnr = report["psnr_vs_exact"]
        print(f"  vs the exact clip: PSNR {'inf' if psnr is None else f'{psnr:.1f}'} dB, max "
              f"|difference| {report['max_abs_diff_vs_exact']:.3g}")
        if report["exact"]:
            ok = "within" if report["within_tolerance"] else "OUTSIDE"
            print(f"  exact CP: {ok} the tolerance {report['tolerance']:.2g}")
        else:
            print(f"  no tolerance: {report['no_tolerance_because']}")
    return 0
