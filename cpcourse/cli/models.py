"""`cpcourse models`: a tiny real diffusers video transformer under CP, against one process.

    cpcourse models --arch hunyuanvideo --nproc 3 --method usp --compare --json

Builds the architecture's own diffusers class (`cpcourse.models.build`: tiny config, seeded
random weights, no download) on every rank, parallelizes it (`cpcourse.models.parallelize`) and
runs one forward on the full inputs (`--sample-steps N`: N steps of the model's own scheduler
with CFG instead). `--compare` runs the same model in this process with as many threads as
there are ranks and reports the largest difference and both times.
JSON keys: arch, method, nproc, tokens, split, frame_sizes (None split by tokens),
tokens_per_rank, ulysses, ring, dtype, seconds_cp, and with --compare max_abs_err, tolerance,
within_tolerance, ranks_identical, seconds_single, ratio.
"""

from __future__ import annotations

import json

from cpcourse.cli.progress import running
from cpcourse.models.build import ARCHS
from cpcourse.models.compare import DTYPES, check_spec
from cpcourse.models.parallel import METHODS
from cpcourse.models.split import SPLITS
from cpcourse.runs.models import run_models
from cpcourse.support.errors import ArgumentParser, positive_float, positive_int, require
from cpcourse.support.modes import ALWAYS, refuse_inactive


def build_parser():
    p = ArgumentParser(prog="cpcourse models", description=__doc__.split("\n")[0])
    p.add_argument("--arch", required=True, help=f"one of {', '.join(ARCHS)}")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks (CP degree), default 2 (with --layout: its world size)")
    p.add_argument("--layout", default=None,
                   help="a mesh, e.g. cfg=2,ulysses=2,ring=1,tp=1 (instead of --method)")
    p.add_argument("--method", default="ring", help=f"one of {', '.join(METHODS)} (ring)")
    p.add_argument("--ulysses", type=int, default=None,
                   help="usp: ranks per Ulysses group (default: the largest that fits)")
    p.add_argument("--ring-mode", choices=("overlap", "blocking"), default="overlap")
    p.add_argument("--frames", type=int, default=5, help="latent frames (default 5)")
    p.add_argument("--height", type=int, default=8, help="latent height (default 8)")
    p.add_argument("--width", type=int, default=8, help="latent width (default 8)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--seed", type=int, default=0, help="weights and inputs seed")
    p.add_argument("--sample-steps", type=int, default=None,
                   help="run N steps of the model's scheduler with CFG instead of one forward")
    p.add_argument("--cfg-scale", type=float, default=5.0)
    p.add_argument("--split", choices=SPLITS, default="frames",
                   help="whole latent frames per rank (default) or the tokens split evenly")
    p.add_argument("--shard-io", action="store_true",
                   help="the model takes and returns frame shards; gathered once at the end")
    p.add_argument("--repeat", type=int, default=3, help="timed runs after a warm-up (3)")
    p.add_argument("--compare", action="store_true",
                   help="also run in this process: max_abs_err, seconds_single")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# Where each flag acts: every flag once (see cpcourse.support.modes).
MODE_FLAGS = {"arch": ALWAYS, "nproc": ALWAYS, "layout": ALWAYS, "method": "no_layout",
              "ulysses": "usp", "ring_mode": "ring", "frames": ALWAYS, "height": ALWAYS,
              "width": ALWAYS, "batch": ALWAYS, "dtype": ALWAYS, "seed": ALWAYS,
              "sample_steps": ALWAYS, "cfg_scale": "sampling", "shard_io": "one_forward",
              "split": "no_layout",
              "repeat": ALWAYS, "compare": ALWAYS, "timeout": ALWAYS, "json": ALWAYS}


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    """Which of MODE_FLAGS' conditions these arguments meet, and what each needs."""
    layout, method, sampling = args.layout is not None, args.method, args.sample_steps is not None
    return {"no_layout": (not layout, "no --layout (a layout sets the ring and Ulysses degrees)"),
            "usp": (method == "usp" and not layout, "--method usp (the Ulysses group size)"),
            "ring": (method in ("ring", "usp") or layout, "a ring: --method ring or usp, or a "
                     "--layout"),
            "sampling": (sampling, "--sample-steps N (one forward takes no guidance)"),
            "one_forward": (not sampling, "one forward: the sampler gathers its frames "
                            "itself, so drop --sample-steps")}


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    require(args.arch in ARCHS, f"--arch must be one of {', '.join(ARCHS)}, got {args.arch!r}")
    steps = args.sample_steps
    if steps is not None:
        require(1 <= positive_int("--sample-steps", steps) <= 50, "--sample-steps: use 1 to 50")
    require(0 <= positive_int("--repeat", args.repeat, allow_zero=True) <= 20,
            "--repeat: use 0 to 20")
    require(1 <= positive_int("--batch", args.batch) <= 4, "--batch: use 1 to 4")
    layout = None
    if args.layout is not None:
        from cpcourse.support.layout import Layout

        layout = Layout.parse(args.layout)
        args.nproc = layout.world if args.nproc is None else args.nproc
        require(layout.world == args.nproc, f"--layout {layout} needs {layout.world} ranks: "
                f"pass --nproc {layout.world} (or leave --nproc out)")
        layout = layout.as_dict()
    args.nproc = 2 if args.nproc is None else args.nproc
    spec = {"arch": args.arch, "method": args.method, "layout": layout, "frames": args.frames,
            "height": args.height, "width": args.width, "batch": args.batch,
            "dtype": args.dtype, "seed": args.seed, "ulysses": args.ulysses,
            "ring_mode": args.ring_mode, "shard_io": args.shard_io, "repeat": args.repeat,
            "split": args.split,
            "sample_steps": steps, "cfg_scale": args.cfg_scale}
    timeout = positive_float("--timeout", args.timeout, high=3600)
    check_spec(spec, positive_int("--nproc", args.nproc))  # every refusal before a line
    with running(args.nproc, f"diffusers' {args.arch} under CP" + (
            ", then in one process to compare" if args.compare else "")):
        report = run_models(spec, args.nproc, compare=args.compare, timeout=timeout)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    what = f"{steps} sampler steps" if steps else "one forward"
    how = f"layout {args.layout}" if layout else args.method
    shards = (f"latent frames per rank {report['frame_sizes']}" if report["frame_sizes"] else
              "split by tokens")
    print(f"{args.arch} ({report['tokens']} video tokens, {shards}, busiest rank "
          f"{max(report['tokens_per_rank'])} tokens), {how} on {args.nproc} ranks "
          f"(ulysses {report['ulysses']} x ring {report['ring']}), {what}")
    if layout:
        sent = report["bytes_by_dim_per_rank"][0]
        dims = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sent.items() if v) or "nothing"
        print(f"  rank 0 sent {dims} in the run (as predicted: "
              f"{report['bytes_match_prediction']})")
    if report["seconds_cp"]:
        print(f"  under CP: {report['seconds_cp'] * 1e3:.1f} ms")
    if args.compare:
        ok = "within" if report["within_tolerance"] else "OUTSIDE"
        print(f"  max |CP - one process| = {report['max_abs_err']:.2e} ({ok} the {args.dtype} "
              f"tolerance {report['tolerance']:.2e}; outputs up to "
              f"{report['max_abs_output']:.2f})")
        if report["seconds_single"]:
            print(f"  one process, {report['threads_single']} threads: "
                  f"{report['seconds_single'] * 1e3:.1f} ms")
    return 0
