"""cpcourse bench NAME [--json] ...: benchmarks, one module each, every ratio measured in one run.

    cpcourse bench kernel --json          # attention_with_lse vs fused SDPA vs naive
    cpcourse bench ring --nproc 2 --json  # ring variants vs all-gather, Ulysses, torch CP
    cpcourse bench launch --json          # launch(): start-up, error latency, orphans
    cpcourse bench shapes --json          # does the trained model draw what it is asked?
    cpcourse bench models --json          # real Wan under CP vs one process, and diffusers' CP
    cpcourse bench windows --json         # long videos: flat memory, seams, exactness
    cpcourse bench mesh --json            # CFG-parallel vs CFG in one process; each mesh dim
    cpcourse bench vae --json             # the VAE decode on 2 ranks vs one process
    cpcourse bench approx --json          # approximate CP: motion, PSNR and bytes per method
    cpcourse bench gpu --json             # the GPU check in tools/gpu_check/ (--dry-run: CPU)
    cpcourse bench sparse --json          # sparse attention under CP: work, balance, bytes
    cpcourse bench tiling --json          # Attention2D on grids of 4 and 9 ranks: error, bytes

Each benchmark lives in `cpcourse/bench/<name>.py` and exposes `main(argv) -> int`.
"""

from __future__ import annotations

import importlib
import sys

from cpcourse.support.errors import InputError, did_you_mean

BENCHMARKS = {
    "kernel": "attention_with_lse against fused SDPA and naive attention, several L",
    "ring": "overlapped / blocking / all-gather ring, Ulysses, torch CP, one-process fused",
    "launch": "launch(): start-up time, error latency, processes left after a kill",
    "shapes": "the trained shapes model: tracked direction, shape and presence per prompt",
    "models": "real Wan under CP at 8k tokens vs one process, and diffusers' own CP",
    "windows": "long videos: memory and time vs length, seams, both parallel modes exact",
    "mesh": "CFG-parallel on 2 ranks vs CFG in one process; ring, ulysses, tp at 2 ranks",
    "vae": "the VAE decode split over 2 ranks vs one process: time and peak per rank",
    "approx": "approximate CP (naive, displaced, pipefusion, asyncdiff, fbcache) vs exact",
    "gpu": "the prepared GPU check (tools/gpu_check/ of a checkout): CUDA tests, kernel rates",
    "sparse": "sparse attention under CP: error, work, imbalance and bytes per method x mask",
    "tiling": "Attention2D on 1x4, 2x2, 4x1 and 3x3 grids: error vs one process, bytes vs formula",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: cpcourse bench {" + ",".join(BENCHMARKS) + "} [--json] ...")
        for name, what in BENCHMARKS.items():
            print(f"  {name:8s} {what}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        raise InputError(f"unknown benchmark {name!r}: {did_you_mean(name, BENCHMARKS)}use one "
                         f"of {', '.join(BENCHMARKS)}")
    try:
        module = importlib.import_module(f"cpcourse.bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"cpcourse.bench.{name}":
            raise
        raise InputError(f"benchmark {name!r} is not part of this version of cpcourse") from None
    return int(module.main(rest) or 0)
