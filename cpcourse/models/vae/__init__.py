"""Video VAEs decoded on P ranks split along height, exactly: Wan's and HunyuanVideo's.

    python -m cpcourse.cli vae --arch wan --nproc 3 --compare

    vae = build_vae("wan")                          # diffusers' own class, tiny, seeded
    video = decode_cp(vae, example_latents("wan"))  # the full video on every rank

`build` (the tiny VAEs, their latents, the sizes they take), `halo` (the layers that mix rows,
patched: halo rows point to point, the mid-block attention gathered, GroupNorm's statistics
all-reduced), `decode` (the split, the call, the gather, the predicted peak per rank).
"""

from cpcourse.models.vae.build import ARCHS, build_vae, check_video_size, example_latents
from cpcourse.models.vae.decode import decode_cp, decode_rows, predicted_peak_per_rank, split_rows

__all__ = ["ARCHS", "build_vae", "check_video_size", "decode_cp", "decode_rows",
           "example_latents", "predicted_peak_per_rank", "split_rows"]
