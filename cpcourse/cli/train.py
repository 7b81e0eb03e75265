"""`cpcourse train`: train the tiny video DiT on procedural moving shapes.

    cpcourse train --out /tmp/shapes.safetensors --minutes 2 --seed 0
    cpcourse train --causal --init shipped --minutes 20 --threads 1 --out /tmp/causal.safetensors

Rectified flow, x-prediction, logit-normal times, shape and direction as two labels with label
dropout for classifier-free guidance (`cpcourse.tinydit.training` says why each). With `--causal`,
the chunk-causal model: the shipped weights fine-tuned with teacher forcing (`--init`;
`cpcourse.tinydit.causal` says why). Prints a progress bar with the loss and saves safetensors
weights with the model config in their metadata; `cpcourse generate --weights FILE` samples
them (`--causal` for a causal file). The shipped weights were made by this command.
"""

from __future__ import annotations

import json
import os
import sys

from cpcourse.support.errors import positive_float, positive_int, require, seed_int


def build_parser():
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="cpcourse train", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the weights file to write (.safetensors)")
    p.add_argument("--force", action="store_true", help="--out may replace an existing file")
    p.add_argument("--minutes", type=float, default=None,
                   help="train for this long (at least one step)")
    p.add_argument("--steps", type=int, default=None, help="or for this many steps")
    p.add_argument("--seed", type=int, default=0, help="data, noise and init seed")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--eval-seeds", type=int, default=0,
                   help="then generate each prompt at this many seeds and track the clips")
    p.add_argument("--causal", action="store_true",
                   help="train the chunk-causal model (teacher forcing, chunks of 2 frames)")
    p.add_argument("--init", default=None,
                   help="with --causal: fine-tune 'shipped' (default) or a weights file, or "
                        "'scratch'")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    return p


def main(argv: list[str]) -> int:
    from cpcourse.tinydit.causal import train_causal
    from cpcourse.tinydit.streaming import evaluate_causal
    from cpcourse.tinydit.training import evaluate, train

    args = build_parser().parse_args(argv)
    out, eval_seeds, init = _check(args)
    run = dict(minutes=args.minutes, steps=args.steps, seed=args.seed, threads=args.threads,
               progress=sys.stderr)
    res = train_causal(out, init=init, **run) if args.causal else train(out, **run)
    report = {"out": out, **res["run"], "first_loss": res["losses"][0]}
    if eval_seeds:
        report["eval"] = (evaluate_causal if args.causal else evaluate)(
            res["model"], seeds=range(eval_seeds))
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(f"trained {report['steps']} steps in {report['seconds']:.0f} s, loss "
              f"{report['first_loss']:.4f} -> {report['final_loss']:.4f}; wrote {out}")
        for prompt, r in report.get("eval", {}).items():
            if isinstance(r, dict):
                print(f"  {prompt:13s} direction {100 * r['direction']:3.0f}%  shape "
                      f"{100 * r['shape']:3.0f}%  one object {100 * r['present']:3.0f}% of frames")
    return 0


def _check(args) -> tuple[str, int, str | None]:
    """Every flag checked before training starts, so a mistake costs no minutes and leaves no
    weights file: (the absolute --out, the number of --eval-seeds, 0 for none, the --init)."""
    from cpcourse.support.out_files import check_output
    from cpcourse.tinydit.training import check_eval_seeds, weights_config

    require(args.minutes is not None or args.steps is not None,
            "give --minutes M or --steps N (or both: whichever comes first)")
    if args.minutes is not None:
        positive_float("--minutes", args.minutes, high=24 * 60)
    if args.steps is not None:
        positive_int("--steps", args.steps)
        require(args.steps <= 10**7, "--steps must be at most 10000000")
    seed_int("--seed", args.seed)
    if args.threads is not None:
        require(1 <= args.threads <= (os.cpu_count() or 1),
                f"--threads must be in [1, {os.cpu_count()}] (this machine's cores)")
    eval_seeds = 0 if args.eval_seeds == 0 else check_eval_seeds("--eval-seeds", args.eval_seeds)
    init = args.init
    if args.causal:
        init = init or "shipped"
        if init not in ("shipped", "scratch"):
            # read now: a foreign file is one line, no training; either kind may be fine-tuned
            init = weights_config(init, causal=None)[0]
    else:
        require(init is None, "--init is for --causal (the bidirectional model trains from "
                "the DiT init)")
    return check_output(args.out, args.force, "--out"), eval_seeds, init
