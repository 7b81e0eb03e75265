"""Tensor parallelism (Megatron-style): a block's heads and MLP columns split over tp ranks.

    cpcourse generate --nproc 2 --layout tp=2 --compare --json

Two linear layers in a row need only one collective between them:
    column-parallel  Y_i = X W_i^T + b_i     W_i: the output rows tp rank i keeps; Y is split on
                                             its last dim, and nothing is sent
    row-parallel     Y = sum_i Y_i W'_i^T + b  each rank multiplies its slice of the inputs by
                                             its columns of W', one all-reduce sums the partials
                                             and the bias is added once, after it
In a DiT block: q, k, v are column-parallel by HEADS (attention is per head, so a rank attends
its heads with no communication), the output projection row-parallel; the MLP's first layer
column-parallel (GELU is elementwise, it runs on the shard), its second row-parallel. So each
attention and each MLP costs one all-reduce of the block's activations `[B, L, hidden]`.
Every tp rank still holds those activations in full: TP divides weights and FLOPs, not the
residual stream, which is why it cannot replace CP for long videos.

Why these layers and not torch's `parallelize_module` with `ColwiseParallel`/`RowwiseParallel`
(which run on gloo: tests/dist/test_mesh.py checks ours against them on an MLP):
1. the DiT's fused qkv projection outputs `[q | k | v]`, each over all heads. ColwiseParallel
   shards the weight's rows contiguously, which would give tp rank 0 all of q and half of k. A
   head split takes rows {q, k, v} x {this rank's heads}: an index, not a slice.
2. DTensor's all-reduce runs through functional collectives, which `count_bytes` (it wraps the
   calls of torch.distributed) does not see; the course measures every byte it reports.

The layers here are generic; each model family applies them to its own blocks:
`cpcourse.tinydit.tp` (the course's tiny DiT) and `cpcourse.models.tp` (diffusers' Wan).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.support.errors import InputError
from cpcourse.support.groups import comm_device, tracked


def head_rows(heads: int, head_dim: int, tp_rank: int, tp: int, fused: int = 3) -> torch.Tensor:
    """Output rows of a fused projection `[fused, heads, head_dim]` that tp rank `tp_rank` keeps:
    its heads of each of the `fused` parts (q, k, v), in the order the forward views them."""
    if heads % tp:
        raise InputError(f"tensor parallel splits the {heads} heads over {tp} ranks, which does "
                         f"not divide them: tp must divide {heads}")
    hp = heads // tp
    rows = torch.arange(fused * heads * head_dim).view(fused, heads, head_dim)
    return rows[:, tp_rank * hp:(tp_rank + 1) * hp].reshape(-1)


def span(n: int, tp_rank: int, tp: int) -> torch.Tensor:
    if n % tp:
        raise InputError(f"tensor parallel splits {n} features over {tp} ranks: tp must divide it")
    return torch.arange(tp_rank * (n // tp), (tp_rank + 1) * (n // tp))


class ColumnParallelLinear(nn.Module):
    """x `[..., in]` -> this rank's output features `[..., len(rows)]`; no communication."""

    def __init__(self, linear: nn.Linear, rows: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, len(rows)
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(
            linear.bias.detach()[rows].clone(), requires_grad=False)

    def forward(self, x):
        return nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input features `[..., len(cols)]` -> the full output `[..., out]` on every
    rank of `group`: a partial product, one all-reduce (sum), then the bias once."""

    def __init__(self, linear: nn.Linear, cols: torch.Tensor, group):
        super().__init__()
        self.group = group
        self.in_features, self.out_features = len(cols), linear.out_features
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(
            linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        y = nn.functional.linear(x, self.weight)
        if dist.get_world_size(self.group) > 1:
            device = comm_device(self.group)
            buf = y.to(device) if y.device != device else y
            with tracked("all_reduce (tensor parallel)", group=self.group):
                dist.all_reduce(buf, group=self.group)
            y = buf.to(y.device)
        return y if self.bias is None else y + self.bias
