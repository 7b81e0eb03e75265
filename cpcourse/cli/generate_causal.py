"""`cpcourse generate --causal`: a clip streamed chunk after chunk by the chunk-causal model,
with its KV cache under CP (`cpcourse.tinydit.streaming`, run by `cpcourse.runs.stream`).

    cpcourse generate --causal --prompt circle-right --nproc 2 --kv-cache pass-q --gif c.gif
"""

from __future__ import annotations

import json

from cpcourse.cli.clip_files import check_outputs, write_outputs
from cpcourse.cli.progress import rank_lines, running
from cpcourse.support.errors import positive_float, require


def main_causal(args) -> int:
    from cpcourse.runs.stream import check_stream, run_stream
    from cpcourse.tinydit.training import SAMPLE_STEPS

    require(args.weights != "random", "--causal streams trained weights: --weights shipped or "
            "a file from `cpcourse train --causal` (the random DiT is not causal)")
    check_outputs(args)
    args.nproc = 2 if args.nproc is None else args.nproc
    run = dict(prompt=args.prompt, weights=args.weights, kv_cache=args.kv_cache or "pass-q",
               chunk=args.chunk, steps=args.steps, cfg_scale=args.cfg_scale, dtype=args.dtype)
    request = check_stream(args.nproc, args.seed, **run)  # every refusal before a process starts
    # 120 s holds the default steps on 2 loaded cores; more steps take longer, not a deadlock
    default = min(3600.0, 120.0 * max(1.0, request.steps / SAMPLE_STEPS))
    timeout = positive_float("--timeout", default if args.timeout is None else args.timeout,
                             high=3600)
    with running(args.nproc, f"{args.prompt} streamed chunk by chunk, KV cache {run['kv_cache']}"):
        res = run_stream(args.nproc, args.seed, compare=args.compare, timeout=timeout,
                         stream=rank_lines if args.json else True, **run)
    report = res["report"]
    write_outputs(args, res, res["clip"])
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    _print(report)
    return 0


def _print(report: dict) -> None:
    from cpcourse.support.tolerance import describe
    from cpcourse.viz.fmt import nbytes, plural

    tr = report["track"]
    procs = plural(report["nproc"], "process", "processes")
    print(f"streamed '{report['prompt']}' in {report['chunks']} chunks of {report['chunk']} "
          f"frames on {procs}, KV cache {report['kv_cache']}, tokens per rank "
          f"{report['tokens_per_rank']}")
    print(f"  the tracker sees: a {tr['shape']} moving {tr['direction']} "
          f"({'matches' if report['matches_prompt'] else 'does NOT match'} the prompt)")
    print("  bytes sent per chunk (all ranks): "
          + ", ".join(f"{b / 1e6:.2f} MB" for b in report["bytes_per_chunk"]))
    for r, (peak, cache) in enumerate(zip(report["peak_bytes_per_rank"],
                                          report["cache_bytes_per_rank"], strict=True)):
        print(f"  rank {r}: peak tensor memory {nbytes(peak)}, KV cache {nbytes(cache)}")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  {describe(report)}")
    for key in ("saved", "gif"):
        if key in report:
            print(f"  wrote {report[key]}" + (" (and its .json)" if key == "saved" else ""))
