"""`cpcourse vae`: a tiny real diffusers video VAE decoded on P ranks split along height.

    cpcourse vae --arch wan --nproc 3 --compare --json

Builds diffusers' own VAE (`cpcourse.models.vae`: tiny config, seeded random weights, no
download) on every rank and decodes the same seeded latents of a `--frames` x `--height` x
`--width` pixel video, each rank its rows, halo rows exchanged with its neighbours. `--compare`
decodes in this process too: the largest difference and both peaks and times. `--tiled` adds
diffusers' own tiled decode (small tiles), its error at the seams and inside. `--save` writes
the decoded video `[B, 3, F, H, W]` (torch.save); the same seed gives the same pixels at any P.
The flags are the fields of `cpcourse.runs.vae.VaeRequest` (`cpcourse.support.request_flags`).
JSON keys: arch, nproc, dtype, video_shape, rows_per_rank, seconds_cp, peak_bytes_per_rank,
halo_bytes, and with --compare max_abs_err, tolerance, within_tolerance, peak_bytes_single,
predicted_peak_bytes_per_rank, seconds_single; with --tiled "tiled".
"""

from __future__ import annotations

import json

from cpcourse.cli.progress import running
from cpcourse.runs.vae import VaeRequest, run
from cpcourse.support.request_flags import build_parser as request_parser
from cpcourse.support.request_flags import mode_table, request_conditions, request_from_args

MODE_FLAGS = mode_table(VaeRequest)  # every flag of `vae` always acts


def build_parser():
    return request_parser("cpcourse vae", VaeRequest, __doc__.split("\n")[0])


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    return request_conditions(VaeRequest, args)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    req = request_from_args(parser, VaeRequest, args)
    with running(req.nproc, f"{req.arch}'s VAE decode split by rows" + (
            ", then in one process to compare" if req.compare else "")):
        report = run(req)
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
