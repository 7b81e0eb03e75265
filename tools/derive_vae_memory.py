"""Derive what a VAE decode holds on the GPU at its peak, from diffusers' own VAE classes.

    .venv/bin/python tools/derive_vae_memory.py --write  # rewrites the data file (else compares)

A decode is run on the meta device (no memory, no arithmetic) under a dispatch mode that adds up
the bytes of every tensor storage an op creates and subtracts them when the last tensor using
that storage is freed: the peak of that sum is the decode's working set, weights not included.
It is counted in the dtype and with the tiling that each model's released code decodes with
(`RELEASED`), at three latent shapes, and solved exactly for

    peak bytes = a + b (H W) + c (T H W)          (T, H, W: latent frames, height, width)

a part that does not grow (a tile's decode under tiling), a part that grows with a frame's
pixels (decoders that go frame by frame keep one chunk of full-resolution features), and a
part that grows with the whole video (the decoded output and its copies). The file also keeps
the VAE's parameter count. cpcourse.planner.pipeline_memory reads it;
tests/unit/test_pipeline_memory.py re-derives one point.
"""

from __future__ import annotations

import weakref
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "cpcourse" / "data" / "vae_decode_memory.json"
# family -> (diffusers class, latent channels, decode dtype, enable_tiling arguments or None for
# an untiled decode, where the dtype and tiling are from)
RELEASED = {
    "wan2.1": ("AutoencoderKLWan", 16, "float32", None,
               "Wan2.1 wan/modules/vae.py: WanVAE(dtype=torch.float) decodes in float32, frame "
               "chunk by frame chunk, untiled"),
    "hunyuanvideo": ("AutoencoderKLHunyuanVideo", 16, "float16",
                     {"tile_sample_min_height": 256, "tile_sample_min_width": 256,
                      "tile_sample_stride_height": 192, "tile_sample_stride_width": 192,
                      "tile_sample_min_num_frames": 64, "tile_sample_stride_num_frames": 48},
                     "HunyuanVideo hyvideo/config.py: --vae-precision fp16, --vae-tiling on by "
                     "default; hyvideo/vae/autoencoder_kl_causal_3d.py tiles 256 px every 192 "
                     "(overlap 0.25) and 64 frames every 48 (16 + 1 latent frames every 12)"),
}
# (T, H, W) latent: longer than one tile of 16 + 1 frames and wider than one of 32 pixels, so a
# tiled decode tiles in every direction at all three (as real videos do)
SHAPES = ((21, 48, 64), (33, 48, 64), (21, 64, 96))


def live_bytes_mode():
    """A dispatch mode whose `peak` is the most bytes of tensor storage alive at once among the
    storages that ops created while it was active (a storage dies with its last tensor)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.size, self.refs, self.now, self.peak = {}, {}, 0, 0

        def _drop(self, key):
            self.refs[key] -= 1
            if not self.refs[key]:
                self.now -= self.size.pop(key)
                del self.refs[key]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    key = t.untyped_storage()._cdata
                    if key not in self.size:
                        self.size[key], self.refs[key] = t.untyped_storage().nbytes(), 0
                        self.now += self.size[key]
                        self.peak = max(self.peak, self.now)
                    self.refs[key] += 1
                    weakref.finalize(t, self._drop, key)
            return out

    return LiveBytes()


def peak_bytes(cls_name: str, channels: int, dtype: str, tiling: dict | None,
               shape: tuple[int, int, int]) -> int:
    """Peak bytes of live tensors created while decoding latents [1, C, T, H, W]."""
    import diffusers
    import torch

    dt = getattr(torch, dtype)
    with torch.device("meta"):
        vae = getattr(diffusers, cls_name)().eval().to(dt)
        z = torch.empty(1, channels, *shape, dtype=dt)
    if tiling is not None:
        vae.enable_tiling(**tiling)
    counter = live_bytes_mode()
    # on meta, attention runs PyTorch's math path and holds an L x L score matrix that CUDA's
    # fused kernels do not: where a mid-block attention set the peak, this would overstate it
    with torch.no_grad(), counter:
        vae.decode(z)
    return counter.peak


def derive(family: str) -> dict:
    import diffusers
    import numpy as np

    cls_name, channels, dtype, tiling, source = RELEASED[family]
    peaks = [peak_bytes(cls_name, channels, dtype, tiling, s) for s in SHAPES]
    a, b, c = np.linalg.solve([[1, h * w, t * h * w] for t, h, w in SHAPES], peaks)
    import torch

    with torch.device("meta"):
        params = sum(p.numel() for p in getattr(diffusers, cls_name)().parameters())
    return {"class": cls_name, "latent_channels": channels, "dtype": dtype, "tiling": tiling,
            "released": source, "params": int(params),
            "peak_bytes": {"constant": float(a), "per_frame_pixel": float(b),
                           "per_video_pixel": float(c)},
            "points": [{"latent_thw": list(s), "peak_bytes": int(p)}
                       for s, p in zip(SHAPES, peaks, strict=True)],
            "derived": f"live storage bytes over {cls_name}().decode on the meta device, "
                       f"{dtype}{', tiled' if tiling else ''}, diffusers {diffusers.__version__} "
                       "default config"}


def main(argv: list[str] | None = None) -> int:
    from derive_vae_flops import write_families  # a sibling in tools/

    return write_families(OUT, __doc__.split("\n")[0], derive, RELEASED,
                          argv, "tools/derive_vae_memory.py")


if __name__ == "__main__":
    raise SystemExit(main())
