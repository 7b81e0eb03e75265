"""Block-sparse attention under CP: Ulysses with the mask's heads local, a ring that skips what
no one needs, and a greedy balancing of the work.

    cpcourse sparse --nproc 4 --method ring --mask radial --balance greedy --compare --json

Sparsity is exact under both designs; what it breaks is balance (db-SP, arXiv 2511.23113):
  - Ulysses: after the all-to-all each rank holds the whole sequence for H/P heads, so any
    block mask runs unchanged (`ulysses_sparse`). Its work is its heads' kept blocks: a
    per-head mask whose heads differ in density makes ranks unequal. `balance="greedy"` deals the
    heads to ranks by kept work, heaviest first (db-SP's head-level assignment).
  - Ring: each rank holds its queries and meets every other rank's K/V once (`ring_sparse`).
    At step s rank r sends its own K/V to rank r + s, and only when that rank's queries keep a
    block of it: a static local mask turns the ring into a halo exchange. Its work is the kept
    blocks of its query tiles: a radial mask loads the middle frames most. `balance="greedy"`
    deals query tiles to ranks by kept work, as many tiles each (db-SP's block level).
Work is counted in score entries computed (|query tile| x |key tile| per kept block); the
imbalance is max over mean of the ranks' work. A `codec` (`cpcourse.fp8_comm`) sets how K/V
(and q, out for Ulysses) travel; bytes are the messages' bytes, scales included.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cpcourse.fp8_comm import Codec
from cpcourse.sparse import (
    BlockMask,
    block_sparse_attention,
    merge_into,
    tile_of_token,
    tile_sizes,
)
from cpcourse.support.errors import require
from cpcourse.support.shards import shard_sizes

BALANCES = ("none", "greedy")


def greedy_assign(weights, world: int) -> list[list[int]]:
    """Items to ranks, heaviest first, each to the least-loaded rank that still has room (room:
    the tensor_split sizes of len(weights) over world, so every rank holds as many items).
    Returns each rank's items, sorted. Ties go to the lower rank and the lower item."""
    weights = [float(w) for w in weights]
    room = shard_sizes(len(weights), world)
    load, owned = [0.0] * world, [[] for _ in range(world)]
    for item in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        r = min((r for r in range(world) if len(owned[r]) < room[r]), key=lambda r: (load[r], r))
        owned[r].append(item)
        load[r] += weights[item]
    return [sorted(o) for o in owned]


def contiguous(n: int, world: int) -> list[list[int]]:
    """0..n-1 split in tensor_split order: the unbalanced assignment."""
    sizes, start, out = shard_sizes(n, world), 0, []
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def block_work(bm: BlockMask) -> torch.Tensor:
    """`[heads, n]`: score entries each (head, query tile) computes over its kept blocks."""
    sizes = tile_sizes(bm.grid, bm.tile).double()
    return (bm.mask.double() * sizes[None, :, None] * sizes[None, None, :]).sum(-1)


def heads_of_ranks(bm: BlockMask, world: int, balance: str = "none") -> list[list[int]]:
    """Ulysses: each rank's heads, contiguous or dealt by kept work (`greedy_assign`)."""
    require(balance in BALANCES, f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    heads = bm.mask.shape[0]
    require(heads % world == 0, f"Ulysses gives each rank heads/P heads: {heads} heads do not "
            f"split over {world} ranks")
    plain = contiguous(heads, world)
    if balance == "none":
        return plain
    dealt = greedy_assign(block_work(bm).sum(-1).tolist(), world)
    return _better(bm, "ulysses", dealt, plain)


def tokens_of_ranks(bm: BlockMask, world: int, balance: str = "none") -> list[torch.Tensor]:
    """Ring: each rank's token ids. "none": contiguous shards of the (t, h, w) sequence
    (tensor_split order); "greedy": whole query tiles dealt by kept work, as many tiles each."""
    require(balance in BALANCES, f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    owner = tile_of_token(bm.grid, bm.tile)
    plain = [torch.tensor(ids, dtype=torch.long) for ids in contiguous(len(owner), world)]
    if balance == "none":
        return plain
    n = bm.mask.shape[1]
    require(n >= world, f"greedy gives each rank whole tiles: {n} tiles for {world} ranks; "
            "use smaller tiles or fewer ranks")
    tiles = greedy_assign(block_work(bm).sum(0).tolist(), world)
    dealt = [torch.isin(owner, torch.tensor(t)).nonzero().flatten() for t in tiles]
    return _better(bm, "ring", dealt, plain)


def _better(bm, method, dealt, plain):
    """The greedy deal, unless it is no more even than the plain split: dealing whole items
    heaviest-first is a heuristic, and a contiguous split cut mid-tile can already be even."""
    work = [imbalance(predicted_work(bm, method, a)) for a in (dealt, plain)]
    return dealt if work[0] < work[1] else plain


def predicted_work(bm: BlockMask, method: str, assignment) -> list[float]:
    """Each rank's score entries, without running: Ulysses sums its heads' work, the ring its
    queries' rows (tokens of a tile a rank holds only part of count for that part)."""
    if method == "ulysses":
        per_head = block_work(bm).sum(-1)
        return [float(per_head[h].sum()) for h in assignment]
    owner, sizes = tile_of_token(bm.grid, bm.tile), tile_sizes(bm.grid, bm.tile).double()
    per_token = (bm.mask.double() * sizes[None, None, :]).sum((0, 2))[owner]  # over heads, keys
    return [float(per_token[ids].sum()) for ids in assignment]


def imbalance(work) -> float:
    """max over mean of the ranks' work (1 = perfectly even)."""
    mean = sum(work) / len(work)
    return max(work) / mean if mean else 1.0


def ring_needs(bm: BlockMask, ids) -> torch.Tensor:
    """`[P, P]` bool: need[a, b] when rank b's queries keep a block of rank a's keys."""
    owner = tile_of_token(bm.grid, bm.tile)
    n, world = bm.mask.shape[1], len(ids)
    has = torch.zeros(world, n, dtype=torch.bool)
    for r, t in enumerate(ids):
        has[r, owner[t]] = True
    kept = bm.mask.any(0).double()                                  # [n q tiles, n k tiles]
    return (has.double() @ kept @ has.double().T > 0).T.clone()  # [a keys, b queries]


def _exchange(sends: list, recv_shapes: list, codec: Codec, dtype, group) -> list:
    """One all-to-all of per-rank tensors (None: nothing to rank j), each as codec's message.
    Returns what each rank sent me, decoded (None where its shape is None), and my bytes sent."""
    rank = dist.get_rank(group)
    bufs = [codec.encode(x) if x is not None and j != rank else torch.empty(0, dtype=torch.uint8)
            for j, x in enumerate(sends)]
    sizes = [0 if s is None or j == rank else codec.nbytes(s, dtype)
             for j, s in enumerate(recv_shapes)]
    recv = torch.empty(sum(sizes), dtype=torch.uint8)
    dist.all_to_all_single(recv, torch.cat(bufs), output_split_sizes=sizes,
                           input_split_sizes=[len(b) for b in bufs], group=group)
    parts = recv.split(sizes)
    got = [sends[j] if j == rank else None if s is None else codec.decode(parts[j], s, dtype)
           for j, s in enumerate(recv_shapes)]
    return got, sum(len(b) for b in bufs)


def _lengths(mine: int, group) -> list[int]:
    """Every rank's sequence length (one small all-gather)."""
    got = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, torch.tensor([mine]), group=group)
    return [int(g) for g in got]


def ulysses_sparse(q, k, v, bm: BlockMask, heads=None, group=None, codec=None, stats=None):
    """Sparse attention, Ulysses style. q, k, v `[B, H, L_r, D]`: this rank's contiguous run of
    the sequence (any lengths, agreed here: tensor_split order or whole frames). `heads`: each
    rank's head ids (default contiguous, `heads_of_ranks` for a balanced deal). Returns out
    `[B, H, L_r, D]`; `stats` (a dict) gets work, blocks, skipped, bytes_sent, dense_bytes (the
    same exchange's bytes in the inputs' dtype) and seconds."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    codec = codec or Codec()
    b, h, _, d = q.shape
    lens = _lengths(q.shape[2], group)
    heads = heads or contiguous(h, world)
    qkv = torch.stack([q, k, v])                                 # [3, B, H, L_r, D]
    t0 = time.perf_counter()
    sends = [qkv[:, :, hs] for hs in heads]                      # [3, B, H/P, L_r, D] each
    got, sent = _exchange(sends, [(3, b, len(heads[rank]), lens[j], d)
                                  for j in range(world)], codec, q.dtype, group)
    mine = torch.cat(got, dim=3)                                 # [3, B, H/P, L, D]
    st = {} if stats is None else stats
    out, _ = block_sparse_attention(mine[0], mine[1], mine[2], bm.of_heads(heads[rank]),
                                    stats=st)                    # [B, H/P, L, D]
    pieces = list(out.to(q.dtype).split(lens, dim=2))
    back, sent2 = _exchange(pieces, [(b, len(heads[j]), lens[rank], d) for j in range(world)],
                            codec, q.dtype, group)
    result = q.new_empty(b, h, lens[rank], d)
    for j, hs in enumerate(heads):
        result[:, hs] = back[j]
    # the same exchange in the inputs' dtype: q, k, v of their heads out, my heads' out back
    dense = sum(3 * b * len(hs) * lens[rank] * d + b * len(heads[rank]) * lens[j] * d
                for j, hs in enumerate(heads) if j != rank)
    st.update(bytes_sent=sent + sent2, dense_bytes=dense * q.element_size(),
              seconds=time.perf_counter() - t0)
    return result


def ring_sparse(q, k, v, bm: BlockMask, ids, group=None, codec=None, stats=None):
    """Sparse attention, ring style. q, k, v `[B, H, len(ids[rank]), D]`: this rank's tokens
    `ids[rank]` (global (t, h, w) ids; contiguous shards or `tokens_of_ranks`). At step s rank r
    sends its own K/V to r + s and receives r - s's, each only when the receiver's queries keep
    a block of it (`dense_bytes`: what a ring that never skips sends). Returns out
    `[B, H, len(ids[rank]), D]`; `stats` as for `ulysses_sparse`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    codec = codec or Codec()
    need = ring_needs(bm, ids)
    st = {} if stats is None else stats
    t0 = time.perf_counter()
    acc = merge_into(None, block_sparse_attention(q, k, v, bm, q_ids=ids[rank], k_ids=ids[rank],
                                                  stats=st))
    kv = torch.stack([k, v])                                     # [2, B, H, L_r, D]
    sent = dense = 0
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        ops = []
        if need[rank, dst]:
            msg = codec.encode(kv)
            ops.append(dist.isend(msg, dst, group=group))
            sent += len(msg)
        if need[src, rank]:
            shape = (2, *k.shape[:2], len(ids[src]), k.shape[3])
            buf = torch.empty(codec.nbytes(shape, k.dtype), dtype=torch.uint8)
            ops.append(dist.irecv(buf, src, group=group))
        for op in ops:
            op.wait()
        dense += kv.numel() * kv.element_size()
        if need[src, rank]:
            kv_src = codec.decode(buf, shape, k.dtype)
            acc = merge_into(acc, block_sparse_attention(
                q, kv_src[0], kv_src[1], bm, q_ids=ids[rank], k_ids=ids[src], stats=st))
    st.update(bytes_sent=sent, dense_bytes=dense, seconds=time.perf_counter() - t0)
    return acc[0].to(q.dtype)


def pooled_cp(x, ids, grid, tile, group=None) -> torch.Tensor:
    """Tile means `[H, n, D]` (float64) of the whole sequence from this rank's tokens `ids`:
    each rank sums its own, one all-reduce adds them (`pooled_tiles`, distributed)."""
    owner, sizes = tile_of_token(grid, tile), tile_sizes(grid, tile)
    sums = x.new_zeros(x.shape[1], len(sizes), x.shape[3], dtype=torch.float64)
    sums.index_add_(1, owner[ids], x.double().sum(0))
    dist.all_reduce(sums, group=group)
    return sums / (sizes * x.shape[0]).double()[None, :, None]
