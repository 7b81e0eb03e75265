"""Block-sparse attention over a video's 3-D token grid: masks, the reference, the skipping kernel.

    cpcourse sparse --nproc 2 --method ulysses --mask radial --compare --json

A video of `grid = (T, H, W)` tokens is flattened in (t, h, w) order (L = T*H*W) and cut into
tiles of `tile = (frames, rows, cols)` tokens (edge tiles may be smaller). A block mask
`[heads, n_tiles, n_tiles]` (bool) says which key tiles each query tile attends to, per head:
sparse video attention (STA, VSA, radial attention) keeps a few of these blocks and skips the
rest. Three masks are built here, each keeping a query tile's own tile so no query is left
without keys:
  - `sliding_tile_mask`: a static 3-D window around each tile (STA-like);
  - `radial_mask`: the spatial reach halves every `period` frames of temporal distance (radial
    attention's energy decay), the same for every head;
  - `topk_mask`: per head, the key tiles whose pooled (tile-mean) keys score highest against the
    pooled queries (VSA-like), with a per-head count so heads differ in density.
`masked_attention` is the reference (dense scores, masked, one softmax); `block_sparse_attention`
computes only the kept blocks, tile by tile, and returns (out, lse) so partial results over
disjoint key sets merge exactly (`cpcourse.attention.merge_attention`): what CP builds on
(`cpcourse.sparse.cp`). Shapes: q, k, v `[B, heads, L, D]`, lse `[B, heads, L]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cpcourse.attention import attention_with_lse, merge_attention
from cpcourse.support.errors import InputError, positive_int, require


def _triple(name: str, value) -> tuple[int, int, int]:
    require(isinstance(value, (tuple, list)) and len(value) == 3,
            f"{name} must be (frames, rows, cols), got {value!r}")
    return tuple(positive_int(name, x) for x in value)


def tile_counts(grid, tile) -> tuple[int, int, int]:
    """How many tiles along (t, h, w): ceil(grid / tile) per dimension."""
    grid, tile = _triple("grid", grid), _triple("tile", tile)
    return tuple(math.ceil(g / t) for g, t in zip(grid, tile, strict=True))


def tile_of_token(grid, tile) -> torch.Tensor:
    """`[L]` long: each (t, h, w)-flattened token's tile, tiles numbered in (t, h, w) order."""
    (t, h, w), (tt, th, tw) = _triple("grid", grid), _triple("tile", tile)
    _, nh, nw = tile_counts(grid, tile)
    a = torch.arange(t)[:, None, None] // tt
    b = torch.arange(h)[None, :, None] // th
    c = torch.arange(w)[None, None, :] // tw
    return ((a * nh + b) * nw + c).reshape(-1)


def tile_sizes(grid, tile) -> torch.Tensor:
    """`[n_tiles]` long: tokens per tile (edge tiles hold fewer)."""
    n = math.prod(tile_counts(grid, tile))
    return torch.bincount(tile_of_token(grid, tile), minlength=n)


def _tile_coords(grid, tile) -> torch.Tensor:
    """`[n_tiles, 3]`: each tile's first (frame, row, col) in tokens."""
    nt, nh, nw = tile_counts(grid, tile)
    idx = torch.arange(nt * nh * nw)
    return torch.stack([idx // (nh * nw), idx // nw % nh, idx % nw], dim=1) * torch.tensor(tile)


def sliding_tile_mask(grid, tile, window, heads: int = 1) -> torch.Tensor:
    """STA-like static mask `[heads, n, n]`: key tile j is kept for query tile i when, in every
    dimension, their starts are at most window // 2 tokens apart. window = (frames, rows, cols)."""
    window = _triple("window", window)
    pos = _tile_coords(grid, tile)
    dist = (pos[:, None, :] - pos[None, :, :]).abs()             # [n, n, 3] tokens apart
    keep = (dist <= torch.tensor(window) // 2).all(dim=-1)
    return keep.expand(positive_int("heads", heads), -1, -1).clone()


def radial_mask(grid, tile, heads: int = 1, period: int = 1) -> torch.Tensor:
    """Radial mask `[heads, n, n]`: tiles dt frames apart are kept when their spatial distance
    (largest of rows, cols, in tokens) is at most max(H, W) / 2**(dt // period): the whole frame
    at dt = 0, half as far each `period` frames later. Same for every head."""
    period = positive_int("period", period)
    g = _triple("grid", grid)
    pos = _tile_coords(grid, tile)
    d = (pos[:, None, :] - pos[None, :, :]).abs()
    reach = max(g[1], g[2]) / 2.0 ** (d[..., 0] // period)
    keep = d[..., 1:].amax(dim=-1) <= reach
    keep |= torch.eye(len(pos), dtype=torch.bool)
    return keep.expand(positive_int("heads", heads), -1, -1).clone()


def pooled_tiles(x: torch.Tensor, grid, tile) -> torch.Tensor:
    """Tile means of x `[B, heads, L, D]` over batch and tokens: `[heads, n, D]` float64."""
    owner = tile_of_token(grid, tile)
    require(x.dim() == 4 and x.shape[2] == len(owner),
            f"x must be [B, heads, L={len(owner)}, D], got {tuple(x.shape)}")
    n = math.prod(tile_counts(grid, tile))
    sums = x.double().sum(0).new_zeros(x.shape[1], n, x.shape[3])
    sums.index_add_(1, owner, x.double().sum(0))
    return sums / (tile_sizes(grid, tile) * x.shape[0]).double()[None, :, None]


def topk_mask(q, k, grid, tile, keep) -> torch.Tensor:
    """VSA-like mask `[heads, n, n]`: per head, each query tile keeps its own tile and the
    `keep[h]` key tiles whose pooled keys score highest against its pooled query (an int keeps
    the same count in every head). q, k `[B, heads, L, D]`; scores in float64."""
    return topk_from_pooled(pooled_tiles(q, grid, tile), pooled_tiles(k, grid, tile), keep)


def topk_from_pooled(qp, kp, keep) -> torch.Tensor:
    """`topk_mask` from tile means qp, kp `[heads, n, D]` (`pooled_tiles`; under CP their sums
    are all-reduced: a few bytes per tile instead of the whole sequence)."""
    heads, n, _ = qp.shape
    keep = [keep] * heads if isinstance(keep, int) else list(keep)
    require(len(keep) == heads, f"keep must be an int or one count per head ({heads}), "
            f"got {len(keep)}")
    scores = qp.double() @ kp.double().transpose(-2, -1)        # [heads, n, n]
    mask = torch.eye(n, dtype=torch.bool).repeat(heads, 1, 1)
    for h, kh in enumerate(keep):
        kh = min(positive_int("keep", kh), n)
        mask[h].scatter_(1, scores[h].topk(kh, dim=-1).indices, True)
    return mask


def check_block_mask(mask, heads: int, n_tiles: int) -> torch.Tensor:
    """The mask as a bool `[heads, n, n]`, or one InputError line naming what is wrong."""
    require(isinstance(mask, torch.Tensor), f"mask must be a tensor, got {type(mask).__name__}")
    require(tuple(mask.shape) == (heads, n_tiles, n_tiles), f"mask must be [heads={heads}, "
            f"n_tiles={n_tiles}, n_tiles={n_tiles}] (bool), got {tuple(mask.shape)}")
    mask = mask.bool()
    empty = (~mask.any(dim=-1)).nonzero()
    if len(empty):
        h, i = empty[0].tolist()
        raise InputError(f"mask row (head {h}, query tile {i}) keeps no key tile: every query "
                         f"needs at least one key (keep its own tile)")
    return mask


@dataclass(frozen=True)
class BlockMask:
    """A checked block mask: `mask` bool `[heads, n, n]` over the tiles `tile` (frames, rows,
    cols) of a `grid` (T, H, W) of tokens. Built once, passed to every kernel and CP function."""

    mask: torch.Tensor
    grid: tuple
    tile: tuple

    def __post_init__(self):
        object.__setattr__(self, "grid", _triple("grid", self.grid))
        object.__setattr__(self, "tile", _triple("tile", self.tile))
        require(isinstance(self.mask, torch.Tensor) and self.mask.dim() == 3,
                f"mask must be a [heads, n, n] tensor, got {type(self.mask).__name__} "
                f"{tuple(getattr(self.mask, 'shape', ()))}")
        n = math.prod(tile_counts(self.grid, self.tile))
        object.__setattr__(self, "mask", check_block_mask(self.mask, self.mask.shape[0], n))

    @property
    def length(self) -> int:
        return math.prod(self.grid)

    def of_heads(self, heads) -> BlockMask:
        """The mask of some heads (a rank's, under Ulysses)."""
        return BlockMask(self.mask[list(heads)], self.grid, self.tile)


def _check(q, k, v, bm: BlockMask) -> None:
    require(isinstance(bm, BlockMask), f"bm must be a BlockMask, got {type(bm).__name__}")
    require(q.dim() == 4 and q.shape == k.shape and k.shape[:3] == v.shape[:3],
            f"q, k, v must be [B, heads, L, D] of one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    require(q.shape[2] == bm.length, f"grid {bm.grid} holds {bm.length} tokens but q has "
            f"L={q.shape[2]}")
    check_block_mask(bm.mask, q.shape[1], bm.mask.shape[1])


def token_mask(bm: BlockMask) -> torch.Tensor:
    """The block mask at token level: `[heads, L, L]` bool."""
    owner = tile_of_token(bm.grid, bm.tile)
    return bm.mask[:, owner[:, None], owner[None, :]]


def masked_attention(q, k, v, bm: BlockMask, scale=None):
    """The reference: dense scores `[B, heads, L, L]`, masked to -inf outside the kept blocks,
    one softmax. Returns (out `[B, heads, L, D]` in q's dtype, lse `[B, heads, L]`), computed in
    float64 for float64 inputs (float32 otherwise)."""
    _check(q, k, v, bm)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * scale
    scores = scores.masked_fill(~token_mask(bm), -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v.to(acc)
    return out.to(q.dtype), lse


def _groups(ids: torch.Tensor, owner: torch.Tensor, n: int) -> list[torch.Tensor]:
    """For each tile, the positions (in ids) of its tokens."""
    tiles = owner[ids]
    return [(tiles == i).nonzero().flatten() for i in range(n)]


def block_sparse_attention(q, k, v, bm: BlockMask, scale=None, q_ids=None, k_ids=None,
                           stats=None):
    """Attention over the kept blocks only: (out `[B, heads, Lq, D]`, lse `[B, heads, Lq]`).

    q holds the tokens `q_ids` (global (t, h, w) positions, default all L), k and v the tokens
    `k_ids`: a rank's shard and the K/V block it holds. A query row with no kept key among
    `k_ids` gets out = 0, lse = -inf, so partial results over disjoint key sets merge exactly.
    `stats` (a dict) gains "work" (score entries computed: |q tile| x |k tile| per kept block),
    "blocks" (kept blocks computed) and "skipped" (blocks with tokens on both sides but masked).
    """
    q_ids = torch.arange(bm.length) if q_ids is None else q_ids
    k_ids = torch.arange(bm.length) if k_ids is None else k_ids
    mask, n = bm.mask, bm.mask.shape[1]
    require(mask.shape[0] == q.shape[1], f"bm has {mask.shape[0]} heads, q {q.shape[1]}")
    owner = tile_of_token(bm.grid, bm.tile)
    qg, kg = _groups(q_ids, owner, n), _groups(k_ids, owner, n)
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    lse = torch.full(q.shape[:3], -math.inf, dtype=torch.float64 if q.dtype == torch.float64
                     else torch.float32)
    work = blocks = skipped = 0
    for h in range(q.shape[1]):
        for i in (i for i in range(n) if len(qg[i])):
            kept = [j for j in range(n) if len(kg[j]) and mask[h, i, j]]
            skipped += sum(1 for j in range(n) if len(kg[j])) - len(kept)
            if not kept:
                continue                                         # every block masked: skip all
            cols = torch.cat([kg[j] for j in kept])
            o, s = attention_with_lse(q[:, h:h + 1, qg[i]], k[:, h:h + 1, cols],
                                      v[:, h:h + 1, cols], scale=scale)
            out[:, h, qg[i]], lse[:, h, qg[i]] = o[:, 0], s[:, 0]
            work += len(qg[i]) * len(cols)
            blocks += len(kept)
    if stats is not None:
        for key, val in (("work", work), ("blocks", blocks), ("skipped", skipped)):
            stats[key] = stats.get(key, 0) + val
    return out, lse


def merge_into(acc, part):
    """Fold a partial (out, lse) into an accumulated one (None: the first part)."""
    return part if acc is None else merge_attention(acc[0], acc[1], part[0], part[1])


def running_max_skip(q, k, v, blocks, threshold: float, scale=None):
    """Attention that skips, per query row, any key block whose best score is more than
    `threshold` below the row's running max (TRT-LLM's Skip Softmax idea), visiting the key
    blocks in the order given. q `[B, H, Lq, D]`; k, v `[B, H, Lk, D]`; blocks: a list of key
    index tensors, in visiting order. Returns (out `[B, H, Lq, D]` float64, skipped fraction).
    The decision depends on what was seen before: change the order (a ring rank starts with
    its own block) and other blocks are skipped, so the output changes."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qd, kd, vd = q.double(), k.double(), v.double()
    run_max = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    den = torch.zeros(q.shape[:3], dtype=torch.float64)
    num = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float64)
    skipped = 0
    for ids in blocks:
        s = (qd @ kd[:, :, ids].transpose(-2, -1)) * scale              # [B, H, Lq, |block|]
        best = s.amax(-1)
        use = best >= run_max - threshold                                # rows that keep it
        skipped += int((~use).sum())
        new_max = torch.where(use, torch.maximum(run_max, best), run_max)
        fix = torch.exp(run_max - new_max).nan_to_num(0.0)               # rescale the old sums
        p = torch.exp(s - new_max[..., None]) * use[..., None]
        den = den * fix + p.sum(-1)
        num = num * fix[..., None] + p @ vd[:, :, ids]
        run_max = new_max
    return num / den[..., None], skipped / (len(blocks) * run_max.numel())
