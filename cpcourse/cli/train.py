"""`cpcourse train`: train the tiny video DiT on procedural moving shapes.

    cpcourse train --out /tmp/shapes.safetensors --minutes 2 --seed 0
    cpcourse train --causal --init shipped --minutes 20 --threads 1 --out /tmp/causal.safetensors
    cpcourse train --nproc 2 --cp ring --steps 3 --seed 0 --compare --json

Rectified flow, x-prediction, logit-normal times, shape and direction as two labels with label
dropout for classifier-free guidance (`cpcourse.tinydit.training` says why each). With `--causal`,
the chunk-causal model: the shipped weights fine-tuned with teacher forcing (`--init`;
`cpcourse.tinydit.causal` says why). Prints a progress bar with the loss and saves safetensors
weights with the model config in their metadata; `cpcourse generate --weights FILE` samples
them (`--causal` for a causal file). The shipped weights were made by this command.
With `--nproc P`, a smaller model of the same kind is trained under CP (`--cp ring|ulysses`,
`--dp D` data-parallel replicas beside it, `--checkpoint` for activation checkpointing) and,
with `--compare`, in one process too: `cpcourse.runs.train_cp` reports both loss curves, the
weights' difference against its tolerance and the bytes each rank held.
"""

from __future__ import annotations

import json
import os
import sys

from cpcourse.runs.train_cp import TrainCPRequest
from cpcourse.support.errors import positive_float, positive_int, require, seed_int
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.support.request_flags import add_request_flags, mode_table, request_values


def build_parser():
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="cpcourse train", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="the weights file to write (.safetensors)")
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
    # --nproc P: the flags of `cpcourse.runs.train_cp.TrainCPRequest` (its fields)
    add_request_flags(p, TrainCPRequest, skip=("steps", "seed"), unset=True)
    return p


MODE_FLAGS = {"out": "one_process", "force": "one_process", "minutes": "one_process",
              "steps": ALWAYS, "seed": ALWAYS,
              "threads": "one_process", "eval_seeds": "one_process", "causal": "one_process",
              "init": "causal", "json": ALWAYS} | mode_table(TrainCPRequest, skip=("steps", "seed"))


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    return {"one_process": (args.nproc is None, "no --nproc (one process, the shipped model)"),
            "cp": (args.nproc is not None, "--nproc P"),
            "causal": (args.causal, "--causal")}


def main(argv: list[str]) -> int:
    from cpcourse.tinydit.causal import train_causal
    from cpcourse.tinydit.streaming import evaluate_causal
    from cpcourse.tinydit.training import evaluate, train

    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    if args.nproc is not None:
        return _main_cp(args)
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


def _main_cp(args) -> int:
    """`--nproc P`: the request checked before any process starts, run, reported."""
    from cpcourse.runs.train_cp import run

    report = run(TrainCPRequest(**request_values(TrainCPRequest, args)))
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    curve = lambda key: " ".join(f"{x:.4f}" for x in report["loss"][key])  # noqa: E731
    mb = lambda key: f"{report[key] / 1e6:.2f} MB"  # noqa: E731
    print(f"trained {report['steps']} steps on {report['nproc']} ranks ({report['cp']}, dp "
          f"{report['dp']} x sp {report['sp']}): loss {curve('cp')}")
    print(f"activations per rank {report['activation_bytes_per_rank'][0] / 1e6:.2f} MB, peak "
          f"{max(report['peak_bytes_per_rank']) / 1e6:.2f} MB")
    if args.compare:
        ok = "within" if report["within_tolerance"] else "OUTSIDE"
        print(f"one process: loss {curve('single')}; max |weight difference| "
              f"{report['max_weight_err']:.3g} ({ok} the tolerance {report['tolerance']:.2g}); "
              f"activations {mb('activation_bytes_single')} (predicted per rank "
              f"{mb('predicted_activation_bytes_per_rank')})")
    return 0


def _check(args) -> tuple[str, int, str | None]:
    """Every flag checked before training starts, so a mistake costs no minutes and leaves no
    weights file: (the absolute --out, the number of --eval-seeds, 0 for none, the --init)."""
    from cpcourse.support.out_files import check_output
    from cpcourse.tinydit.training import check_eval_seeds, weights_config

    require(args.out is not None, "give --out FILE (the weights to write), or --nproc P to "
            "train under CP")
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
