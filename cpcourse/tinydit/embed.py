"""The tiny DiT's inputs as tokens: patches of the latent video, and sinusoidal embeddings.

    python -m pytest tests/unit/test_dit.py -q -k patchify

`patchify` turns a latent video `[B, C, T, Hl, Wl]` into tokens `[B, T, S, C*p*p]` (S = (Hl/p) *
(Wl/p)) and `unpatchify` undoes it; `timestep_embedding` and `frame_embedding` are the
sinusoidal features of the diffusion time and of each token's global frame index.
`cpcourse.tinydit.model` (which re-exports them) builds the network on them.
"""

from __future__ import annotations

import math

import torch

from cpcourse.support.errors import require


def patchify(latent: torch.Tensor, p: int) -> torch.Tensor:
    """`[B, C, T, Hl, Wl]` -> tokens `[B, T, S, C*p*p]`, S = (Hl/p) * (Wl/p), (y, x) row-major."""
    b, c, t, hl, wl = latent.shape
    require(hl % p == 0 and wl % p == 0,
            f"latent height and width ({hl}, {wl}) must be multiples of the patch {p}")
    x = latent.reshape(b, c, t, hl // p, p, wl // p, p)
    return x.permute(0, 2, 3, 5, 1, 4, 6).reshape(b, t, (hl // p) * (wl // p), c * p * p)


def unpatchify(tokens: torch.Tensor, c: int, p: int, grid: tuple[int, int]) -> torch.Tensor:
    """Inverse of `patchify`: `[B, T, S, C*p*p]` -> `[B, C, T, h*p, w*p]`."""
    b, t, _, _ = tokens.shape
    h, w = grid
    x = tokens.reshape(b, t, h, w, c, p, p).permute(0, 4, 1, 2, 5, 3, 6)
    return x.reshape(b, c, t, h * p, w * p)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features `[B, dim]` of diffusion times t in [0, 1] (scaled by 1000).

    The transformer's position code (Vaswani et al. 2017, section 3.5,
    https://arxiv.org/abs/1706.03762: periods up to 10000) applied to time, as DiT does
    (Peebles and Xie 2023, https://arxiv.org/abs/2212.09748), with cos before sin."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64,
                                                         device=t.device) / half)
    args = (t.double()[:, None] * 1000.0) * freqs[None]  # [B, dim/2]
    return torch.cat([args.cos(), args.sin()], dim=-1).to(t.dtype if t.is_floating_point()
                                                          else torch.float32)


def frame_embedding(frames: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features `[T, dim]` of integer frame indices (periods up to 10000 frames)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64,
                                                         device=frames.device) / half)
    args = frames.double()[:, None] * freqs[None]  # [T, dim/2]
    return torch.cat([args.cos(), args.sin()], dim=-1)
