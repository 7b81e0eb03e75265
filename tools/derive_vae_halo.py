"""Derive what a parallel VAE decode sends between ranks, from diffusers' own VAE classes.

    .venv/bin/python tools/derive_vae_halo.py --write  # rewrites the data file (else compares)

The released VAE (default config) decodes on the meta device under the library's own height
split (`cpcourse.models.vae.halo.patched`), with a split that records instead of sending: every
halo exchange's elements as `cpcourse.support.height_split.halo_bytes` counts them (one
neighbour, one byte per element), and the elements the mid-block all-gather collects
(GroupNorm's all-reduce, a few numbers per group, is left out). The halo
per boundary does not depend on the height, and is solved exactly for

    halo elements = a + b T + c W + d T W              (T, W: latent frames and width)

(each exchange is `pad` rows of [C, frames, width] at its level: frames and width grow linearly
with the latent's), the gathered elements for (e + f T) H W. A fifth point checks each fit.
cpcourse.planner.parallel_vae reads the file.
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "cpcourse" / "data" / "vae_decode_halo.json"
FAMILIES = {"wan2.1": ("AutoencoderKLWan", 16), "hunyuanvideo": ("AutoencoderKLHunyuanVideo", 16)}
POINTS = ((5, 8), (9, 8), (5, 16), (9, 16))  # (T, W) latent, height 8
CHECK = (13, 24)


def meta_record(cls_name: str, channels: int, t: int, w: int, h: int = 8) -> dict:
    """`record` of the released VAE (default config) on latents [1, C, t, h, w], on meta."""
    import diffusers
    import torch

    with torch.device("meta"):
        vae = getattr(diffusers, cls_name)().eval()
        z = torch.empty(1, channels, t, h, w)
    return record(vae, z)


def record(vae, z) -> dict:
    """Halo elements per boundary, exchanges and gathered elements of `vae` decoding latents
    `z [B, C, T, H, W]` under the library's split, recorded instead of sent (no processes)."""
    import torch

    from cpcourse.models.vae import halo
    from cpcourse.support.height_split import halo_bytes

    class Recording(halo.HeightSplit):
        def __init__(self, height):
            self.group, self.sizes, self.rank, self.world = None, [height], 0, 1
            self.halo_bytes, self.local, self.exchanges, self.gathered = 0, False, 0, 0

        def exchange(self, x, pad, edge):
            self.halo_bytes += halo_bytes(x.shape, pad, 1, 0, 2)  # one neighbour, 1 B each
            self.exchanges += 1
            rows = x.new_zeros(*x.shape[:-2], pad, x.shape[-1])
            return torch.cat([rows, x, rows], dim=-2)

    split = Recording(z.shape[-2])

    def gather(x, sizes, dim, group=None, what=""):
        split.gathered += x.numel()
        return x

    vae.use_framewise_decoding = False  # the whole video at once: a rank's rows replace tiles
    saved, halo.gather_uneven = halo.gather_uneven, gather
    try:
        with torch.no_grad(), halo.patched(vae, split, sync_norm=False):
            vae.decode(z)
    finally:
        halo.gather_uneven = saved
    return {"halo": split.halo_bytes, "exchanges": split.exchanges,
            "gathered_per_pixel": split.gathered / (z.shape[-2] * z.shape[-1])}


def derive(family: str) -> dict:
    import diffusers
    import numpy as np

    cls_name, channels = FAMILIES[family]
    got = [meta_record(cls_name, channels, t, w) for t, w in POINTS]
    halo = np.linalg.solve([[1, t, w, t * w] for t, w in POINTS], [g["halo"] for g in got])
    ex = np.polyfit([t for t, _ in POINTS[:2]], [g["exchanges"] for g in got[:2]], 1)
    gat = np.polyfit([t for t, _ in POINTS[:2]], [g["gathered_per_pixel"] for g in got[:2]], 1)
    check = meta_record(cls_name, channels, *CHECK)
    t, w = CHECK
    assert abs(halo @ [1, t, w, t * w] - check["halo"]) < 1e-6 * check["halo"], family
    assert abs(np.polyval(gat, t) - check["gathered_per_pixel"]) < 1e-6 * check[
        "gathered_per_pixel"], family
    def line(names, coefs):  # exact integers, less the solver's rounding
        return {n: round(float(c), 3) + 0.0 for n, c in zip(names, coefs, strict=True)}

    return {"class": cls_name, "latent_channels": channels,
            "halo_elements_per_boundary": line(
                ("constant", "per_frame", "per_column", "per_frame_column"), halo),
            "exchanges": line(("per_frame", "constant"), ex),
            "gathered_elements_per_latent_pixel": line(("per_frame", "constant"), gat),
            "points": [{"latent_tw": [t, w], **g} for (t, w), g in zip(POINTS, got, strict=True)]
            + [{"latent_tw": list(CHECK), **check, "check": True}],
            "derived": f"{cls_name}().decode on the meta device under cpcourse.models.vae.halo's "
                       f"height split, recorded (diffusers {diffusers.__version__} default "
                       "config, untiled)"}


def main(argv: list[str] | None = None) -> int:
    from derive_vae_flops import write_families  # a sibling in tools/

    return write_families(OUT, __doc__.split("\n")[0], derive, FAMILIES,
                          argv, "tools/derive_vae_halo.py")


if __name__ == "__main__":
    raise SystemExit(main())
