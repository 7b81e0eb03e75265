"""A video VAE decoded on P ranks split along height, against one process: `cpcourse vae`.

    cpcourse vae --arch wan --nproc 3 --compare --json

`run(VaeRequest(arch="wan", nproc=3, compare=True))` (the request checks itself: arch, frames,
height, width in pixels, dtype, seed; `run_vae(dict, nproc)` takes a dict of its fields)
decodes the same seeded latents with the same seeded weights on `nproc` ranks
(`cpcourse.models.vae.decode_cp`) and reports the slowest rank's time, each rank's measured
peak (the decode of its rows, `cpcourse.support.peak_memory`) beside the predicted
~1/P + halo figure, and the halo bytes it sent. With `compare` it decodes in this process too
(max_abs_err, tolerance, peak_bytes_single, seconds_single); with `tiled` it also runs
diffusers' own tiled decode with small tiles and reports its error at the seams and inside.
With `naive_norm` the ranks also decode with GroupNorm's statistics left per rank (the
naive split, wrong on purpose) and `compare` reports that error too (notebook 12).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cpcourse.launch import launch
from cpcourse.models.vae import (
    ARCHS,
    build_vae,
    check_video_size,
    decode_cp,
    decode_rows,
    example_latents,
    predicted_peak_per_rank,
    split_rows,
)
from cpcourse.support.errors import require
from cpcourse.support.out_files import check_output, write_output
from cpcourse.support.peak_memory import peak_memory, require_fits
from cpcourse.support.request import check_common, flag, request_of
from cpcourse.support.tolerance import tolerance

DTYPES = ("float32", "float64", "bfloat16")
TILE = (32, 24)  # pixel tile and stride for --tiled: 8 blended rows at each seam of a small video


@dataclass(frozen=True)
class VaeRequest:
    """One parallel decode, checked: the fields are `cpcourse vae`'s flags (one declaration)."""

    arch: str = flag(help=f"one of {', '.join(ARCHS)}", choices=ARCHS)
    nproc: int = flag(2, "ranks splitting the height")
    frames: int = flag(5, "video frames, 4k + 1")
    height: int = flag(64, "video height in pixels, a multiple of 8")
    width: int = flag(48, "video width in pixels, a multiple of 8")
    dtype: str = flag("float32", "the VAE's dtype", choices=DTYPES)
    seed: int = flag(0, "weights and latents seed")
    save: str | None = flag(None, "write the decoded video here (torch.save)")
    force: bool = flag(False, "--save may replace an existing file", acts="save")
    tiled: bool = flag(False, "also diffusers' tiled decode: its error at the seams and inside")
    compare: bool = flag(False, "also decode in this process: max_abs_err, peak_bytes_single")
    timeout: float = flag(300.0, "seconds the ranks may run")
    naive_norm: bool = flag(False, "also decode with GroupNorm's statistics per rank (wrong on "
                            "purpose: notebook 12)", cli=False)

    def __post_init__(self):
        check_common(self)
        latent = self.latent  # [F', H', W'], checked against the VAE's compression
        require(self.frames <= 257, "frames: use at most 257 (a tiny VAE on a CPU)")
        for name in ("height", "width"):
            require(getattr(self, name) <= 4096, f"{name}: use at most 4096 pixels")
        # one process holds a few full-resolution activations of 8 channels (the tiny VAE's widest)
        require_fits(6 * 8 * 4 * self.frames * self.height * self.width,
                     "this decode", "use a smaller `frames`, `height` or `width`")
        require(self.nproc <= latent[1], f"nproc {self.nproc} is more ranks than the {latent[1]} "
                f"latent rows of height {self.height}: use nproc={latent[1]} or fewer, or "
                f"height={8 * self.nproc} or more")
        if self.save is not None:  # before the decode: a bad path costs no minutes
            check_output(self.save, self.force, "save")

    @staticmethod
    def conditions(values: dict) -> dict[str, tuple[bool, str]]:
        """`force` acts only on a `save` file."""
        return {"save": (values["save"] is not None, "--save FILE (a file it may replace)")}

    @property
    def latent(self) -> tuple[int, int, int]:
        """The latents' (frames, height, width) for this video size."""
        return check_video_size(self.arch, self.frames, self.height, self.width)


def as_request(spec, **overrides) -> VaeRequest:
    """A VaeRequest from a VaeRequest or a dict of its fields (notebooks write dicts)."""
    return request_of(VaeRequest, spec, **overrides)


def check_vae_spec(spec, nproc: int) -> tuple[int, int, int]:
    """The latent (frames, height, width) of `spec` on `nproc` ranks, or InputError."""
    return as_request(spec, nproc=nproc).latent


def _setup(req: VaeRequest):
    dtype = getattr(torch, req.dtype)
    vae = build_vae(req.arch, seed=req.seed, dtype=dtype)
    z = example_latents(req.arch, req.frames, req.height, req.width, seed=req.seed, dtype=dtype)
    return vae, z  # z: [1, C, F', H', W']


def rank_decode(req: VaeRequest) -> dict:
    """On each rank: the decode's time, the peak of this rank's rows, its halo bytes."""
    import torch.distributed as dist

    vae, z = _setup(req)
    with torch.inference_mode():
        (_, split), peak = peak_memory(decode_rows, vae, z)
        dist.barrier()
        t0 = time.perf_counter()
        out = decode_cp(vae, z)  # [1, 3, F, H, W]: every rank holds the whole video
        seconds = time.perf_counter() - t0
        naive = decode_cp(vae, z, sync_norm=False) if req.naive_norm else None
    first = dist.get_rank() == 0
    return {"seconds": seconds, "peak_bytes": peak, "halo_bytes": split.halo_bytes,
            "sizes": split.sizes, "out": out if first else None,
            "naive": naive if first else None}


def single_decode(spec, threads: int | None = None):
    """One process with `threads` torch threads (default: as now): (video [1, 3, F, H, W],
    seconds, peak bytes). `spec`: a VaeRequest or a dict of its fields."""
    vae, z = _setup(as_request(spec))
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


def seam_errors(spec, exact: torch.Tensor) -> dict:
    """diffusers' tiled decode with TILE-pixel tiles: max error at seam rows and elsewhere.

    A seam row (or column) is one of the `tile - stride` rows where a tile is blended into the
    one above (left of) it; every other pixel is interior."""
    vae, z = _setup(as_request(spec))
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


def run_vae(spec, nproc: int, compare: bool = True, tiled: bool = False,
            timeout: float = 300.0, stream=False) -> dict:
    """`run(...)` for a dict of VaeRequest's fields (notebooks and benchmarks write dicts)."""
    return run(as_request(spec, nproc=nproc, compare=compare, tiled=tiled, timeout=timeout),
               stream=stream)


def run(req: VaeRequest, stream=False) -> dict:
    """Decode `req`'s latents on `req.nproc` ranks (and in one process with `req.compare`)."""
    results = launch(rank_decode, req.nproc, timeout=req.timeout, args=(req,), stream=stream,
                     threads=1)
    out = results[0]["out"]  # [1, 3, F, H, W]
    sizes = split_rows(req.latent[1], req.nproc)
    report = {"arch": req.arch, "nproc": req.nproc, "dtype": req.dtype,
              "video_shape": list(out.shape), "latent_shape": [1, 4, *req.latent],
              "rows_per_rank": sizes, "seconds_cp": max(r["seconds"] for r in results),
              "peak_bytes_per_rank": [r["peak_bytes"] for r in results],
              "halo_bytes": [r["halo_bytes"] for r in results]}
    if req.compare or req.tiled:
        report.update(compare_with_one_process(req, out, results[0]["naive"], report))
    if req.save:
        write_output(req.save, lambda tmp: torch.save(out, tmp), "save")
        report["saved"] = req.save
    return report


def compare_with_one_process(req: VaeRequest, out: torch.Tensor, naive, report: dict) -> dict:
    """The ranks' video against this process's decode: error, tolerance, peaks, seams."""
    # as many threads as there are ranks (one each): the same cores, used two ways
    ref, seconds, peak = single_decode(req, threads=req.nproc)
    err = float((out.double() - ref.double()).abs().max())
    # convs on a halo-padded slice and GroupNorm sums all-reduced round in another order
    # than the whole: a merge's limit (`cpcourse.support.tolerance`); outputs lie in [-1, 1]
    tol = tolerance("height_split", req.dtype)
    sizes = report["rows_per_rank"]
    extra = {"max_abs_err": err, "tolerance": tol, "within_tolerance": err <= tol,
             "seconds_single": seconds, "threads_single": req.nproc, "peak_bytes_single": peak,
             "predicted_peak_bytes_per_rank": predicted_peak_per_rank(peak, sizes),
             "peak_ratio": max(report["peak_bytes_per_rank"]) / peak}
    if naive is not None:
        extra["max_abs_err_naive_norm"] = float((naive.double() - ref.double()).abs().max())
    if req.tiled:
        extra["tiled"] = seam_errors(req, ref)
    return extra
