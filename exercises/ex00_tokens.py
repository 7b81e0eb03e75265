# Yours to edit. Generated from solutions/ex00_tokens.py by tools/make_exercises.py
# stub-sha256: 5b587c71b792cff9 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 00.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 00.1 count_video_tokens: read notebook 00, \"Counting tokens\". Hint: "
        "two stages, as in sections 1 and 2 of the notebook and the docstring: the "
        "VAE's time rule turns clip frames into latent frames (a causal VAE keeps the "
        "first frame on its own), then the DiT cuts each axis into patches; time "
        "rounds up, height and width round down. (2 more: cpcourse.hint(\"00.1\"))"
    )


def ranks_split_mid_frame(frames: int, tokens_per_frame: int, world: int) -> list[int]:
    """The ranks whose shard is NOT whole frames when a video's tokens are split over `world`.

    The video is `frames` latent frames of `tokens_per_frame` tokens each, flattened in (t, h, w)
    order into one sequence of frames * tokens_per_frame tokens (no text), and split over `world`
    ranks like `torch.tensor_split`: each rank gets one contiguous run of tokens. Return, in
    increasing order, every rank whose run starts or ends inside a frame (a rank that holds no
    token is not counted). A write-up claims "each GPU holds whole frames": this tells when.
    """
    # Exercise 00.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 00.2 ranks_split_mid_frame: read notebook 00, \"Splitting the "
        "sequence\". Hint: section 7: work out where each rank's run of tokens begins "
        "and ends (the split rule of torch.tensor_split: who gets the extra tokens?), "
        "then ask when a position in the flattened sequence is a boundary between two "
        "frames. (2 more: cpcourse.hint(\"00.2\"))"
    )
