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

On the whole world the grid's rows and columns are process groups of their own, made once per
grid (new_group is collective over the world). Called inside a subgroup, where the other ranks
of the world cannot join new_group, the same exchanges run as one all-to-all over the subgroup
with zero-sized parts for the ranks outside the row or column (torch's locally synchronised
subgroups were tried: on torch 2.13 they time out after a one-rank group is made). Gloo cannot
gather unequal sizes, so every message is padded to the longest shard of its group. The partial
outputs travel in float32 (float64 for float64 inputs) with the lse as one more column, so the
merge never rounds to half precision in between.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from cpcourse.attention import accumulator_dtype, attention_with_lse, merge_attention
from cpcourse.support.agreement import check_agreed
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import (
    agree,
    all_gather_single,
    forward_only,
    pg_timeout_s,
    require_group,
    tracked,
)
from cpcourse.support.qkv import attention_scale

# world group -> {(rows, cols): {ranks: process group}}. Weak keys: a destroyed world takes its
# groups along, and a new one starts empty.
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


def merge_partials(outs: torch.Tensor, lses: torch.Tensor):
    """outs `[C, B, H, L, D]`, lses `[C, B, H, L]`: C partial attentions of the same queries over
    disjoint key sets -> (out, lse) over their union, merged in order with `merge_attention`
    (what an owner does with its row's partials)."""
    out, lse = outs[0], lses[0]
    for c in range(1, outs.shape[0]):
        out, lse = merge_attention(out, lse, outs[c], lses[c])
    return out, lse


def simulate_attention_2d(q, k, v, grid, scale=None, tiles=None, combine=None) -> torch.Tensor:
    """`attention_2d` in one process, for the whole sequence: q `[B, H, Lq, D]`, k and v
    `[B, H, Lk, D]` -> out `[B, H, Lq, D]`. The same tiles (sequence split like tensor_split over
    rows x cols shards) and the same merge, without the transfers. `tiles`: a list of (query
    shards, key shards) per rank instead of `tile`'s; `combine`: a function like
    `merge_partials` instead of it."""
    require(_two_ints(grid) and min(grid) >= 1,
            f"grid must be (rows, cols), two whole numbers >= 1, got {grid!r}")
    world = grid[0] * grid[1]
    tiles = [tile(r, *grid) for r in range(world)] if tiles is None else tiles
    qs, ks, vs = (torch.tensor_split(x, world, dim=2) for x in (q, k, v))
    parts: dict[int, list] = {m: [] for m in range(world)}  # query shard -> its partials
    for q_shards, kv_shards in tiles:
        o, lse = attention_with_lse(torch.cat([qs[m] for m in q_shards], dim=2),
                                    torch.cat([ks[m] for m in kv_shards], dim=2),
                                    torch.cat([vs[m] for m in kv_shards], dim=2), scale=scale)
        lens = [qs[m].shape[2] for m in q_shards]
        for m, po, pl in zip(q_shards, o.split(lens, dim=2), lse.split(lens, dim=2),
                             strict=True):
            parts[m].append((po.to(pl.dtype), pl))
    outs = []
    for m in range(world):
        merged, _ = (combine or merge_partials)(torch.stack([p[0] for p in parts[m]]),
                                                torch.stack([p[1] for p in parts[m]]))
        outs.append(merged.to(q.dtype))
    return torch.cat(outs, dim=2)


def _two_ints(grid) -> bool:
    return (isinstance(grid, (tuple, list)) and len(grid) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in grid))


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


@dataclass
class _At:
    """Where a call runs: this rank, the group's size, the group, the grid's row and column
    process groups by their ranks (empty inside a subgroup), and the stats log."""

    rank: int
    world: int
    group: object
    groups: dict
    log: _Log


def _grid_groups(rows: int, cols: int) -> dict:
    """The world's row and column process groups of a rows x cols grid, {ranks: group}, made on
    first use and cached. new_group is collective over the whole world: every rank makes every
    row group and then every column group, in one order (as `cpcourse.mesh` does). Inside a
    subgroup the other ranks are not here to make them, so there `_swap` does without."""
    cache = _GROUPS.setdefault(dist.group.WORLD, {})  # a new world starts a new cache
    if (rows, cols) not in cache:
        timeout = timedelta(seconds=pg_timeout_s())
        cache[rows, cols] = {tuple(ranks): dist.new_group(ranks, timeout=timeout)
                             for groups in grid_groups(rows, cols) for ranks in groups
                             if len(ranks) > 1}
    return cache[rows, cols]


def _swap(send: torch.Tensor, peers: list[int], at: _At, what: str) -> torch.Tensor:
    """send `[n, ...]`: block k goes to peers[k] (ranks of the group, ascending, this rank among
    them); returns `[n, ...]` with block k from peers[k] (this rank's own block stays home).

    With the peers' own process group: one all_to_all in it. Without (a call inside a subgroup):
    one all_to_all over the whole group in which only the peers exchange, the others' splits
    zero. Either way each rank sends n - 1 blocks and receives n - 1."""
    unit, me = send[0].numel(), peers.index(at.rank)
    moved = (len(peers) - 1) * unit * send.element_size()
    recv = torch.empty_like(send)
    t0 = time.perf_counter()
    pg = at.groups.get(tuple(peers))
    with tracked(f"all_to_all_single ({what})", group=pg or at.group):
        if pg is not None:
            dist.all_to_all_single(recv.view(-1), send.contiguous().view(-1), group=pg)
        else:
            splits = [unit if r in peers and r != at.rank else 0 for r in range(at.world)]
            payload = torch.cat([send[k].reshape(-1) for k in range(len(peers)) if k != me])
            got = payload.new_empty(payload.numel())
            dist.all_to_all_single(got, payload, output_split_sizes=splits,
                                   input_split_sizes=splits, group=at.group)
            recv[me] = send[me]
            others = [k for k in range(len(peers)) if k != me]
            for k, block in zip(others, got.split(unit), strict=True):
                recv[k] = block.view(send.shape[1:])
    at.log.add(what, peers, moved, t0)
    return recv


def _gather(x: torch.Tensor, lens: list[int], peers: list[int], at: _At, what: str):
    """x `[..., L_r, D]` (sequence at dim -2) of every rank in `peers` -> one tensor, in their
    order: an all-gather (in the peers' process group when there is one). Padded to the group's
    longest shard, so each rank sends its block to, and receives one from, each of the n - 1
    others, all of one size (as gloo's all-gather must: the count is the ring's all-gather
    path's, byte for byte)."""
    most = max(lens)
    pad = x.new_zeros(*x.shape[:-2], most, x.shape[-1])  # [..., max L_r, D]
    pad[..., :x.shape[-2], :] = x
    pg = at.groups.get(tuple(peers))
    if pg is None:
        got = _swap(pad.unsqueeze(0).expand(len(peers), *pad.shape), peers, at,
                    f"all_gather ({what})")
    else:
        got = pad.new_empty(len(peers), *pad.shape)  # [n, ..., max L_r, D]
        t0 = time.perf_counter()
        with tracked(f"all_gather ({what})", group=pg):
            all_gather_single(got, pad, group=pg)
        at.log.add(f"all_gather ({what})", peers,
                   (len(peers) - 1) * pad.numel() * pad.element_size(), t0)
    return torch.cat([got[k][..., :n, :] for k, n in enumerate(lens)], dim=-2)  # [..., sum, D]


def _combine(o, lse, lens: list[int], peers: list[int], at: _At):
    """Partials of the row's query block -> this rank's queries, merged.

    o `[B, H, sum(lens), D]`, lse `[B, H, sum(lens)]`: this rank's tile for every query of its
    row; lens: the row ranks' query lengths. Each part travels as `[B, H, max(lens), D + 1]`
    (out with lse as its last column, accumulator dtype) to the rank that owns those queries."""
    acc = accumulator_dtype(o.dtype)
    b, h, _, d = o.shape
    send = torch.zeros(len(lens), b, h, max(lens), d + 1, dtype=acc, device=o.device)  # [C, ...]
    for c, (part, plse) in enumerate(zip(o.split(lens, dim=2), lse.split(lens, dim=2),
                                         strict=True)):
        send[c, :, :, :lens[c], :d] = part
        send[c, :, :, :lens[c], d] = plse
    mine = _swap(send, peers, at, "all_to_all (out, lse)")  # [C, B, H, max L, D + 1]: mine
    mine = mine[:, :, :, :lens[peers.index(at.rank)]]  # [C, B, H, Lq_r, D + 1]
    return merge_partials(mine[..., :d], mine[..., d])[0]  # the row's partials, column order


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
    row, col = tile(rank, rows, cols)
    whole = group is None or group == dist.group.WORLD  # only there can the grid's groups be made
    at = _At(rank, world, group, _grid_groups(rows, cols) if whole else {}, _Log(stats, rank))
    # [B, H, Lq_row, D]: the queries of every rank in my grid row
    qb = _gather(q, [q_lens[r] for r in row], row, at, "Q") if cols > 1 else q
    kv = torch.stack([k, v])  # [2, B, H, Lk_r, D]
    if rows > 1:
        kv = _gather(kv, [kv_lens[r] for r in col], col, at, "K/V")  # [2, B, H, Lk_col, D]
    o, lse = attention_with_lse(qb, kv[0], kv[1], scale=scale)  # my tile: [B, H, Lq_row, D]
    del kv, qb
    if cols == 1:
        return o.to(q.dtype)
    return _combine(o, lse, [q_lens[r] for r in row], row, at).to(q.dtype)  # [B, H, Lq_r, D]
