"""Ring attention over torch.distributed: local shards in, local output out.

    python -m cpcourse.cli demo --nproc 4           # runs it on 4 local processes and checks it

Each rank holds a contiguous shard of the sequence, q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`
(split like `torch.tensor_split`, so shard lengths may differ by one and some ranks may hold no
tokens at all). At ring step s, rank r holds the K/V block of rank (r - s) mod P: it attends its
queries to that block (`attention_with_lse`), folds the partial result into its running output
(`merge_attention`'s formula, done in place by `_fold`), and passes the block on to rank r + 1
while receiving the next one from rank r - 1. After P steps every query has seen every key; the
output never leaves its rank.

Modes (all give the same result up to rounding):
    "overlap"   the next K/V block is in flight (isend/irecv) while the current one is computed,
                with two receive buffers used in turn; on GPU NCCL moves it on its own stream
    "blocking"  compute, then exchange: the communication time adds up in full
    "allgather" all-gather every K/V shard up front (padded to the longest shard), then one
                attention call over the whole sequence: Llama 3's choice, P x the K/V memory
Before any transfer the ranks all-gather their shapes and dtypes (`cpcourse.support.groups.agree`),
so inputs that disagree raise the same InputError on every rank instead of hanging. While shapes
stay the same from call to call, the ring skips that all-gather and flags changes in its own
messages instead (see `ring_attention`).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpcourse.attention import _scale, accumulator_dtype, attention_with_lse
from cpcourse.support.errors import require
from cpcourse.support.groups import (
    agree,
    all_gather_single,
    forward_only,
    global_rank,
    require_group,
    tracked,
)

MODES = ("overlap", "blocking", "allgather")


def _check(q, k, v, shapes: dict, mode: str) -> list[int]:
    """Checks that give the same answer on every rank (after `agree`); returns K/V lengths.
    (`ring_attention` has checked `mode` before any transfer.)"""
    require(q.dim() == 4, f"q, k, v must be [B, H, L, D] shards, got q of shape {tuple(q.shape)}")
    require(k.dtype == q.dtype and v.dtype == q.dtype and q.dtype.is_floating_point,
            f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    require(q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3],
            f"q and k must share B, H and D: got {tuple(q.shape)} and {tuple(k.shape)}")
    kv_lens = [s[2] for s in shapes["k"]]
    require(kv_lens == [s[2] for s in shapes["v"]] and k.shape[3] == v.shape[3],
            f"k and v must have the same shape on every rank: k lengths {kv_lens}, v lengths "
            f"{[s[2] for s in shapes['v']]}, head dims {k.shape[3]} and {v.shape[3]}")
    return kv_lens


def _check_known(q, k, v, lens, rank: int, world: int, mode: str) -> list[int]:
    """The same checks as after `agree`, when the caller passed every rank's K/V lengths."""
    require(isinstance(lens, (list, tuple)) and len(lens) == world and all(
        isinstance(n, int) and n >= 0 for n in lens), f"lens must list {world} shard lengths "
        f"(one per rank of the group), got {lens!r}")
    require(k.dim() == 4 and v.dim() == 4 and k.shape[2] == v.shape[2] == lens[rank],
            f"lens[{rank}] = {lens[rank]}, but this rank's k and v have shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}")
    shapes = {x: [tuple(t.shape[:2]) + (n, t.shape[3]) for n in lens]
              for x, t in (("k", k), ("v", v))}
    return _check(q, k, v, shapes, mode)


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:  # timings must include the queued kernels
        torch.cuda.synchronize(t.device)


def _fold(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, l_: torch.Tensor) -> None:
    """`merge_attention` done in place on the running (out, lse).

    The ring merges once per step and per layer, so merge_attention's five output-sized
    temporaries would be paid thousands of times per sample; here the only output-sized tensor
    besides the running out is the block's own (and its float32 copy when the block is bf16).
    Blocks come from `attention_with_lse`, whose empty blocks are out = 0 and lse = -inf, so
    there is no garbage to mask; NaN from NaN inputs still propagates.
    """
    new = torch.logaddexp(lse, l_)
    base = new.masked_fill(torch.isneginf(new), 0.0)  # both empty: exp(-inf - 0) = 0, not NaN
    out.mul_(torch.exp(lse - base).unsqueeze_(-1))
    out.addcmul_(o.to(out.dtype), torch.exp(l_ - base).unsqueeze_(-1))
    lse.copy_(new)


def _exchange(send, recv, dst: int, src: int, group, step: int) -> list:
    """Start sending `send` to `dst` and receiving into `recv` from `src`; returns the requests.

    Empty blocks are skipped on both sides (both know every shard length).
    """
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, dst, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, src, group))
    if not ops:
        return []
    with tracked("batch_isend_irecv", group=group, ring_step=step, send_to=dst, recv_from=src):
        return dist.batch_isend_irecv(ops)


def _wait(reqs: list, step: int, dst: int, src: int) -> None:
    if reqs:
        with tracked("wait for K/V block", ring_step=step, send_to=dst, recv_from=src):
            for req in reqs:
                req.wait()


def _ring(q, k, v, kv_lens, rank, world, group, scale, overlap: bool, stats, stale=None,
          spec=None):
    """The ring proper: P steps, K and V packed `[2, B, H, L, D]` so each hop is one message.

    Returns (out, clean). With `stale` None the shapes were agreed just now: clean is True.
    Otherwise the call runs on the group's last agreement (`spec` = its B, H, D and dtype) and
    every message carries one more element, its owner's flag "my shapes changed since then"
    (`stale`). A stale rank sends zeros of the agreed size and computes nothing. Every block
    passes every rank, so after the last hop every rank has seen every flag, and all of them
    return clean = False together when any flag was up (the caller then agrees and reruns).
    """
    flagged = stale is not None
    b, h, d, dtype = spec if flagged else (q.shape[0], q.shape[1], q.shape[3], k.dtype)
    dst = global_rank(group, (rank + 1) % world)
    src = global_rank(group, (rank - 1) % world)
    # Two flat buffers used in turn: step s receives into bufs[s % 2] while it computes on the
    # other. The local block starts in bufs[1]; its send is complete before step 1 reuses it.
    # So a rank holds two K/V blocks, never P of them.
    size = 2 * b * h * max(kv_lens) * d + flagged
    bufs = [torch.empty(size, dtype=dtype, device=k.device) for _ in range(2)]

    def view(buf, n):  # (K/V block, the message that carries it, its flag slot)
        m = 2 * b * h * n * d
        return buf[:m].view(2, b, h, n, d), buf[:m + flagged], buf[m:m + flagged]

    cur, msg, flag = view(bufs[1], kv_lens[rank])
    if stale:  # this rank's K/V may not even fit the agreed shape: send zeros, flagged
        cur.zero_()
    else:
        cur[0].copy_(k)
        cur[1].copy_(v)
    if flagged:
        flag.fill_(float(stale))
        seen = flag.to(torch.float32, copy=True)  # a copy: the buffer is received into again
    out = lse = None
    for step in range(world):
        block = (rank - step) % world  # whose K/V this rank holds now
        t0 = time.perf_counter()
        reqs, nxt = [], None
        if step < world - 1:
            nxt, nmsg, nflag = view(bufs[step % 2], kv_lens[(block - 1) % world])
            if overlap:
                reqs = _exchange(msg, nmsg, dst, src, group, step)
        t1 = time.perf_counter()
        if not stale:
            o, l_ = attention_with_lse(q, cur[0], cur[1], scale=scale)
            if out is None:
                out, lse = o.to(accumulator_dtype(o.dtype)), l_
            else:
                _fold(out, lse, o, l_)
            del o, l_  # the block's output is folded in: do not hold it through the next step
        if stats is not None:
            _sync(cur)
        t2 = time.perf_counter()
        if nxt is not None and not overlap:
            reqs = _exchange(msg, nmsg, dst, src, group, step)
        _wait(reqs, step, dst, src)
        if stats is not None and not stale:  # a stale rank's q may not even be 4-d
            _sync(cur)
            elem = cur.element_size()
            stats.append({
                "step": step, "rank": rank, "kv_block": block, "q_tokens": q.shape[2],
                "kv_tokens": cur.shape[3], "compute_s": t2 - t1,
                "comm_s": (t1 - t0) + (time.perf_counter() - t2),
                "bytes_sent": cur.numel() * elem if nxt is not None else 0,
                "bytes_recv": nxt.numel() * elem if nxt is not None else 0})
        if nxt is not None:
            if flagged:
                seen += nflag.float()  # read before step + 2 receives into this buffer again
            cur, msg = nxt, nmsg
    if not flagged:
        return out, True
    return out, not stale and not bool(seen.item())


def _allgather(q, k, v, kv_lens, rank, world, group, scale, stats):
    """All-gather K/V (padded to the longest shard: gloo cannot gather uneven sizes), one call."""
    b, h, _, d = q.shape
    longest = max(kv_lens)
    t0 = time.perf_counter()
    padded = k.new_zeros(2, b, h, longest, d)
    padded[0, :, :, : k.shape[2]] = k
    padded[1, :, :, : v.shape[2]] = v
    gathered = k.new_empty(world, 2, b, h, longest, d)
    with tracked("all_gather (K/V)", group=group):
        all_gather_single(gathered, padded, group=group)
    full = torch.cat([gathered[r, :, :, :, : kv_lens[r]] for r in range(world)], dim=3)
    block_bytes = padded.numel() * padded.element_size()
    del gathered, padded
    if stats is not None:
        _sync(q)
    t1 = time.perf_counter()
    out, _ = attention_with_lse(q, full[0], full[1], scale=scale)
    if stats is not None:
        _sync(q)
        stats.append({"step": 0, "rank": rank, "kv_block": -1, "q_tokens": q.shape[2],
                      "kv_tokens": full.shape[3], "compute_s": time.perf_counter() - t1,
                      "comm_s": t1 - t0, "bytes_sent": (world - 1) * block_bytes,
                      "bytes_recv": (world - 1) * block_bytes})
    return out


@dataclass
class _Agreement:
    """A group's last shape agreement. Every field is the same on every rank of the group
    except `sig` (this rank's own), because each is set only from what all ranks saw."""
    sig: tuple          # this rank's q, k, v dtypes and shapes (q's length left out)
    shapes: dict        # every rank's shapes, as `agree` returned them
    kv_lens: list[int]
    spec: tuple         # B, H, D and dtype of every K/V block
    confirmed: bool     # the agreement before this one found the same shapes and dtype


# group -> _Agreement. Weak keys: a destroyed group's entry (and its sockets) goes with it, and
# a ProcessGroup hashes by identity, so a new group never finds an old group's agreement.
_AGREED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# So a group's first AGREED_CALLS ring calls of one shape agree (the second confirms the
# first); later ones carry the flag. `cpcourse.tinydit.costs` counts the flag bytes from this.
AGREED_CALLS = 2


def _signature(q, k, v) -> tuple:
    return (q.dtype, k.dtype, v.dtype, tuple(q.shape[:2]) + tuple(q.shape[3:]), q.dim(),
            tuple(k.shape), tuple(v.shape))


def _agree(q, k, v, group, mode: str) -> list[int]:
    """Agree shapes with every rank (one all-gather), check them, remember the agreement."""
    shapes = agree(group, q=q, k=k, v=v)
    kv_lens = _check(q, k, v, shapes, mode)
    key = group if group is not None else dist.group.WORLD
    last, spec = _AGREED.get(key), (*k.shape[:2], k.shape[3], k.dtype)
    _AGREED[key] = _Agreement(_signature(q, k, v), shapes, kv_lens, spec, confirmed=(
        last is not None and last.shapes == shapes and last.spec == spec))
    return kv_lens


def ring_attention(q, k, v, group=None, scale=None, mode: str = "overlap", stats=None,
                   lens: list[int] | None = None):
    """Attention of this rank's queries over the whole (sharded) sequence's keys and values.

    q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`: this rank's contiguous shards (tensor_split
    order; lengths may differ across ranks, and be 0). Returns out `[B, H, Lq_r, D]` in q's dtype,
    equal to rows of `softmax(q_all k_all^T * scale) v_all`. scale defaults to 1/sqrt(D).
    mode: "overlap" | "blocking" | "allgather" (see the module docstring). Pass a list as `stats`
    to get one record per ring step: kv_block, tokens, compute_s, comm_s (time spent in
    communication calls: the exposed part when overlapped), bytes_sent, bytes_recv (K/V bytes;
    a call on a remembered agreement sends one more element per message, its flag).
    Must be called by every rank of `group` (default: the whole world).

    Shapes are agreed (an all-gather) only while they change: once two agreements in a row
    found the same shapes, later ring calls run on the remembered one and each K/V message
    carries a "my shapes changed" flag; a raised flag makes every rank agree again and rerun,
    so a rank that changes shape alone gets the same InputError on every rank as before.
    `lens`: every rank's K/V shard length, when the caller already knows them (a model's CP
    hooks do): no agreement and no flag, so a caller that passes wrong lens on one rank gets a
    timeout, not the agreement's clear error.
    """
    rank, world = require_group(group, "ring_attention")
    forward_only("ring_attention", q, k, v)
    require(mode in MODES, f"mode must be one of {MODES}, got {mode!r}")
    require(all(isinstance(t, torch.Tensor) for t in (q, k, v)),
            f"q, k, v must be tensors [B, H, L, D], got "
            f"{[type(t).__name__ for t in (q, k, v)]}")
    if scale is not None:  # before any transfer: a rank must not fail alone mid-ring
        scale = _scale(q, scale)
    if lens is not None:  # the caller vouches for every rank's shard lengths
        kv_lens = _check_known(q, k, v, lens, rank, world, mode)
    elif world == 1:  # nothing to agree with
        kv_lens = _check(q, k, v, {"k": [tuple(k.shape)], "v": [tuple(v.shape)]}, mode)
    else:
        last = _AGREED.get(group if group is not None else dist.group.WORLD)
        if last is not None and last.confirmed and mode != "allgather":
            mark, clean = len(stats) if stats is not None else 0, False
            try:
                out, clean = _ring(q, k, v, last.kv_lens, rank, world, group, scale,
                                   mode == "overlap", stats,
                                   stale=_signature(q, k, v) != last.sig, spec=last.spec)
            finally:
                if stats is not None and not clean:
                    del stats[mark:]  # a dropped or failed attempt leaves no steps behind
            if clean:
                return out.to(q.dtype)
        kv_lens = _agree(q, k, v, group, mode)
    if world == 1 or mode == "allgather":
        if world == 1:
            t0 = time.perf_counter()
            out, _ = attention_with_lse(q, k, v, scale=scale)
            if stats is not None:
                _sync(q)
                stats.append({"step": 0, "rank": 0, "kv_block": 0, "q_tokens": q.shape[2],
                              "kv_tokens": k.shape[2], "compute_s": time.perf_counter() - t0,
                              "comm_s": 0.0, "bytes_sent": 0, "bytes_recv": 0})
            return out
        return _allgather(q, k, v, kv_lens, rank, world, group, scale, stats)
    out, _ = _ring(q, k, v, kv_lens, rank, world, group, scale, mode == "overlap", stats)
    return out.to(q.dtype)
