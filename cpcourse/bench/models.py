"""`cpcourse bench models`: real Wan under CP at a compute-bound size, and diffusers' own CP.

    cpcourse bench models --nproc 2 --json

Wan's own diffusers class with 4 heads x 64, 2 layers and 8 x 64 x 64 latents (8,192 tokens after
2 x 2 patches): attention dominates, so splitting it shows. The ratio `seconds_cp /
seconds_single` compares P ranks with one thread each against one process with P threads (the
same cores), measured in one run, medians of `--repeat` forwards. Then the same model through
diffusers' own `enable_parallelism` (Ulysses and ring), unpatched: where it cannot run, the
reason is reported in one line, as it was raised. Both run through `cpcourse.runs.models`.
"""

from __future__ import annotations

import json

from cpcourse.launch import launch
from cpcourse.runs.models import run_models
from cpcourse.support.errors import (
    ArgumentParser,
    InputError,
    positive_float,
    positive_int,
    require,
)

BENCH_CONFIG = {"num_attention_heads": 4, "attention_head_dim": 64, "ffn_dim": 256,
                "num_layers": 2}


def _methods(text: str, base: dict, nproc: int) -> list[str]:
    """--methods, each checked as `run_models` will check it, before the first one runs (a bad
    second method used to be refused only after the first had run in full)."""
    from cpcourse.launch import check_nproc
    from cpcourse.runs.models import ModelsRequest

    check_nproc(nproc, "--nproc")
    methods = text.split(",")
    for method in methods:
        try:
            ModelsRequest(**base, method=method, nproc=nproc)
        except InputError as exc:
            raise InputError(f"--methods {method!r}: {exc}") from None
    return methods


def main(argv: list[str]) -> int:
    from cpcourse.launch import LaunchError

    p = ArgumentParser(prog="cpcourse bench models", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=64, help="latent height = width (64)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--methods", default="ring,ulysses")
    p.add_argument("--no-diffusers", action="store_true", help="skip diffusers' own CP")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    nproc = positive_int("--nproc", args.nproc)
    size = positive_int("--size", args.size)
    require(size % 2 == 0 and size <= 128, "--size must be even and at most 128")
    repeat = positive_int("--repeat", args.repeat)
    require(repeat <= 10, "--repeat: use at most 10")
    timeout = positive_float("--timeout", args.timeout, high=3600)
    base = {"arch": "wan", "frames": positive_int("--frames", args.frames), "height": size,
            "width": size, "seed": 0, "repeat": repeat, "config": BENCH_CONFIG}
    report = {"arch": "wan", "config": BENCH_CONFIG, "latents": [1, 4, args.frames, size, size],
              "nproc": nproc, "threads_per_rank": 1, "threads_single": nproc, "runs": []}
    methods = _methods(args.methods, base, nproc)
    for method in methods:
        r = run_models({**base, "method": method}, nproc, timeout=timeout)
        report["tokens"] = r["tokens"]
        report["runs"].append({k: r[k] for k in ("method", "seconds_cp", "seconds_single",
                                                 "ratio_cp_to_single", "max_abs_err",
                                                 "within_tolerance")})
        if not args.json:
            print(f"{method:9s} {nproc} ranks x 1 thread: {r['seconds_cp']:.3f} s; one process "
                  f"x {nproc} threads: {r['seconds_single']:.3f} s; ratio "
                  f"{r['ratio_cp_to_single']:.2f}; max err {r['max_abs_err']:.1e}")
    if not args.no_diffusers:
        report["diffusers"] = []
        for method in ("ulysses", "ring"):
            spec = {**base, "method": method, "nproc": nproc}
            try:
                res = launch("cpcourse.runs.models:diffusers_cp_rank", nproc, timeout=timeout,
                             args=(spec,), stream=False)
                row = {k: v for k, v in res[0].items() if k != "out"}
            except LaunchError as exc:
                row = {"ran": False, "reason": exc.summary()}
            report["diffusers"].append({"method": method, **row})
            if not args.json:
                print(f"diffusers enable_parallelism ({method}): " + (
                    f"{row['seconds']:.3f} s" if row["ran"] else f"does not run: {row['reason']}"))
    if args.json:
        print(json.dumps(report, allow_nan=False))
    return 0
