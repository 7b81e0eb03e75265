"""`cpcourse generate --window W`: a video longer than the model's window, from overlapping
windows blended (`cpcourse.tinydit.windows`, run by `cpcourse.runs.long_video.run_long`).

    cpcourse generate --frames 32 --window 8 --stride 4 --nproc 2 --gif long.gif
"""

from __future__ import annotations

import json

from cpcourse.cli.clip_files import check_outputs, write_outputs
from cpcourse.support.errors import positive_float


def main_long(args) -> int:
    from cpcourse.cli.progress import rank_lines, running
    from cpcourse.runs.long_video import check_request, print_report, run_long

    check_outputs(args)
    timeout = positive_float("--timeout", 300.0 if args.timeout is None else args.timeout,
                             high=3600)
    frames = 4 * args.window if args.frames is None else args.frames
    stride = max(1, args.window // 2) if args.stride is None else args.stride
    run = dict(prompt=args.prompt, weights=args.weights, frames=frames, height=args.height,
               width=args.width, window=args.window, stride=stride, blend=args.blend,
               noise=args.noise, parallel=args.parallel, steps=args.steps,
               cfg_scale=4.0 if args.cfg_scale is None else args.cfg_scale, label=args.label,
               dtype=args.dtype)
    request = check_request(args.nproc, args.seed, **run)  # every refusal before a line
    with running(request.nproc, f"{frames} frames in windows of {args.window}"):
        res = run_long(args.nproc, args.seed, compare=args.compare, timeout=timeout,
                       stream=rank_lines if args.json else True, **run)
    report = res["report"]
    out = res["clip"] if res["clip"] is not None else res["latents"]
    write_outputs(args, res, out)
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print_report(report)
    return 0
