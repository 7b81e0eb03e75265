"""`cpcourse vae`: a tiny real diffusers video VAE decoded on P ranks split along height.

    cpcourse vae --arch wan --nproc 3 --compare --json

Builds diffusers' own VAE (`cpcourse.models.vae`: tiny config, seeded random weights, no
download) on every rank and decodes the same seeded latents of a `--frames` x `--height` x
`--width` pixel video, each rank its rows, halo rows exchanged with its neighbours. `--compare`
decodes in this process too: the largest difference and both peaks and times. `--tiled` adds
diffusers' own tiled decode (small tiles), its error at the seams and inside. `--save` writes
the decoded video `[B, 3, F, H, W]` (torch.save); the same seed gives the same pixels at any P.
JSON keys: arch, nproc, dtype, video_shape, rows_per_rank, seconds_cp, peak_bytes_per_rank,
halo_bytes, and with --compare max_abs_err, tolerance, within_tolerance, peak_bytes_single,
predicted_peak_bytes_per_rank, seconds_single; with --tiled "tiled".
"""

from __future__ import annotations

import json

from cpcourse.models.vae import ARCHS
from cpcourse.runs.vae import DTYPES, check_vae_spec, run_vae
from cpcourse.support.errors import ArgumentParser, positive_float, positive_int
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.support.out_files import check_output


def build_parser():
    p = ArgumentParser(prog="cpcourse vae", description=__doc__.split("\n")[0])
    p.add_argument("--arch", required=True, help=f"one of {', '.join(ARCHS)}")
    p.add_argument("--nproc", type=int, default=2, help="ranks splitting the height (2)")
    p.add_argument("--frames", type=int, default=5, help="video frames, 4k + 1 (5)")
    p.add_argument("--height", type=int, default=64, help="video height, a multiple of 8 (64)")
    p.add_argument("--width", type=int, default=48, help="video width, a multiple of 8 (48)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--seed", type=int, default=0, help="weights and latents seed")
    p.add_argument("--save", default=None, help="write the decoded video here (torch.save)")
    p.add_argument("--force", action="store_true", help="--save may replace an existing file")
    p.add_argument("--tiled", action="store_true",
                   help="also diffusers' tiled decode: its error at the seams and inside")
    p.add_argument("--compare", action="store_true",
                   help="also decode in this process: max_abs_err, peak_bytes_single")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# Where each flag acts: every flag once (see cpcourse.support.modes). Every flag always acts.
MODE_FLAGS = {"arch": ALWAYS, "nproc": ALWAYS, "frames": ALWAYS, "height": ALWAYS,
              "width": ALWAYS, "dtype": ALWAYS, "seed": ALWAYS, "save": ALWAYS, "tiled": ALWAYS,
              "compare": ALWAYS, "timeout": ALWAYS, "json": ALWAYS, "force": "save"}


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    """--force acts only on a --save file."""
    return {"save": (args.save is not None, "--save FILE (a file it may replace)")}


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    nproc = positive_int("--nproc", args.nproc)
    positive_int("--seed", args.seed, allow_zero=True)
    spec = {"arch": args.arch, "frames": args.frames, "height": args.height,
            "width": args.width, "dtype": args.dtype, "seed": args.seed, "save": args.save}
    check_vae_spec(spec, nproc)
    if args.save is not None:  # before the decode: a bad path costs no minutes
        check_output(args.save, args.force, "--save")
    report = run_vae(spec, nproc, compare=args.compare, tiled=args.tiled,
                     timeout=positive_float("--timeout", args.timeout, high=3600))
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    _print(report, args)
    return 0


def _print(report: dict, args) -> None:
    mb = 1e6
    print(f"{args.arch} VAE, video {report['video_shape']} from latents "
          f"{report['latent_shape']}, latent rows per rank {report['rows_per_rank']}")
    print(f"  on {report['nproc']} ranks: {report['seconds_cp'] * 1e3:.1f} ms, peak per rank "
          f"{max(report['peak_bytes_per_rank']) / mb:.2f} MB, halo rows sent "
          f"{max(report['halo_bytes']) / mb:.3f} MB (busiest rank)")
    if "max_abs_err" in report:
        ok = "within" if report["within_tolerance"] else "OUTSIDE"
        print(f"  max |CP - one process| = {report['max_abs_err']:.2e} ({ok} the "
              f"{report['dtype']} tolerance {report['tolerance']:.0e})")
        print(f"  one process: {report['seconds_single'] * 1e3:.1f} ms, peak "
              f"{report['peak_bytes_single'] / mb:.2f} MB (predicted per rank "
              f"{report['predicted_peak_bytes_per_rank'] / mb:.2f} MB, measured "
              f"{report['peak_ratio']:.2f} x one process)")
    if "tiled" in report:
        t = report["tiled"]
        print(f"  tiled decode ({t['tile']}-pixel tiles, stride {t['tile_stride']}): max error "
              f"{t['max_abs_err_seams']:.3f} at seams, {t['max_abs_err_interior']:.3f} inside")
    if report.get("saved"):
        print(f"  saved {report['saved']}")
