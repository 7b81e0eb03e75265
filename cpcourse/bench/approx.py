"""`cpcourse bench approx`: what each approximate method costs in motion and pixels, per byte.

    cpcourse bench approx --seeds 2 --json

Every prompt at seeds 0 .. N-1 is sampled exactly (one process: the reference) and then on P
ranks by each method at each warm-up, by all-gather CP (the exact row) and by the first-block
cache at each threshold, every row's clips in one launch (`runs.approx.approx_sweep`). Per
row: the fraction of clips moving the prompt's direction
(`cpcourse.tinydit.moving_shapes.track`), the mean fraction of frames with exactly one object,
the mean PSNR against the exact clip (identical clips count as `PSNR_CAP` dB), the busiest
rank's bytes per step, the seconds it waited on communication per clip, and the steps the cache
skipped. On a CPU communication is a few per cent of compute, so wall time says little: the
bytes and the exposed seconds are what to read.
"""

from __future__ import annotations

import json

from cpcourse.approx import METHODS
from cpcourse.support.errors import ArgumentParser, InputError, positive_int, require

PSNR_CAP = 100.0  # dB: what an identical clip (infinite PSNR) counts as in a mean


def _numbers(flag: str, text: str, kind) -> list:
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{flag} {text!r}: give comma-separated numbers, e.g. 0,1,2") from None
    require(all(v >= 0 for v in values), f"{flag} {text!r}: every value must be >= 0")
    return values


def _row(name: str, warmup, results: list[dict], names: list[str], exact: list) -> dict:
    from cpcourse.approx.quality import psnr
    from cpcourse.tinydit.moving_shapes import matches, track

    seen = [matches(p, track(r["clip"])) for p, r in zip(names, results, strict=True)]
    gaps = [psnr(r["clip"], e) for r, e in zip(results, exact, strict=True)]
    n = len(results)
    return {"method": name, "warmup": warmup,
            "direction": sum(s["direction"] for s in seen) / n,
            "present": sum(s["present_fraction"] for s in seen) / n,
            "psnr_vs_exact": sum(PSNR_CAP if g is None else min(g, PSNR_CAP) for g in gaps) / n,
            "bytes_per_step": max(r["bytes_per_step"] for r in results),
            "exposed_comm_seconds": sum(r["exposed_comm_seconds"] for r in results) / n,
            "steps_skipped": sum(r["steps_skipped"] for r in results) / n}


def main(argv: list[str]) -> int:
    from cpcourse.approx.rank import WHOLE_VIDEO
    from cpcourse.runs.approx import SPLITS, approx_sweep, check_approx
    from cpcourse.tinydit.moving_shapes import PROMPTS, parse_prompt
    from cpcourse.tinydit.sampling import Sampling, single_process_sample
    from cpcourse.tinydit.training import SAMPLE_STEPS, check_eval_seeds, to_clip

    p = ArgumentParser(prog="cpcourse bench approx", description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=2, help="seeds per prompt (default 2)")
    p.add_argument("--steps", type=int, default=SAMPLE_STEPS)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--warmups", default="0,1,2", help="warm-ups to run each method at")
    p.add_argument("--thresholds", default="0.1,0.2", help="first-block cache thresholds")
    p.add_argument("--split", choices=SPLITS, default="time",
                   help="what a patch method's rank holds: frames (time) or rows (space; "
                        "pipefusion and asyncdiff split the model and keep to time)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    seeds = check_eval_seeds("--seeds", args.seeds)
    warmups = _numbers("--warmups", args.warmups, int)
    thresholds = _numbers("--thresholds", args.thresholds, float)
    knobs = dict(prompt=PROMPTS[0], steps=positive_int("--steps", args.steps))
    for w in warmups:  # a row's label must be the warm-up it ran
        require(w <= knobs["steps"], f"--warmups {w} is past the run's {knobs['steps']} steps "
                f"(at {knobs['steps']} every step is already exact): use at most "
                f"{knobs['steps']}")
    split = dict(knobs, split=args.split)
    plan = [("exact", 0, check_approx(args.nproc, approx="exact", **split))]
    plan += [(m, w, check_approx(args.nproc, approx=m, warmup=w,
                                 **(knobs if m in WHOLE_VIDEO else split)))
             for m in METHODS for w in warmups]
    plan += [(f"fbcache {t:g}", 0, check_approx(args.nproc, cache="fbcache", cache_threshold=t,
                                                 **split)) for t in thresholds]
    names = [name for name in PROMPTS for _ in range(seeds)]
    cases = [[list(parse_prompt(name)), s] for name in PROMPTS for s in range(seeds)]
    exact_run = plan[0][2].run
    exact = [to_clip(single_process_sample(Sampling.of(exact_run, cond=c, seed=s)))
             for c, s in cases]
    # every row's clips in one launch: start-up, not sampling, is most of a small launch
    sweep = approx_sweep([req for _, _, req in plan], cases)
    rows = [_row(name, w, clips, names, exact) for (name, w, _), clips in zip(plan, sweep,
                                                                             strict=True)]
    report = {"nproc": args.nproc, "steps": knobs["steps"], "seeds": seeds, "split": args.split,
              "clips_per_row": len(cases), "rows": rows}
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print(f"{len(cases)} clips per row, {knobs['steps']} steps, {args.nproc} ranks, split "
          f"{args.split} (pipefusion and asyncdiff: time)")
    print(f"  {'method':14s} {'W':>2s} {'direction':>9s} {'present':>8s} {'PSNR dB':>8s} "
          f"{'kB/step':>8s} {'waited s':>8s} {'skipped':>7s}")
    for r in rows:
        print(f"  {r['method']:14s} {r['warmup']:2d} {100 * r['direction']:8.1f}% "
              f"{100 * r['present']:7.1f}% {r['psnr_vs_exact']:8.1f} "
              f"{r['bytes_per_step'] / 1e3:8.1f} {r['exposed_comm_seconds']:8.3f} "
              f"{r['steps_skipped']:7.1f}")
    return 0
