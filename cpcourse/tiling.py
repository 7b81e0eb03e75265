"""Context parallelism as a tiling of the S x S score matrix: Attention2D on a rows x cols grid.

    cpcourse bench tiling --json            # every grid of 4 and 9 processes against one process

Every CP algorithm decides which rank scores which tile of the score matrix `q k^T` (queries down,
keys across) and what must travel so that it can. Here the P = rows x cols ranks form a grid,
rank r at row i = r // cols, column j = r % cols (rank order, so a row's ranks hold neighbouring
shards). Each rank starts with its contiguous shard of the sequence, q `[B, H, Lq_r, D]`, k and
v `[B, H, Lk_r, D]` (`torch.tensor_split` order: lengths may differ by one, and be 0), then:

    1. all-gather Q over its ROW group (the cols ranks of row i): the query block of row i;
    2. all-gather K/V over its COLUMN group (the rows ranks of column j): every rows-th K/V shard;
    3. one attention pass over that tile, keeping its lse (`attention_with_lse`);
    4. one all-to-all over the row group sends each partial (out, lse) to the rank that owns those
       queries, which merges the cols partials with `merge_attention`.

The row group's column groups together cover all the keys, so each query's partials add up to
the whole softmax. Per rank the traffic is ~ (cols - 1) + 2 (rows - 1) + (cols - 1) shard-sized
blocks: at rows = cols = sqrt(P) it falls as 1 / sqrt(P), where the ring's stays flat.

The degenerate grids are the familiar algorithms:
    (P, 1)  all-gather K/V: Q stays home, no combine: the ring's mode="allgather" (Llama 3), and
            the same bytes (`tests/dist/test_tiling.py` checks it)
    (1, P)  all-gather Q: K/V stay home, every rank scores all queries against its own keys and
            the partials go home to be merged: a ring turned sideways, with one collective
Ulysses tiles by heads instead (each rank the whole matrix for H/P heads); USP is Ulysses inside a
ring. `cpcourse.planner.costs.tiling_bytes_per_rank` gives each one's bytes per rank.

Gloo cannot gather unequal sizes, so every message is padded to the longest shard: each rank
moves the same bytes. The partial outputs travel in float32 (float64 for float64 inputs) with the
lse as one more column, so the merge never rounds to half precision in between.
"""

from __future__ import annotations

import math
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from cpcourse.attention import accumulator_dtype, attention_with_lse, merge_attention
from cpcourse.support.agreement import check_agreed
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import (
    agree,
    forward_only,
    gather_uneven,
    pg_timeout_s,
    require_group,
    tracked,
)
from cpcourse.support.qkv import attention_scale

# (parent group) -> {(rows, cols): (row group, column group)}. new_group is collective, so a grid's
# groups are made once per parent group; weak keys let a destroyed group take its entry with it.
_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_grid(grid, world: int) -> tuple[int, int]:
    """(rows, cols) of a grid of `world` ranks, or an InputError saying what to change. Local
    arithmetic only: every rank refuses a bad grid alike, before any collective."""
    fits = _two_ints(grid) and min(grid) >= 1 and grid[0] * grid[1] == world
    if not fits:
        good = ", ".join(f"({r}, {world // r})" for r in range(1, world + 1) if world % r == 0)
        raise InputError(f"grid must be (rows, cols), two whole numbers >= 1 whose product is the "
                         f"world size {world}, got {grid!r}: use one of {good}")
    return int(grid[0]), int(grid[1])


def grid_groups(rows: int, cols: int) -> tuple[list[list[int]], list[list[int]]]:
    """The grid's (row groups, column groups) as lists of ranks: row i holds ranks i*cols ..
    i*cols + cols - 1 (it gathers Q and merges), column j ranks j, cols + j, ... (it gathers K/V).
    """
    rows_ = [[i * cols + j for j in range(cols)] for i in range(rows)]
    cols_ = [[i * cols + j for i in range(rows)] for j in range(cols)]
    return rows_, cols_


def tile(rank: int, rows: int, cols: int) -> tuple[list[int], list[int]]:
    """The tile of the score matrix rank `rank` scores: (the shards whose queries, the shards
    whose keys), shards numbered by the rank that holds them."""
    i, j = divmod(rank, cols)
    row_groups, col_groups = grid_groups(rows, cols)
    return row_groups[i], col_groups[j]


def simulate_attention_2d(q, k, v, grid, scale=None) -> torch.Tensor:
    """`attention_2d` in one process, for the whole sequence: q `[B, H, Lq, D]`, k and v
    `[B, H, Lk, D]` -> out `[B, H, Lq, D]`. The same tiles (sequence split like tensor_split over
    rows x cols shards) and the same merge, in the same order, without the transfers."""
    require(_two_ints(grid) and min(grid) >= 1,
            f"grid must be (rows, cols), two whole numbers >= 1, got {grid!r}")
    rows, cols = grid
    world = rows * cols
    qs, ks, vs = (torch.tensor_split(x, world, dim=2) for x in (q, k, v))
    parts = {}  # (query shard, column) -> (out, lse) of that shard's rows of the tile
    for rank in range(world):
        q_shards, kv_shards = tile(rank, rows, cols)
        o, lse = attention_with_lse(torch.cat([qs[m] for m in q_shards], dim=2),
                                    torch.cat([ks[m] for m in kv_shards], dim=2),
                                    torch.cat([vs[m] for m in kv_shards], dim=2), scale=scale)
        lens = [qs[m].shape[2] for m in q_shards]
        for m, po, pl in zip(q_shards, o.split(lens, dim=2), lse.split(lens, dim=2),
                             strict=True):
            parts[m, rank % cols] = (po, pl)
    outs = []
    for m in range(world):
        out, lse = parts[m, 0]
        for c in range(1, cols):
            out, lse = merge_attention(out, lse, *parts[m, c])
        outs.append(out.to(q.dtype))
    return torch.cat(outs, dim=2)


def _two_ints(grid) -> bool:
    return (isinstance(grid, (tuple, list)) and len(grid) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in grid))


def _groups(group, rank: int, rows: int, cols: int):
    """This rank's (row group, column group) in `group`, made on first use and cached. Each rank
    makes only its own two groups (local synchronisation), rows before columns on every rank, so
    the members of a group always reach it together."""
    key = group if group is not None else dist.group.WORLD
    cache = _GROUPS.setdefault(key, {})
    if (rows, cols) not in cache:
        members = dist.get_process_group_ranks(key)  # group rank -> global rank
        row_ranks, col_ranks = tile(rank, rows, cols)
        timeout = timedelta(seconds=pg_timeout_s())
        made = [dist.new_group([members[r] for r in ranks], timeout=timeout,
                               use_local_synchronization=True) if len(ranks) > 1 else None
                for ranks in (row_ranks, col_ranks)]
        cache[(rows, cols)] = tuple(made)
    return cache[(rows, cols)]


class _Log:
    """One record per collective in `stats` (None: nothing recorded), the ring's keys where they
    apply: step, rank, op, ranks (the group's ranks), comm_s, bytes_sent, bytes_recv."""

    def __init__(self, stats, rank: int):
        self.stats, self.rank = stats, rank

    def add(self, op: str, ranks: list[int], moved: int, t0: float) -> None:
        if self.stats is not None:
            self.stats.append({"step": len(self.stats), "rank": self.rank, "op": op,
                               "ranks": ranks, "comm_s": time.perf_counter() - t0,
                               "bytes_sent": moved, "bytes_recv": moved})


def _gather(x: torch.Tensor, lens: list[int], group, ranks: list[int], what: str, log: _Log):
    """x `[..., L_r, D]` (sequence at dim -2) of every rank in `ranks` -> one tensor in their
    order. Padded to the longest shard: each rank sends its block to, and receives one from,
    each of the n - 1 others."""
    t0 = time.perf_counter()
    out = gather_uneven(x, lens, dim=x.dim() - 2, group=group, what=what)
    per_token = math.prod(x.shape[:-2]) * x.shape[-1]  # elements per token (x may hold none)
    log.add(f"all_gather ({what})", ranks, (len(lens) - 1) * max(lens) * per_token
            * x.element_size(), t0)
    return out


def _combine(o, lse, lens: list[int], j: int, group, ranks: list[int], log: _Log):
    """Partials of the row's query block -> this rank's queries, merged.

    o `[B, H, sum(lens), D]`, lse `[B, H, sum(lens)]`: this rank's tile for every query of its
    row; lens: the row ranks' query lengths; j: this rank's place in the row. One all-to-all of
    `[cols, B, H, max(lens), D + 1]` (out with lse as its last column, accumulator dtype)."""
    acc = accumulator_dtype(o.dtype)
    b, h, _, d = o.shape
    most, cols = max(lens), len(lens)
    send = torch.zeros(cols, b, h, most, d + 1, dtype=acc, device=o.device)
    for c, (part, plse) in enumerate(zip(o.split(lens, dim=2), lse.split(lens, dim=2),
                                         strict=True)):
        send[c, :, :, :lens[c], :d] = part
        send[c, :, :, :lens[c], d] = plse
    recv = torch.empty_like(send)
    t0 = time.perf_counter()
    with tracked("all_to_all_single (partial out, lse -> owner)", group=group):
        dist.all_to_all_single(recv.view(-1), send.view(-1), group=group)
    log.add("all_to_all (out, lse)", ranks, (cols - 1) * send[0].numel() * send.element_size(),
            t0)
    mine = recv[:, :, :, :lens[j]]
    out, lse_acc = mine[0, ..., :d], mine[0, ..., d]
    for c in range(1, cols):  # the owner merges the row's partials, in column order
        out, lse_acc = merge_attention(out, lse_acc, mine[c, ..., :d], mine[c, ..., d])
    return out


def squarest_grid(world: int) -> tuple[int, int]:
    """(rows, cols) with rows x cols = world and rows >= cols as close as they come: 9 -> (3, 3),
    8 -> (4, 2), a prime p -> (p, 1) (all-gather K/V)."""
    cols = max(c for c in range(1, int(world ** 0.5) + 1) if world % c == 0)
    return world // cols, cols


def attention_2d(q, k, v, grid=None, group=None, scale=None, stats=None):
    """Attention of this rank's queries over the whole sequence, on a rows x cols grid of ranks.

    q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`: this rank's contiguous shards (tensor_split
    order; lengths may differ by rank, and be 0). grid = (rows, cols) with rows x cols = P, the
    size of `group` (default: the whole world); None: `squarest_grid(P)`. Returns out
    `[B, H, Lq_r, D]` in q's dtype, equal to rows of `softmax(q_all k_all^T * scale) v_all`
    (scale defaults to 1/sqrt(D)). Pass a list as `stats` to get one dict per collective this
    rank joined (step, rank, op, ranks, comm_s, bytes_sent, bytes_recv); a group of one
    rank makes no collective and no record. Must be called by every rank of `group`
    with the same grid.
    """
    rank, world = require_group(group, "attention_2d")
    rows, cols = check_grid(squarest_grid(world) if grid is None else grid, world)
    forward_only("attention_2d", q, k, v)
    require(all(isinstance(t, torch.Tensor) for t in (q, k, v)),
            f"q, k, v must be tensors [B, H, L, D], got {[type(t).__name__ for t in (q, k, v)]}")
    if scale is not None:  # before any transfer: a rank must not fail alone mid-way
        scale = attention_scale(q, scale)
    shapes = agree(group, q=q, k=k, v=v)
    kv_lens = check_agreed(q, k, v, shapes)
    q_lens = [s[2] for s in shapes["q"]]
    row_g, col_g = _groups(group, rank, rows, cols)
    row_ranks, col_ranks = tile(rank, rows, cols)
    j = rank % cols
    log = _Log(stats, rank)
    row_lens = [q_lens[r] for r in row_ranks]
    qb = _gather(q, row_lens, row_g, row_ranks, "Q", log) if cols > 1 else q
    kv = torch.stack([k, v])
    if rows > 1:
        kv = _gather(kv, [kv_lens[r] for r in col_ranks], col_g, col_ranks, "K/V", log)
    o, lse = attention_with_lse(qb, kv[0], kv[1], scale=scale)
    del kv
    if cols == 1:
        return o.to(q.dtype)
    return _combine(o, lse, row_lens, j, row_g, row_ranks, log).to(q.dtype)
