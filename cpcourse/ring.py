"""Ring attention over torch.distributed: local shards in, local output out.

    python -m cpcourse.cli demo --nproc 4           # runs it on 4 local processes and checks it

Each rank holds a contiguous shard of the sequence, q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`
(split like `torch.tensor_split`, so shard lengths may differ by one and some ranks may hold no
tokens at all). At ring step s, rank r holds the K/V block of rank (r - s) mod P: it attends its
queries to that block (`attention_with_lse`), folds the partial result into its running output
(`merge_attention`'s formula, done in place by `fold_into`), and passes the block on to rank r + 1
while receiving the next one from rank r - 1. After P steps every query has seen every key; the
output never leaves its rank.

Modes (all give the same result up to rounding):
    "overlap"   the next K/V block is in flight (isend/irecv) while the current one is computed,
                with two receive buffers used in turn; on GPU NCCL moves it on its own stream
    "blocking"  compute, then exchange: the communication time adds up in full
    "allgather" all-gather every K/V shard up front (padded to the longest shard), then one
                attention call over the whole sequence: Llama 3's choice, P x the K/V memory
Before any transfer the ranks agree on their shapes and dtypes (`cpcourse.support.agreement`), so
inputs that disagree raise the same InputError on every rank instead of hanging. While shapes stay
the same from call to call, the ring skips that all-gather and flags changes in its own messages
instead. `RingComm` holds one rank's side of the ring (peers, buffers, the exchange in flight), so
that `_ring` is the lesson's loop and nothing else; per-step records come from
`cpcourse.support.recorder`, a no-op unless `stats` is passed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.attention import accumulator_dtype, attention_with_lse
from cpcourse.attention_backward import attention_backward_from_lse, row_delta
from cpcourse.support.agreement import Agreement, agree_kv_lens, remembered
from cpcourse.support.errors import require
from cpcourse.support.groups import (
    all_gather_single,
    global_rank,
    require_group,
    tracked,
)
from cpcourse.support.qkv import attention_scale
from cpcourse.support.recorder import NO_RECORDER, NoRecorder, recorder

MODES = ("overlap", "blocking", "allgather")


def fold_into(out: torch.Tensor, lse: torch.Tensor, o: torch.Tensor, l_: torch.Tensor) -> None:
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


def _attend(q, kv, scale, out, lse):
    """One ring step's compute: q over the K/V block `kv` `[2, B, H, L, D]`, folded into (out, lse).

    The block's own output is dropped on return, so a rank never holds two of them."""
    o, l_ = attention_with_lse(q, kv[0], kv[1], scale=scale)
    if out is None:
        return o.to(accumulator_dtype(o.dtype)), l_
    fold_into(out, lse, o, l_)
    return out, lse


class RingComm:
    """One rank's side of the ring: its peers, two K/V buffers used in turn, the hop in flight.

    K and V travel packed `[2, B, H, L, D]` so each hop is one message. Step s receives into
    buffer s % 2 while it computes on the other; the local block starts in buffer 1 and its send
    completes before step 1 reuses it, so a rank holds two K/V blocks, never P of them.
    `spec` is every block's (B, H, D, dtype). With `flagged`, each message carries one more
    element: its owner's "my shapes changed" flag (`cpcourse.support.agreement`); every block
    passes every rank, so after the last hop every rank has seen every flag.
    """

    def __init__(self, group, rank: int, world: int, kv_lens: list[int], spec: tuple,
                 device, flagged: bool = False, parts: int = 2):
        self.group, self.rank, self.world, self.kv_lens = group, rank, world, kv_lens
        # the backward's blocks are [K, V, dK, dV] (parts=4) and take one more hop: home
        self.hops = world - 1 if parts == 2 else world
        self.dst = global_rank(group, (rank + 1) % world)
        self.src = global_rank(group, (rank - 1) % world)
        b, h, d, dtype = spec
        self.row, self.flagged = parts * b * h * d, int(flagged)  # per token; flag slot
        self.shape = (parts, b, h, -1, d)
        size = self.row * max(kv_lens) + self.flagged
        self.bufs = [torch.empty(size, dtype=dtype, device=device) for _ in range(2)]
        self.reqs, self.seen = [], None

    def _view(self, buf: torch.Tensor, n: int):  # (K/V block, its message, its flag slot)
        m = self.row * n
        return buf[:m].view(self.shape), buf[:m + self.flagged], buf[m:m + self.flagged]

    def load(self, k: torch.Tensor, v: torch.Tensor, stale: bool = False) -> torch.Tensor:
        """Pack this rank's own K/V as the first block; a stale rank sends zeros, flagged."""
        kv, self.msg, flag = self._view(self.bufs[1], self.kv_lens[self.rank])
        if stale:  # its K/V may not even fit the agreed shape
            kv.zero_()
        else:
            kv[0].copy_(k)
            kv[1].copy_(v)
        if self.flagged:
            flag.fill_(float(stale))
            self.seen = flag.to(torch.float32, copy=True)  # a copy: the buffer is reused
        return kv

    def next_block(self, step: int) -> torch.Tensor | None:
        """The buffer for the block step + 1 computes on (rank - step - 1's); None at the end."""
        if step >= self.hops:
            return None
        n = self.kv_lens[(self.rank - step - 1) % self.world]
        self.nxt, self.nmsg, self.nflag = self._view(self.bufs[step % 2], n)
        return self.nxt

    def exchange(self, step: int) -> None:
        """Start sending the current block to rank + 1 and receiving the next from rank - 1.
        Empty blocks are skipped on both sides (both know every shard length)."""
        ops = [dist.P2POp(op, t, peer, self.group) for op, t, peer in (
            (dist.isend, self.msg, self.dst), (dist.irecv, self.nmsg, self.src)) if t.numel()]
        if ops:
            with tracked("batch_isend_irecv", group=self.group, ring_step=step,
                         send_to=self.dst, recv_from=self.src):
                self.reqs = dist.batch_isend_irecv(ops)

    def wait(self, step: int) -> None:
        if self.reqs:
            with tracked("wait for K/V block", ring_step=step, send_to=self.dst,
                         recv_from=self.src):
                for req in self.reqs:
                    req.wait()
        self.reqs = []

    def advance(self) -> torch.Tensor:
        """The received block becomes the current one (its flag read before it is reused)."""
        if self.flagged:
            self.seen += self.nflag.float()
        self.msg = self.nmsg
        return self.nxt

    def flag_raised(self) -> bool:
        return bool(self.seen.item()) if self.flagged else False


def _ring(q, k, v, comm: RingComm, scale, overlap: bool, rec: NoRecorder = NO_RECORDER,
          stale: bool = False) -> tuple:
    """Notebook 04's loop: P steps of attend, fold, pass. Returns (out `[B, H, Lq_r, D]`,
    float32 for half inputs, lse `[B, H, Lq_r]`). With `overlap`, the next block is in flight
    while this one is computed; else compute, then exchange. A `stale` rank (see RingComm) only
    passes blocks on."""
    kv, out, lse = comm.load(k, v, stale), None, None
    for step in range(comm.world):
        rec.start()
        nxt = comm.next_block(step)
        if overlap and nxt is not None:
            comm.exchange(step)
        rec.comm_done()
        if not stale:
            out, lse = _attend(q, kv, scale, out, lse)
        rec.compute_done(kv)
        if not overlap and nxt is not None:
            comm.exchange(step)
        comm.wait(step)
        if not stale:  # a stale rank's q may not even be 4-d
            sent = kv.numel() * kv.element_size() if nxt is not None else 0
            rec.step(kv, step=step, kv_block=(comm.rank - step) % comm.world,
                     q_tokens=q.shape[2], kv_tokens=kv.shape[3], bytes_sent=sent,
                     bytes_recv=nxt.numel() * nxt.element_size() if nxt is not None else 0)
        if nxt is not None:
            kv = comm.advance()
    return out, lse


def _ring_remembered(last: Agreement, q, k, v, group, rank, world, scale, overlap, stats):
    """The ring on the group's remembered agreement, flags in every message. Returns (out, lse),
    or None when any rank's flag was up (the caller agrees again and reruns)."""
    stale, mark, clean = last.changed(q, k, v), len(stats) if stats is not None else 0, False
    comm = RingComm(group, rank, world, last.kv_lens, last.spec, k.device, flagged=True)
    try:
        out, lse = _ring(q, k, v, comm, scale, overlap, recorder(stats, rank), stale)
        clean = not stale and not comm.flag_raised()
    finally:
        if stats is not None and not clean:
            del stats[mark:]  # a dropped or failed attempt leaves no steps behind
    return (out.to(q.dtype), lse) if clean else None


def _gather_kv(k, v, kv_lens, world, group):
    """The whole K/V `[2, B, H, L, D]` on every rank, by one all-gather padded to the longest
    shard (gloo cannot gather uneven sizes); and the bytes this rank sent."""
    b, h, _, d = k.shape
    padded = k.new_zeros(2, b, h, max(kv_lens), d)
    padded[0, :, :, : k.shape[2]] = k
    padded[1, :, :, : v.shape[2]] = v
    gathered = k.new_empty(world, *padded.shape)
    with tracked("all_gather (K/V)", group=group):
        all_gather_single(gathered, padded, group=group)
    full = torch.cat([gathered[r, :, :, :, : kv_lens[r]] for r in range(world)], dim=3)
    return full, (world - 1) * padded.numel() * padded.element_size()


def _allgather(q, k, v, kv_lens, rank, world, group, scale, rec):
    """All-gather K/V, then one attention call over the whole sequence: (out, lse)."""
    rec.start()
    full, moved = _gather_kv(k, v, kv_lens, world, group)
    rec.comm_done(q)
    out, lse = attention_with_lse(q, full[0], full[1], scale=scale)
    rec.compute_done(q)
    rec.step(q, step=0, kv_block=-1, q_tokens=q.shape[2], kv_tokens=full.shape[3],
             bytes_sent=moved, bytes_recv=moved)
    return out, lse


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

    Differentiable: when q, k or v requires grad (and grad mode is on), the call is a
    `RingAttention` autograd Function whose backward gives each rank the gradients of its own
    shards, equal to one process's autograd; every rank must then run the backward (a training
    step does), in every mode.
    """
    rank, world = require_group(group, "ring_attention")
    require(mode in MODES, f"mode must be one of {MODES}, got {mode!r}")
    require(all(isinstance(t, torch.Tensor) for t in (q, k, v)),
            f"q, k, v must be tensors [B, H, L, D], got "
            f"{[type(t).__name__ for t in (q, k, v)]}")
    if scale is not None:  # before any transfer: a rank must not fail alone mid-ring
        scale = attention_scale(q, scale)
    call = (group, rank, world, scale, mode, stats, lens)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return RingAttention.apply(q, k, v, call)
    return _forward(q, k, v, *call)[0]


def _forward(q, k, v, group, rank, world, scale, mode, stats, lens):
    """The forward of every mode: (out `[B, H, Lq_r, D]` in q's dtype, lse `[B, H, Lq_r]`,
    every rank's K/V shard length)."""
    last = remembered(group) if lens is None and world > 1 and mode != "allgather" else None
    if last is not None:
        res = _ring_remembered(last, q, k, v, group, rank, world, scale, mode == "overlap", stats)
        if res is not None:
            return (*res, last.kv_lens)
    kv_lens = agree_kv_lens(q, k, v, group, rank, world, lens)
    rec = recorder(stats, rank)
    if world == 1:
        rec.start()
        out, lse = attention_with_lse(q, k, v, scale=scale)
        rec.compute_done(q)
        rec.step(q, step=0, kv_block=0, q_tokens=q.shape[2], kv_tokens=k.shape[2],
                 bytes_sent=0, bytes_recv=0, comm_s=0.0)
        return out, lse, kv_lens
    if mode == "allgather":
        return (*_allgather(q, k, v, kv_lens, rank, world, group, scale, rec), kv_lens)
    comm = RingComm(group, rank, world, kv_lens, (*k.shape[:2], k.shape[3], k.dtype), k.device)
    out, lse = _ring(q, k, v, comm, scale, mode == "overlap", rec)
    return out.to(q.dtype), lse, kv_lens


class RingAttention(torch.autograd.Function):
    """`ring_attention` with a backward. The forward saves q, k, v (this rank's shards, alive
    anyway), out and lse `[B, H, Lq_r]`: O(L/P) per rank, never a score matrix. The backward
    recomputes each block's probabilities from that lse (`cpcourse.attention_backward`)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        out, lse, kv_lens = _forward(q, k, v, *call)
        # dense copies of views: a view of a fused qkv projection would keep all three alive
        ctx.save_for_backward(q.contiguous(), k.contiguous(), v.contiguous(), out, lse)
        ctx.call, ctx.kv_lens = call, kv_lens
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, rank, world, scale, mode = ctx.call[:5]
        # every rank runs the same transfers whatever its own inputs need: no rank waits alone
        if world == 1:
            delta = row_delta(out, dout)
            grads = attention_backward_from_lse(q, k, v, dout, lse, delta, scale)
        elif mode == "allgather":
            grads = _allgather_backward(q, k, v, out, lse, dout, ctx.kv_lens, rank, group, scale)
        else:
            grads = _ring_backward(q, k, v, out, lse, dout, ctx.kv_lens, rank, group, scale)
        return (*(g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)), None)


def _ring_backward(q, k, v, out, lse, dout, kv_lens, rank, group, scale):
    """The ring's backward: P steps of recompute-and-accumulate, P hops.

    dQ of this rank's queries is a sum over every K/V block: it stays here, like the forward's
    out. dK and dV of a block are sums over every rank's QUERIES, which never move, so the
    block's gradient accumulators travel with it: each block goes round as `[K, V, dK, dV]`
    (packed, one message, in the accumulator dtype), gains one rank's share at each step, and
    takes one more hop than the forward (P, not P - 1) to come home with its sums complete.
    Cost against the forward: twice the elements per hop (float32 for half inputs: 4x the
    bytes of bf16 K/V), one more hop, and two such buffers per rank. Compute comes before
    each hop: a block cannot leave before this rank has added its share.
    """
    world = len(kv_lens)
    acc = accumulator_dtype(q.dtype)
    comm = RingComm(group, rank, world, kv_lens, (*k.shape[:2], k.shape[3], acc), k.device,
                    parts=4)
    blk = comm.load(k, v)
    blk[2:].zero_()
    delta = row_delta(out, dout)  # rowsum(dO o O): once, for every block
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    for step in range(world):
        part, dk, dv = attention_backward_from_lse(q, blk[0], blk[1], dout, lse, delta, scale)
        dq += part
        blk[2] += dk
        blk[3] += dv
        comm.next_block(step)
        comm.exchange(step)
        comm.wait(step)
        blk = comm.advance()
    return dq, blk[2], blk[3]  # after P hops the block is this rank's own again


def _allgather_backward(q, k, v, out, lse, dout, kv_lens, rank, group, scale):
    """All-gather K/V again (kept nowhere between the passes: memory over bytes), the whole
    backward here, then every rank's dK/dV contributions summed (one all-reduce of the padded
    `[P, 2, B, H, max L_r, D]`, which gloo takes where it has no reduce-scatter) and this rank's
    slice kept."""
    world = len(kv_lens)
    full, _ = _gather_kv(k, v, kv_lens, world, group)
    dq, dk, dv = attention_backward_from_lse(q, full[0], full[1], dout, lse,
                                             row_delta(out, dout), scale)
    b, h, _, d = k.shape
    padded = dk.new_zeros(world, 2, b, h, max(kv_lens), d)
    for r, (a, n) in enumerate(zip(torch.tensor(kv_lens).cumsum(0).tolist(), kv_lens,
                                   strict=True)):
        padded[r, 0, :, :, :n] = dk[:, :, a - n:a]
        padded[r, 1, :, :, :n] = dv[:, :, a - n:a]
    with tracked("all_reduce (dK/dV)", group=group):
        dist.all_reduce(padded, group=group)
    return dq, padded[rank, 0, :, :, : kv_lens[rank]], padded[rank, 1, :, :, : kv_lens[rank]]
