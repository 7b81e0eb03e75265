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
The flags are the fields of `cpcourse.runs.models.ModelsRequest` (`cpcourse.support.request_flags`).
"""

from __future__ import annotations

import json

from cpcourse.cli.progress import running
from cpcourse.runs.models import ModelsRequest, run
from cpcourse.support.request_flags import build_parser as request_parser
from cpcourse.support.request_flags import mode_table, request_conditions, request_from_args

# Where each flag acts: every flag once (see cpcourse.support.modes), from the Request's fields.
MODE_FLAGS = mode_table(ModelsRequest)


def build_parser():
    return request_parser("cpcourse models", ModelsRequest, __doc__.split("\n")[0])


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    """Which of MODE_FLAGS' conditions these arguments meet, and what each needs."""
    return request_conditions(ModelsRequest, args)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    req = request_from_args(parser, ModelsRequest, args)  # every refusal before a line
    with running(req.nproc, f"diffusers' {req.arch} under CP" + (
            ", then in one process to compare" if req.compare else "")):
        report = run(req)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    _print(report, req)
    return 0


def _print(report: dict, req: ModelsRequest) -> None:
    steps = req.sample_steps
    what = f"{steps} sampler steps" if steps else "one forward"
    how = f"layout {req.layout}" if req.layout is not None else req.method
    shards = (f"latent frames per rank {report['frame_sizes']}" if report["frame_sizes"] else
              "split by tokens")
    print(f"{req.arch} ({report['tokens']} video tokens, {shards}, busiest rank "
          f"{max(report['tokens_per_rank'])} tokens), {how} on {req.nproc} ranks "
          f"(ulysses {report['ulysses']} x ring {report['ring']}), {what}")
    if req.layout is not None:
        sent = report["bytes_by_dim_per_rank"][0]
        dims = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sent.items() if v) or "nothing"
        print(f"  rank 0 sent {dims} in the run (as predicted: "
              f"{report['bytes_match_prediction']})")
    if report["seconds_cp"]:
        print(f"  under CP: {report['seconds_cp'] * 1e3:.1f} ms")
    if req.compare:
        ok = "within" if report["within_tolerance"] else "OUTSIDE"
        print(f"  max |CP - one process| = {report['max_abs_err']:.2e} ({ok} the {req.dtype} "
              f"tolerance {report['tolerance']:.2e}; outputs up to "
              f"{report['max_abs_output']:.2f})")
        if report["seconds_single"]:
            print(f"  one process, {report['threads_single']} threads: "
                  f"{report['seconds_single'] * 1e3:.1f} ms")
