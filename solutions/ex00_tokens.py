"""Exercises of notebook 00, the token explosion: how many tokens a video becomes, and whether
a rank's share of them is whole frames.

    python -m pytest tests/graded --ex 00.1 --impl exercises   # 00.1, 00.2

Check your answer in a notebook with `cpcourse.check("00.1")`, or from a shell with
`cpcourse grade`. The library's own version is `cpcourse.planner.tokens.video_tokens`.
"""

from __future__ import annotations

import math


def count_video_tokens(height: int, width: int, frames: int, vae_temporal: int = 1,
                       vae_spatial: int = 8, patch: tuple[int, int, int] = (1, 2, 2)) -> int:
    """The number of DiT tokens of a `frames x height x width` video (an int).

    What the two stages do (the arithmetic is yours to work out; sections 1 and 2 of notebook 00
    show both on a real clip):
    - the VAE makes one latent cell of each `vae_spatial` x `vae_spatial` block of pixels. Along
      time, with `vae_temporal` 1 every frame is a latent frame; a causal VAE (`vae_temporal` > 1)
      encodes the first frame on its own, then each following group of `vae_temporal` frames as
      one latent frame.
    - the DiT groups `patch` = (p_t, p_h, p_w) latent cells into one token. Along time it pads
      an incomplete last group of latent frames to a whole patch; height and width are multiples
      of the pixels per token (the library refuses other sizes).
    """
    # BEGIN SOLUTION 00.1 | notebook 00, "Counting tokens"
    # | hint: two stages, as in sections 1 and 2 of the notebook and the docstring: the VAE's time
    # | rule turns clip frames into latent frames (a causal VAE keeps the first frame on its own),
    # | then the DiT cuts each axis into patches; time rounds up, height and width round down.
    # | hint2: 64 x 96 pixels, 9 frames, vae_temporal = 4, s = 8, patch (2, 2, 2): (9 - 1) // 4 + 1
    # | = 3 latent frames, ceil(3 / 2) = 2 along time, 64 // 16 = 4 rows, 96 // 16 = 6 columns: 2 *
    # | 4 * 6 = 48 tokens. With vae_temporal = 1 the 9 frames stay 9: 5 * 4 * 6 = 120. 72 x 96 still
    # | gives 4 rows (72 // 16 = 4).
    # | hint3: T = frames if vae_temporal == 1 else (frames - 1) // vae_temporal + 1; tokens =
    # | ceil(T / p_t) * (height // (s * p_h)) * (width // (s * p_w)).
    p_t, p_h, p_w = patch
    latent_frames = frames if vae_temporal == 1 else (frames - 1) // vae_temporal + 1
    return (math.ceil(latent_frames / p_t) * (height // (vae_spatial * p_h))
            * (width // (vae_spatial * p_w)))
    # END SOLUTION


def ranks_split_mid_frame(frames: int, tokens_per_frame: int, world: int) -> list[int]:
    """The ranks whose shard is NOT whole frames when a video's tokens are split over `world`.

    The video is `frames` latent frames of `tokens_per_frame` tokens each, flattened in (t, h, w)
    order into one sequence of frames * tokens_per_frame tokens (no text), and split over `world`
    ranks like `torch.tensor_split`: each rank gets one contiguous run of tokens. Return, in
    increasing order, every rank whose run starts or ends inside a frame (a rank that holds no
    token is not counted). A write-up claims "each GPU holds whole frames": this tells when.
    """
    # BEGIN SOLUTION 00.2 | notebook 00, "Splitting the sequence"
    # | hint: section 7: work out where each rank's run of tokens begins and ends (the split rule
    # | of torch.tensor_split: who gets the extra tokens?), then ask when a position in the
    # | flattened sequence is a boundary between two frames.
    # | hint2: 3 frames of 4 tokens = 12 tokens on 5 ranks: runs of [3, 3, 2, 2, 2] tokens, so the
    # | runs start at 0, 3, 6, 8, 10 and end at 3, 6, 8, 10, 12. Frames start at 0, 4, 8: every
    # | rank has an end or a start inside a frame, so all 5 ranks are returned. On 3 ranks (4 each)
    # | none is; on 2 ranks (6 each) both are.
    # | hint3: base, extra = divmod(frames * tokens_per_frame, world); rank r starts at r * base +
    # | min(r, extra) and holds base + (r < extra) tokens; return the ranks holding tokens whose
    # | start or end is not a multiple of tokens_per_frame.
    base, extra = divmod(frames * tokens_per_frame, world)
    broken = []
    for r in range(world):
        start = r * base + min(r, extra)
        end = start + base + (1 if r < extra else 0)
        if end > start and (start % tokens_per_frame or end % tokens_per_frame):
            broken.append(r)
    return broken
    # END SOLUTION
