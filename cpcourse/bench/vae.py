"""cpcourse bench vae [--json]: the parallel VAE decode at P = 2 against one process.

    cpcourse bench vae --json

Decodes Wan's VAE (tiny, seeded, `cpcourse.models.vae`) on 2 ranks with 1 thread each, and
in one process with 2 threads, at the same size (`cpcourse.runs.vae.run_vae`): the time ratio
and the busiest rank's peak against one process's (issue 28's targets: memory per rank at most
0.6x one process, time at most 1.2x), with the predicted ~1/P + halo peak beside it and the
error of the split decode, which must stay within the float32 tolerance.
"""

from __future__ import annotations

import json

from cpcourse.runs.vae import run_vae
from cpcourse.support.errors import ArgumentParser, positive_int

TARGETS = {"peak_ratio": 0.6, "time_ratio": 1.2}  # issue 28: per rank vs one process, at P = 2


def _parse(argv: list[str]):
    p = ArgumentParser(prog="cpcourse bench vae", description=__doc__.split("\n")[0])
    p.add_argument("--arch", choices=("wan", "hunyuanvideo"), default="wan")
    p.add_argument("--frames", type=int, default=9, help="video frames, 4k + 1 (9)")
    p.add_argument("--size", type=int, default=192, help="video height and width (192)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    size = positive_int("--size", args.size)
    spec = {"arch": args.arch, "frames": args.frames, "height": size, "width": size,
            "dtype": "float32", "seed": 0}
    r = run_vae(spec, 2, compare=True, timeout=600)
    time_ratio = r["seconds_cp"] / r["seconds_single"]
    report = {key: r[key] for key in ("arch", "nproc", "video_shape", "rows_per_rank",
                                      "max_abs_err", "tolerance", "within_tolerance",
                                      "seconds_cp", "seconds_single", "threads_single",
                                      "peak_bytes_per_rank", "peak_bytes_single",
                                      "predicted_peak_bytes_per_rank", "peak_ratio",
                                      "halo_bytes")}
    report.update(time_ratio=time_ratio, targets=TARGETS,
                  meets_targets={"peak_ratio": r["peak_ratio"] <= TARGETS["peak_ratio"],
                                 "time_ratio": time_ratio <= TARGETS["time_ratio"]})
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print(f"{args.arch} VAE, video {report['video_shape']}: 2 ranks x 1 thread vs one process "
          f"x 2 threads")
    print(f"  time {r['seconds_cp']:.2f} s vs {r['seconds_single']:.2f} s: {time_ratio:.2f}x "
          f"(target <= {TARGETS['time_ratio']})")
    print(f"  peak per rank {max(r['peak_bytes_per_rank']) / 1e6:.1f} MB vs "
          f"{r['peak_bytes_single'] / 1e6:.1f} MB: {r['peak_ratio']:.2f}x (target <= "
          f"{TARGETS['peak_ratio']}; predicted {r['predicted_peak_bytes_per_rank'] / 1e6:.1f} MB)")
    print(f"  max |CP - one process| = {r['max_abs_err']:.1e} (tolerance {r['tolerance']:.0e})")
    return 0
