"""The decoder of a video VAE on P ranks split along height: halos, gathers, synced norms.

    python -m pytest tests/dist/test_vae_cp.py -q

`HeightSplit(group, sizes)` is the rank's view of the split (latent rows per rank, `tensor_split`
sizes) and `patched(vae, split, sync_norm)` is a context manager that, on this rank only,
replaces the forward of every decoder layer that mixes rows, and restores them on exit:

  * a convolution with height padding (Wan's `WanCausalConv3d` and its `Resample` `Conv2d`,
    HunyuanVideo's `HunyuanVideoCausalConv3d`) pads width and time as before, but takes its
    `pad` rows above and below from the neighbouring ranks (`batch_isend_irecv`, as the ring
    does); the first and last rank fill the global edge as the model would (zeros for Wan,
    replicated rows for HunyuanVideo). Wan's causal time cache is concatenated before the
    exchange, so each rank keeps its own rows of it and the neighbour's cached rows arrive
    with the halo;
  * the mid-block attention mixes every pixel of a frame (Wan) or of the video (HunyuanVideo).
    It is GATHERED, not ringed: it runs once, at the lowest resolution (1/64 of the pixels,
    a few percent of the decode's work), where one all-gather of the input costs less than
    P ring steps and gives the one-process numbers bit for bit. Every rank runs it on the full
    input and keeps its rows; for HunyuanVideo the whole mid block is gathered, so the
    GroupNorm inside its attention sees every token too;
  * `nn.GroupNorm` (HunyuanVideo) normalises over all rows of a frame: with `sync_norm` the
    per-group sum, sum of squares and count are all-reduced (float64) before normalising;
    without it each rank uses its own rows' statistics, which is what a naive split does.

Nearest upsampling, RMS norm over channels, the time convolutions (kernel 1 in space), the
activations and the final clamp act on each row alone and run unchanged: a shard of n rows
simply becomes 2n rows at each upsampling.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cpcourse.support.groups import gather_uneven, global_rank, tracked
from cpcourse.support.height_split import halo_bytes


class HeightSplit:
    """This rank's part of a height split: `sizes[r]` latent rows on rank r of `group`.

    `halo_bytes` counts the halo rows this rank sent (what crossed a link for the convs)."""

    def __init__(self, group, sizes: list[int]):
        self.group, self.sizes = group, list(sizes)
        self.rank = dist.get_rank(group) if group is not None else dist.get_rank()
        self.world = len(self.sizes)
        self.halo_bytes = 0
        self.local = False  # True while a gathered block runs on the full rows

    def level_sizes(self, rows: int) -> list[int]:
        """Every rank's rows at a level where this rank has `rows` (each upsampling doubles)."""
        scale = rows // self.sizes[self.rank]
        return [n * scale for n in self.sizes]

    def exchange(self, x: torch.Tensor, pad: int, edge: str) -> torch.Tensor:
        """`x [..., h, W]` -> `[..., pad + h + pad, W]`: neighbours' rows, or the edge fill."""
        top, bottom = x[..., :pad, :].contiguous(), x[..., -pad:, :].contiguous()
        above, below = torch.empty_like(top), torch.empty_like(bottom)
        ops = []
        if self.rank > 0:
            peer = global_rank(self.group, self.rank - 1)
            ops += [dist.P2POp(dist.isend, top, peer, self.group),
                    dist.P2POp(dist.irecv, above, peer, self.group)]
        if self.rank < self.world - 1:
            peer = global_rank(self.group, self.rank + 1)
            ops += [dist.P2POp(dist.isend, bottom, peer, self.group),
                    dist.P2POp(dist.irecv, below, peer, self.group)]
        if ops:
            with tracked("batch_isend_irecv (VAE halo rows)", group=self.group):
                for req in dist.batch_isend_irecv(ops):
                    req.wait()
            self.halo_bytes += halo_bytes(x.shape, pad, x.element_size(), self.rank,
                                          self.world)
        if self.rank == 0:
            above = _edge(x[..., :1, :], pad, edge)
        if self.rank == self.world - 1:
            below = _edge(x[..., -1:, :], pad, edge)
        return torch.cat([above, x, below], dim=-2)


def _edge(row: torch.Tensor, pad: int, edge: str) -> torch.Tensor:
    """The `pad` rows beyond the picture's edge: zeros, or copies of the edge row."""
    rows = row.expand(*row.shape[:-2], pad, row.shape[-1])
    return torch.zeros_like(rows) if edge == "zeros" else rows.contiguous()


def _wan_conv3d(split: HeightSplit, original):
    """WanCausalConv3d.forward with its height padding taken from the neighbours."""
    def forward(self, x, cache_x=None):
        if split.local:
            return original(x, cache_x)
        w, _, h, _, t, _ = self._padding
        if cache_x is not None and t > 0:
            x = torch.cat([cache_x.to(x.device), x], dim=2)
            t -= cache_x.shape[2]
        x = split.exchange(F.pad(x, (w, w, 0, 0, t, 0)), h, "zeros")
        return nn.Conv3d.forward(self, x)
    return forward


def _conv2d(split: HeightSplit, original):
    """nn.Conv2d (zero padding) with its height padding taken from the neighbours."""
    def forward(self, x):
        if split.local:
            return original(x)
        h, w = self.padding
        x = split.exchange(F.pad(x, (w, w)), h, "zeros")
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
    return forward


def _hunyuan_conv3d(split: HeightSplit, original):
    """HunyuanVideoCausalConv3d.forward: replicate padding, height rows from the neighbours."""
    def forward(self, x):
        if split.local:
            return original(x)
        w, _, h, _, t, _ = self.time_causal_padding
        x = F.pad(x, (w, w, 0, 0, t, 0), mode=self.pad_mode)
        return self.conv(split.exchange(x, h, "replicate"))
    return forward


def _gathered(split: HeightSplit, original):
    """A block that mixes every row: all-gather `[B, C, T, h, W]`, run it whole, keep our rows."""
    def forward(self, x, *args, **kwargs):
        if split.local:
            return original(x, *args, **kwargs)
        sizes = split.level_sizes(x.shape[-2])
        full = gather_uneven(x.contiguous(), sizes, dim=-2 % x.dim(), group=split.group,
                             what="VAE mid-block input")
        split.local = True
        try:
            out = original(full, *args, **kwargs)
        finally:
            split.local = False
        start = sum(sizes[:split.rank])
        return out[..., start:start + sizes[split.rank], :]
    return forward


def _group_norm(split: HeightSplit, original):
    """nn.GroupNorm whose statistics are summed over the ranks' rows (float64, one all-reduce)."""
    def forward(self, x):
        if split.local:
            return original(x)
        b, c = x.shape[:2]
        g = x.reshape(b, self.num_groups, -1).double()
        stats = torch.stack([g.sum(-1), (g * g).sum(-1),
                             torch.full_like(g[..., 0], g.shape[-1])])
        with tracked("all_reduce (GroupNorm statistics)", group=split.group):
            dist.all_reduce(stats, group=split.group)
        mean = stats[0] / stats[2]
        var = (stats[1] / stats[2] - mean * mean).clamp_min(0)
        y = (g - mean[..., None]) / torch.sqrt(var[..., None] + self.eps)
        y = y.to(x.dtype).reshape(x.shape)
        shape = (1, c) + (1,) * (x.dim() - 2)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y
    return forward


def _patch_for(module: nn.Module, sync_norm: bool):
    """Which replacement `module` needs on a height split, or None."""
    name = type(module).__name__
    if name == "WanCausalConv3d" and module._padding[2] > 0:
        return _wan_conv3d
    if name == "HunyuanVideoCausalConv3d" and module.time_causal_padding[2] > 0:
        return _hunyuan_conv3d
    if type(module) is nn.Conv2d and module.padding[0] > 0:
        return _conv2d
    if name in ("WanAttentionBlock", "HunyuanVideoMidBlock3D"):
        return _gathered
    if sync_norm and type(module) is nn.GroupNorm:
        return _group_norm
    return None


@contextlib.contextmanager
def patched(vae: nn.Module, split: HeightSplit, sync_norm: bool = True):
    """Within the block, `vae.decode(rows)` decodes this rank's rows as part of the split."""
    done = []
    for module in vae.decoder.modules():
        make = _patch_for(module, sync_norm)
        if make is not None:
            module.forward = types.MethodType(make(split, module.forward), module)
            done.append(module)
    try:
        yield split
    finally:
        for module in done:
            del module.forward  # the class's forward shows through again
