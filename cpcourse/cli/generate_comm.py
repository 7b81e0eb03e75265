"""`cpcourse generate --comm-dtype`: the shipped model's clip with its attention traffic as fp32,
bf16 or fp8 (`cpcourse.runs.comm_generate`).

    cpcourse generate --prompt circle-right --nproc 2 --comm-dtype fp8 --compare --json
"""

from __future__ import annotations

import argparse
import json

from cpcourse.support.errors import positive_float, require


def main_comm(args: argparse.Namespace) -> int:
    """`--comm-dtype`: the shipped model's clip with its attention traffic in that dtype."""
    from cpcourse.runs.comm_generate import CommRequest, run

    fixed = [f for f, v in (("--frames", args.frames), ("--height", args.height),
                            ("--width", args.width), ("--steps", args.steps),
                            ("--cfg-scale", args.cfg_scale), ("--save", args.save),
                            ("--gif", args.gif), ("--compare-to", args.compare_to),
                            ("--full", args.full_method), ("--temporal", args.temporal_method))
             if v is not None] + (["--dtype"] if args.dtype != "fp32" else [])
    require(not fixed, f"{fixed[0] if fixed else ''} has no effect with --comm-dtype: it "
            "samples the shipped model at its own size and settings in fp32; drop it")
    req = CommRequest(prompt=args.prompt or "circle-right", seed=args.seed,
                      nproc=2 if args.nproc is None else args.nproc, comm_dtype=args.comm_dtype,
                      timeout=positive_float("--timeout", args.timeout or 300.0, high=3600))
    report = run(req, compare=args.compare)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print(f"{req.prompt} (seed {req.seed}) on {req.nproc} ranks, attention traffic in "
          f"{req.comm_dtype}: {report['comm_bytes'] / 1e6:.2f} MB sent (bf16: "
          f"{report['comm_bytes_bf16'] / 1e6:.2f} MB); tracker: {report['track']['shape']} "
          f"moving {report['track']['direction']} ({'as' if report['tracked'] else 'NOT as'} "
          f"prompted)")
    if "psnr" in report:
        p = "identical" if report["psnr"] is None else f"PSNR {report['psnr']:.1f} dB"
        print(f"  against the exact clip: {p}, max |difference| "
              f"{report['max_abs_diff_vs_exact']:.3g}")
    return 0
