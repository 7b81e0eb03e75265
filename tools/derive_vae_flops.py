"""Derive the VAE decode FLOPs the planner charges, from diffusers' own VAE classes.

    .venv/bin/python tools/derive_vae_flops.py --write  # rewrites the data file (else compares)

Each video VAE is built with its diffusers default config on the meta device (no weights, no
memory) and one decode is counted with torch's FlopCounterMode at two latent lengths. Decoding is
convolutional, so the count is linear in the latent pixels; causal VAEs decode the first latent
frame alone (one video frame) and every further latent frame into several. The file keeps the
count per latent pixel at 9 and 17 latent frames: the planner draws the line through them (and
scales down proportionally below 9). HunyuanVideo's decoder is not exactly linear in frames (its
count grows 7.4, 5.8, 6.6 GFLOP per pixel per frame from 3 to 17), hence two points in the range
real videos use, not a fit from short clips. tests/unit/test_deployment.py re-derives one family
and checks the file.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "cpcourse" / "data" / "vae_decode_flops.json"
# preset families -> (diffusers class, latent channels); defaults are the released VAEs' configs
FAMILIES = {"wan2.1": ("AutoencoderKLWan", 16), "hunyuanvideo": ("AutoencoderKLHunyuanVideo", 16),
            "cogvideox": ("AutoencoderKLCogVideoX", 16), "mochi": ("AutoencoderKLMochi", 12),
            "ltx-video": ("AutoencoderKLLTXVideo", 128),
            # Cosmos-Tokenize1-CV8x8x8 (Cosmos 1.0): diffusers' default AutoencoderKLCosmos config
            "cosmos": ("AutoencoderKLCosmos", 16)}


def decode_flops(cls_name: str, channels: int, frames: int, size: int = 8) -> int:
    import diffusers
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vae = getattr(diffusers, cls_name)().eval()
        z = torch.empty(1, channels, frames, size, size)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        vae.decode(z)
    return int(counter.get_total_flops())


def derive(family: str) -> dict:
    import diffusers

    cls_name, channels = FAMILIES[family]
    pixels = 8 * 8
    return {"class": cls_name, "latent_channels": channels,
            "flops_per_latent_pixel": {str(t): decode_flops(cls_name, channels, t) / pixels
                                       for t in (9, 17)},
            "derived": f"FlopCounterMode over {cls_name}().decode on the meta device, latents "
                       f"[1, {channels}, T, 8, 8], diffusers {diffusers.__version__} default "
                       "config"}


def write_families(out: Path, about: str, derive_one, families, argv=None,
                   tool: str = "tools/derive_vae_flops.py") -> int:
    """The tool's command line (`cpcourse.support.out_files.data_file_main`): derive {about,
    families: {name: derive_one(name)}}, the planner's data file `out`, written with --write."""
    from cpcourse.support.out_files import data_file_main

    def text() -> str:
        data = {"about": about, "families": {f: derive_one(f) for f in families}}
        return json.dumps(data, indent=1) + "\n"

    return data_file_main(argv, tool, str(out), text)


def main(argv: list[str] | None = None) -> int:
    return write_families(OUT, __doc__.split("\n")[0], derive, FAMILIES, argv)


if __name__ == "__main__":
    raise SystemExit(main())
