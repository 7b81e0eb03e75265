"""A video VAE decoded on P ranks split along height, against one process: `cpcourse vae`.

    cpcourse vae --arch wan --nproc 3 --compare --json

`run_vae(spec, nproc)` checks `spec` (arch, frames, height, width in pixels, dtype, seed),
decodes the same seeded latents with the same seeded weights on `nproc` ranks
(`cpcourse.models.vae.decode_cp`) and reports the slowest rank's time, each rank's measured
peak (the decode of its rows, `cpcourse.support.peak_memory`) beside the predicted
~1/P + halo figure, and the halo bytes it sent. With `compare` it decodes in this process too
(max_abs_err, tolerance, peak_bytes_single, seconds_single); with `tiled` it also runs
diffusers' own tiled decode with small tiles and reports its error at the seams and inside.
With `spec["naive_norm"]` the ranks also decode with GroupNorm's statistics left per rank (the
naive split, wrong on purpose) and `compare` reports that error too (notebook 12).
"""

from __future__ import annotations

import time

import torch

from cpcourse.launch import check_nproc, launch
from cpcourse.models.vae import (
    build_vae,
    check_video_size,
    decode_cp,
    decode_rows,
    example_latents,
    predicted_peak_per_rank,
    split_rows,
)
from cpcourse.support.errors import require
from cpcourse.support.peak_memory import peak_memory, require_fits
from cpcourse.support.tolerance import tolerance

DTYPES = ("float32", "float64", "bfloat16")
TILE = (32, 24)  # pixel tile and stride for --tiled: 8 blended rows at each seam of a small video


def check_vae_spec(spec: dict, nproc: int) -> tuple[int, int, int]:
    """The latent (frames, height, width), or InputError before any process starts."""
    latent = check_video_size(spec["arch"], spec["frames"], spec["height"], spec["width"])
    require(0 <= spec.get("seed", 0) < 2**63, "--seed must be 0 to 2**63 - 1")
    require(spec["frames"] <= 257, "--frames: use at most 257 (a tiny VAE on a CPU)")
    for flag in ("height", "width"):
        require(spec[flag] <= 4096, f"--{flag}: use at most 4096 pixels")
    # one process holds a few full-resolution activations of 8 channels (the tiny VAE's widest)
    require_fits(6 * 8 * 4 * spec["frames"] * spec["height"] * spec["width"],
                 "this decode", "use a smaller --frames, --height or --width")
    require(spec.get("dtype", "float32") in DTYPES, f"--dtype must be one of {', '.join(DTYPES)}")
    require(nproc <= latent[1], f"--nproc {nproc} is more ranks than the {latent[1]} latent rows "
            f"of --height {spec['height']}: use --nproc {latent[1]} or fewer, or --height "
            f"{8 * nproc} or more")
    return latent


def _setup(spec: dict):
    dtype = getattr(torch, spec.get("dtype", "float32"))
    vae = build_vae(spec["arch"], seed=spec["seed"], dtype=dtype)
    z = example_latents(spec["arch"], spec["frames"], spec["height"], spec["width"],
                        seed=spec["seed"], dtype=dtype)
    return vae, z


def rank_decode(spec: dict) -> dict:
    """On each rank: the decode's time, the peak of this rank's rows, its halo bytes."""
    import torch.distributed as dist

    vae, z = _setup(spec)
    with torch.inference_mode():
        (_, split), peak = peak_memory(decode_rows, vae, z)
        dist.barrier()
        t0 = time.perf_counter()
        out = decode_cp(vae, z)
        seconds = time.perf_counter() - t0
        naive = decode_cp(vae, z, sync_norm=False) if spec.get("naive_norm") else None
    first = dist.get_rank() == 0
    return {"seconds": seconds, "peak_bytes": peak, "halo_bytes": split.halo_bytes,
            "sizes": split.sizes, "out": out if first else None,
            "naive": naive if first else None}


def single_decode(spec: dict, threads: int | None = None):
    """One process with `threads` torch threads (default: as now): (video, seconds, peak)."""
    vae, z = _setup(spec)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        with torch.inference_mode():
            _, peak = peak_memory(lambda: vae.decode(z).sample)
            t0 = time.perf_counter()
            out = vae.decode(z).sample
            return out, time.perf_counter() - t0, peak
    finally:
        torch.set_num_threads(before)


def seam_errors(spec: dict, exact: torch.Tensor) -> dict:
    """diffusers' tiled decode with TILE-pixel tiles: max error at seam rows and elsewhere.

    A seam row (or column) is one of the `tile - stride` rows where a tile is blended into the
    one above (left of) it; every other pixel is interior."""
    vae, z = _setup(spec)
    size, stride = TILE
    vae.enable_tiling(tile_sample_min_height=size, tile_sample_min_width=size,
                      tile_sample_stride_height=stride, tile_sample_stride_width=stride)
    with torch.inference_mode():
        tiled = vae.decode(z).sample
    err = (tiled.double() - exact.double()).abs().amax(dim=(0, 1, 2))  # [H, W]
    rows = torch.arange(err.shape[0])
    cols = torch.arange(err.shape[1])

    def seam(i):
        return (i >= stride) & (i % stride < size - stride)

    mask = seam(rows)[:, None] | seam(cols)[None, :]
    return {"tile": size, "tile_stride": stride, "seam_pixels": int(mask.sum()),
            "max_abs_err_seams": float(err[mask].max()) if mask.any() else 0.0,
            "max_abs_err_interior": float(err[~mask].max()) if (~mask).any() else 0.0}


def run_vae(spec: dict, nproc: int, compare: bool = True, tiled: bool = False,
            timeout: float = 300.0, stream=False) -> dict:
    """Decode `spec`'s latents on `nproc` ranks (and in one process with `compare`)."""
    nproc = check_nproc(nproc)
    latent = check_vae_spec(spec, nproc)
    results = launch("cpcourse.runs.vae:rank_decode", nproc, timeout=timeout, args=(spec,),
                     stream=stream, threads=1)
    out = results[0]["out"]
    sizes = split_rows(latent[1], nproc)
    report = {"arch": spec["arch"], "nproc": nproc, "dtype": spec.get("dtype", "float32"),
              "video_shape": list(out.shape), "latent_shape": [1, 4, *latent],
              "rows_per_rank": sizes, "seconds_cp": max(r["seconds"] for r in results),
              "peak_bytes_per_rank": [r["peak_bytes"] for r in results],
              "halo_bytes": [r["halo_bytes"] for r in results]}
    if compare or tiled:
        # as many threads as there are ranks (one each): the same cores, used two ways
        ref, seconds, peak = single_decode(spec, threads=nproc)
        err = float((out.double() - ref.double()).abs().max())
        # convs on a halo-padded slice and GroupNorm sums all-reduced round in another order
        # than the whole: a merge's limit (`cpcourse.support.tolerance`); outputs lie in [-1, 1]
        tol = tolerance("height_split", report["dtype"])
        if results[0]["naive"] is not None:
            report["max_abs_err_naive_norm"] = float((results[0]["naive"].double()
                                                      - ref.double()).abs().max())
        report.update(max_abs_err=err, tolerance=tol, within_tolerance=err <= tol,
                      seconds_single=seconds, threads_single=nproc, peak_bytes_single=peak,
                      predicted_peak_bytes_per_rank=predicted_peak_per_rank(peak, sizes),
                      peak_ratio=max(report["peak_bytes_per_rank"]) / peak)
        if tiled:
            report["tiled"] = seam_errors(spec, ref)
    if spec.get("save"):
        from cpcourse.support.out_files import write_output

        write_output(spec["save"], lambda tmp: torch.save(out, tmp), "--save")
        report["saved"] = spec["save"]
    return report
