"""Block-causal attention with the chunks dealt out to P ranks: a ring that skips, or an all-to-all.

    python -m pytest tests/dist/test_causal_cp.py -q

Each rank holds the tokens of the chunks `assign_chunks` gave it, in chunk order. Every rank knows
the whole layout (`chunk_of_token`) and the scheme, so it knows which chunks every other rank
holds: no index travels, only K/V. Within any rank's block the chunks ascend, so the keys a query
chunk c may see are a PREFIX of the block (chunks <= c): the mask is applied by slicing, and a
block with an empty prefix for every query chunk is skipped, no compute.

Methods:
    "ring"        the course's ring (`RingComm`): every block still visits every rank, because a
                  rank downstream may need what this one skips; the bytes that land where they are
                  not needed are counted as wasted, per rank
    "all_to_all"  one `all_to_all_single`: each rank sends each K/V chunk only to the ranks whose
                  last chunk is at or after it; nothing wasted, and no overlap with compute
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.attention import accumulator_dtype, attention_with_lse, merge_attention
from cpcourse.causal.chunks import SCHEMES, assign_chunks, chunk_sizes, rank_work
from cpcourse.ring import RingComm
from cpcourse.support.errors import require
from cpcourse.support.groups import agree, forward_only, require_group, tracked
from cpcourse.support.qkv import attention_scale

METHODS = ("ring", "all_to_all")


def _runs(chunks: list[int], sizes: list[int]) -> list[tuple[int, int, int]]:
    """(chunk, start, stop) of each of a rank's chunks within its token tensor."""
    out, at = [], 0
    for c in chunks:
        out.append((c, at, at + sizes[c]))
        at += sizes[c]
    return out


def _prefix(chunks: list[int], sizes: list[int], last: int) -> int:
    """Tokens of a block (chunks ascending) that a query chunk `last` may see."""
    return sum(sizes[c] for c in chunks if c <= last)


@dataclass(frozen=True)
class _Call:
    """One call's settings, the same on every rank: its group and place in it, the chunks'
    `assignment` to ranks and token `sizes`, the softmax scale and the `stats` list (or None)."""

    group: object
    rank: int
    world: int
    assignment: list
    sizes: list
    scale: float
    stats: list | None


def _attend_block(q, kv, runs, block_chunks, sizes, scale, acc) -> int:
    """Fold this rank's query chunks over one K/V block (kv[0], kv[1] `[B, H, Lk, D]`) into
    acc = (out `[B, H, L_r, D]`, lse `[B, H, L_r]`) in place. Returns the score-matrix area
    computed (0 when the block is skipped)."""
    (k, v), (out, lse), area = kv, acc, 0
    for c, start, stop in runs:
        m = _prefix(block_chunks, sizes, c)  # the block's first m tokens: those chunk c sees
        if m == 0:
            continue
        # [B, H, stop - start, D] over [B, H, m, D]
        o, l_ = attention_with_lse(q[:, :, start:stop], k[:, :, :m], v[:, :, :m], scale=scale)
        out[:, :, start:stop], lse[:, :, start:stop] = merge_attention(
            out[:, :, start:stop], lse[:, :, start:stop], o, l_)
        area += (stop - start) * m
    return area


def _ring(q, k, v, call: _Call):
    assignment, sizes, rank, world = call.assignment, call.sizes, call.rank, call.world
    lens = [sum(sizes[c] for c in mine) for mine in assignment]
    comm = RingComm(call.group, rank, world, lens, (*k.shape[:2], k.shape[3], k.dtype), k.device)
    runs, last = _runs(assignment[rank], sizes), max(assignment[rank])
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros(*q.shape[:3], v.shape[3], dtype=acc, device=q.device)  # [B, H, L_r, D]
    lse = torch.full(q.shape[:3], -torch.inf, dtype=acc, device=q.device)  # [B, H, L_r]
    kv, area, useful, wasted = comm.load(k, v), 0, 0, 0  # kv [2, B, H, L_r, D]
    row = 2 * k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()  # K and V of one token
    for step in range(world):
        nxt = comm.next_block(step)
        if nxt is not None:
            comm.exchange(step)
        owner = (rank - step) % world
        area += _attend_block(q, kv, runs, assignment[owner], sizes, call.scale, (out, lse))
        if step:  # the block arrived over the wire: did this rank need it?
            need = _prefix(assignment[owner], sizes, last)
            useful, wasted = useful + need * row, wasted + (kv.shape[3] - need) * row
        comm.wait(step)
        if nxt is not None:
            kv = comm.advance()
    if call.stats is not None:
        call.stats.append({"rank": rank, "method": "ring", "work": area,
                      "useful_bytes": useful, "wasted_bytes": wasted})
    return out


def _all_to_all(q, k, v, call: _Call):
    import torch.distributed as dist

    assignment, sizes, rank, world, group = (call.assignment, call.sizes, call.rank, call.world,
                                             call.group)
    mine, last = assignment[rank], [max(a) for a in assignment]
    send_rows = [_prefix(mine, sizes, last[d]) for d in range(world)]  # to each rank
    recv_rows = [_prefix(assignment[s], sizes, last[rank]) for s in range(world)]
    packed = torch.stack([k, v]).permute(3, 0, 1, 2, 4).contiguous()  # [L_r, 2, B, H, D]
    row = packed[0].numel()
    send = torch.cat([packed[:n].reshape(-1) for n in send_rows])
    recv = packed.new_empty(sum(recv_rows) * row)
    if world > 1:
        with tracked("all_to_all_single (K/V chunks to the ranks that need them)", group=group):
            dist.all_to_all_single(recv, send, output_split_sizes=[n * row for n in recv_rows],
                                   input_split_sizes=[n * row for n in send_rows], group=group)
    else:
        recv = send
    got = [c for a in assignment for c in a if c <= last[rank]]  # in arrival (rank) order
    key_chunks = torch.repeat_interleave(torch.tensor(got, dtype=torch.long),
                                         torch.tensor([sizes[c] for c in got], dtype=torch.long))
    order = torch.argsort(key_chunks, stable=True).to(recv.device)  # each query chunk: a prefix
    kv = recv.view(-1, *packed.shape[1:])[order].permute(1, 2, 3, 0, 4)  # [2, B, H, Lk, D]
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros(*q.shape[:3], v.shape[3], dtype=acc, device=q.device)  # [B, H, L_r, D]
    lse = torch.full(q.shape[:3], -torch.inf, dtype=acc, device=q.device)  # [B, H, L_r]
    area = _attend_block(q, kv, _runs(mine, sizes), sorted(got), sizes, call.scale, (out, lse))
    if call.stats is not None:
        call.stats.append({"rank": rank, "method": "all_to_all", "work": area,
                      "useful_bytes": (sum(recv_rows) - recv_rows[rank]) * row
                      * packed.element_size(), "wasted_bytes": 0})
    return out


def block_causal_attention_cp(q, k, v, chunk_of_token, group=None, scheme: str = "zigzag",
                              method: str = "ring", scale=None, stats=None) -> torch.Tensor:
    """Block-causal attention of this rank's tokens, the chunks dealt out by `scheme`.

    chunk_of_token: long `[L]`, the chunk of every token of the WHOLE sequence (0, 0, .., 1, ..;
    `chunk_of_frames` makes it), the same on every rank. q, k, v `[B, H, L_r, D]`: this rank's
    tokens, those of its chunks `assign_chunks(n_chunks, P, scheme, sizes)[rank]` in chunk order
    (`rank_tokens` gives their positions). Returns out `[B, H, L_r, D]` in q's dtype: rows of
    `softmax(mask(q k^T * scale)) v` over the whole sequence, mask = `block_causal_mask`.
    method: "ring" | "all_to_all" (module docstring). Pass a list as `stats` for one record:
    work (score-matrix area this rank computed), useful_bytes and wasted_bytes (K/V this rank
    received that it did / did not attend to). Must be called by every rank of `group`.
    """
    rank, world = require_group(group, "block_causal_attention_cp")
    forward_only("block_causal_attention_cp", q, k, v)
    require(method in METHODS, f"method must be one of {', '.join(METHODS)}, got {method!r}")
    require(scheme in SCHEMES, f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    sizes = chunk_sizes(chunk_of_token)
    assignment = assign_chunks(len(sizes), world, scheme, sizes)
    shapes = agree(group, q=q, k=k, v=v)  # every rank raises the same error, none hangs
    want = [sum(sizes[c] for c in a) for a in assignment]
    got = [s[2] for s in shapes["q"]]
    require(got == want and [s[2] for s in shapes["k"]] == want and q.shape == k.shape == v.shape,
            f"each rank must pass the tokens of its chunks under scheme {scheme!r}: "
            f"{want} tokens per rank, got {got} (q) and {[s[2] for s in shapes['k']]} (k); "
            "take them with cpcourse.causal.rank_tokens")
    scale = attention_scale(q, scale)
    run = _ring if method == "ring" else _all_to_all
    out = run(q, k, v, _Call(group, rank, world, assignment, sizes, scale, stats))
    if stats is not None:
        stats[-1]["planned_work"] = rank_work(assignment, sizes)[rank]
    return out.to(q.dtype)
