"""The VAE decode split along height over the GPUs, priced: `--parallel-vae`.

    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --parallel-vae --json

Without it the decode runs whole on one GPU (`cpcourse.planner.fixed_costs`: Wan decodes on
rank 0, HunyuanVideo on every rank, neither divided). Split as `cpcourse.models.vae` does it
(latent rows `tensor_split` over the P ranks, halo rows exchanged before every convolution that
pads height, the mid-block attention's input all-gathered), the decode costs the busiest rank

    seconds  = serial x n_max / H_lat  +  bytes on the link / the link's rate
    bytes    = the halo the rank sends (per boundary x its neighbours, `support.height_split`)
               + the mid-block rows it gathers + the video's rows gathered on rank 0
    working  = the serial working set x (8 n_max + 2) / (8 H_lat) (`peak_share`), for a decode
               that is untiled; a tiled one (HunyuanVideo's released decode) keeps its tile's
               working set on every rank: the tile, not the rows, bounds it

The halo per boundary and the gathered elements were derived from diffusers' own VAE classes
run under the library's split on the meta device (tools/derive_vae_halo.py). The exchanges are
counted back to back with the convolutions (halo.py waits for each), at the link's rate with no
per-message latency: a few hundred messages per video. The GroupNorm all-reduce (HunyuanVideo:
three numbers per group) is left out.
"""

from __future__ import annotations

from cpcourse.planner.facts import vae_halo_table, vae_memory_table
from cpcourse.planner.hardware import get_gpu, link_for
from cpcourse.planner.tokens import ModelPreset, as_preset
from cpcourse.support.errors import InputError, require
from cpcourse.support.height_split import SPATIAL, neighbours, peak_share
from cpcourse.support.shards import shard_sizes

PIXEL_CHANNELS = 3  # the decoded video's channels


def check_splittable(model: ModelPreset | str) -> str:
    """The model's VAE family if the course can split its decode; InputError otherwise."""
    m = as_preset(model)
    fam = m.vae_family
    if fam not in vae_halo_table():
        raise InputError(f"parallel_vae: {m.id}'s VAE ({fam or 'not recorded'}) has no "
                         f"height split in the course (only {', '.join(vae_halo_table())})")
    return fam


def rows_per_rank(tok, ranks: int) -> list[int]:
    """Latent rows per rank (`tensor_split` sizes); InputError for more ranks than rows."""
    require(tok.latent_height >= ranks, f"parallel_vae: {tok.latent_height} latent rows cannot "
            f"be split over {ranks} GPUs")
    return shard_sizes(tok.latent_height, ranks)


def halo_per_boundary(model: ModelPreset | str, tok) -> float:
    """Elements one rank sends one neighbour over the whole decode (the derived line)."""
    c = vae_halo_table()[check_splittable(model)]["halo_elements_per_boundary"]
    t, w = tok.latent_frames, tok.latent_width
    return c["constant"] + c["per_frame"] * t + c["per_column"] * w + c["per_frame_column"] * t * w


def link_bytes(model: ModelPreset | str, tok, ranks: int, elem_bytes: int) -> dict:
    """Bytes moved in a decode split over `ranks`, each the most any rank moves: halo (sent: an
    inner rank sends to two neighbours), gather (the mid-block rows a rank receives), pixels
    (the video rows rank 0 receives), and total (the busiest rank's sum of the three)."""
    sizes = rows_per_rank(tok, ranks)
    g = vae_halo_table()[check_splittable(model)]["gathered_elements_per_latent_pixel"]
    per_pixel = g["constant"] + g["per_frame"] * tok.latent_frames
    boundary = halo_per_boundary(model, tok) * elem_bytes
    pixels_row = PIXEL_CHANNELS * tok.frames * tok.width * SPATIAL * elem_bytes
    rows = []
    for r, n in enumerate(sizes):
        halo = boundary * neighbours(r, ranks)
        gather = per_pixel * tok.latent_width * (tok.latent_height - n) * elem_bytes
        pixels = pixels_row * (tok.latent_height - n) if r == 0 else 0.0
        rows.append((halo + gather + pixels, halo, gather, pixels))
    total, halo, gather, pixels = (max(col) for col in zip(*rows, strict=True))
    return {"halo": int(halo), "gather": int(gather), "pixels": int(pixels), "total": int(total),
            "rows_per_rank": sizes}


def working_share(model: ModelPreset | str, tok, ranks: int) -> float:
    """The busiest rank's share of the serial decode's working set (1 for a tiled decode)."""
    fam = check_splittable(model)
    if vae_memory_table().get(fam, {}).get("tiling") or ranks == 1:
        return 1.0
    return peak_share(rows_per_rank(tok, ranks))


def parallel_decode(model: ModelPreset | str, tok, gpu_id: str, ranks: int, gpus_per_node: int,
                    serial_seconds: float, elem_bytes: int) -> dict:
    """The decode of `tok`'s latents split over `ranks` GPUs: seconds (compute + link), the
    busiest rank's bytes on the link and the link, and the working set's share."""
    gpu = get_gpu(gpu_id)
    moved = link_bytes(model, tok, ranks, elem_bytes)
    link = link_for(ranks, gpus_per_node, gpu)
    compute = serial_seconds * max(moved["rows_per_rank"]) / tok.latent_height
    on_link = moved["total"] / (link.effective_gbps * 1e9) if ranks > 1 else 0.0
    return {"ranks": ranks, "rows_per_rank": moved["rows_per_rank"], "seconds": compute + on_link,
            "compute_seconds": compute, "link_seconds": on_link, "link": link.id,
            "halo_bytes": moved["halo"], "gather_bytes": moved["gather"],
            "pixel_bytes": moved["pixels"], "working_share": working_share(model, tok, ranks)}
