"""Exercises of notebook 00, the token explosion: how many tokens a video becomes.

    python -m pytest tests/graded --ex 00.1 --impl exercises

Check your answer in a notebook with `cpcourse.check("00.1")`, or from a shell with
`cpcourse grade`. The library's own version is `cpcourse.tokens.video_tokens`.
"""

from __future__ import annotations

import math


def count_video_tokens(height: int, width: int, frames: int, vae_temporal: int = 1,
                       vae_spatial: int = 8, patch: tuple[int, int, int] = (1, 2, 2)) -> int:
    """The number of DiT tokens of a `frames x height x width` video (an int).

    The VAE divides space by `vae_spatial` (s) and time by `vae_temporal`:
      latent frames T = F                        when vae_temporal == 1,
                      = (F - 1) // vae_temporal + 1  otherwise (a causal VAE encodes the
                                                     first frame on its own).
    The DiT then cuts the latent video [T, H/s, W/s] into patches of (p_t, p_h, p_w) cells; each
    patch is one token:
      tokens = ceil(T / p_t) * (H // (s * p_h)) * (W // (s * p_w)).
    Example: 720 x 1280, 120 frames, s = 8, patch (1, 2, 2) -> 120 * 45 * 80 = 432,000 tokens.
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
