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
instead. `RingComm` (`cpcourse.ring.comm`) holds one rank's side of the ring (peers, buffers,
the exchange in flight), so that `_ring` is the lesson's loop and nothing else; the backward is
`cpcourse.ring.backward`; per-step records come from `cpcourse.ring.recorder`, a no-op unless
`stats` is passed.
"""

from __future__ import annotations

import torch

from cpcourse.attention import accumulator_dtype, attention_with_lse
from cpcourse.attention.backward import attention_backward_from_lse, row_delta
from cpcourse.ring.backward import allgather_backward, ring_backward
from cpcourse.ring.comm import RingCall, RingComm, gather_kv
from cpcourse.ring.recorder import NO_RECORDER, NoRecorder, recorder
from cpcourse.support.agreement import Agreement, agree_kv_lens, remembered
from cpcourse.support.errors import require
from cpcourse.support.groups import require_group
from cpcourse.support.qkv import attention_scale

MODES = ("overlap", "blocking", "allgather")
__all__ = ["MODES", "RingAttention", "RingCall", "RingComm", "fold_into", "ring_attention"]


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
    o, l_ = attention_with_lse(q, kv[0], kv[1], scale=scale)  # [B, H, Lq_r, D], [B, H, Lq_r]
    if out is None:
        return o.to(accumulator_dtype(o.dtype)), l_
    fold_into(out, lse, o, l_)
    return out, lse


def _ring(q, k, v, comm: RingComm, scale, overlap: bool, rec: NoRecorder = NO_RECORDER,
          stale: bool = False) -> tuple:
    """Notebook 04's loop: P steps of attend, fold, pass. Returns (out `[B, H, Lq_r, D]`,
    float32 for half inputs, lse `[B, H, Lq_r]`). With `overlap`, the next block is in flight
    while this one is computed; else compute, then exchange. A `stale` rank (see RingComm) only
    passes blocks on."""
    kv, out, lse = comm.load(k, v, stale), None, None  # kv [2, B, H, Lk_r, D]
    for step in range(comm.world):
        rec.start()
        nxt = comm.next_block(step)  # [2, B, H, Lk_(rank-step-1), D], or None at the end
        if overlap and nxt is not None:
            comm.exchange(step)
        rec.comm_done()
        if not stale:
            out, lse = _attend(q, kv, scale, out, lse)  # [B, H, Lq_r, D], [B, H, Lq_r]
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


def _ring_remembered(last: Agreement, q, k, v, call: RingCall):
    """The ring on the group's remembered agreement, flags in every message. Returns (out, lse),
    or None when any rank's flag was up (the caller agrees again and reruns)."""
    stats = call.stats
    stale, mark, clean = last.changed(q, k, v), len(stats) if stats is not None else 0, False
    comm = RingComm(call.group, call.rank, call.world, last.kv_lens, last.spec, k.device,
                    flagged=True)
    try:
        out, lse = _ring(q, k, v, comm, call.scale, call.mode == "overlap",
                         recorder(stats, call.rank), stale)
        clean = not stale and not comm.flag_raised()
    finally:
        if stats is not None and not clean:
            del stats[mark:]  # a dropped or failed attempt leaves no steps behind
    return (out.to(q.dtype), lse) if clean else None


def _allgather(q, k, v, kv_lens, call: RingCall, rec):
    """All-gather K/V, then one attention call over the whole sequence: (out, lse)."""
    rec.start()
    full, moved = gather_kv(k, v, kv_lens, call.group)  # [2, B, H, L, D]
    rec.comm_done(q)
    out, lse = attention_with_lse(q, full[0], full[1], scale=call.scale)  # [B, H, Lq_r, D]
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
    call = RingCall(group, rank, world, scale, mode, stats, lens)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return RingAttention.apply(q, k, v, call)
    return _forward(q, k, v, call)[0]


def _forward(q, k, v, call: RingCall):
    """The forward of every mode: (out `[B, H, Lq_r, D]` in q's dtype, lse `[B, H, Lq_r]`,
    every rank's K/V shard length)."""
    world, mode = call.world, call.mode
    last = (remembered(call.group) if call.lens is None and world > 1 and mode != "allgather"
            else None)
    if last is not None:
        res = _ring_remembered(last, q, k, v, call)
        if res is not None:
            return (*res, last.kv_lens)
    kv_lens = agree_kv_lens(q, k, v, call.group, call.rank, world, call.lens)
    rec = recorder(call.stats, call.rank)
    if world == 1:
        rec.start()
        out, lse = attention_with_lse(q, k, v, scale=call.scale)
        rec.compute_done(q)
        rec.step(q, step=0, kv_block=0, q_tokens=q.shape[2], kv_tokens=k.shape[2],
                 bytes_sent=0, bytes_recv=0, comm_s=0.0)
        return out, lse, kv_lens
    if mode == "allgather":
        return (*_allgather(q, k, v, kv_lens, call, rec), kv_lens)
    comm = RingComm(call.group, call.rank, world, kv_lens, (*k.shape[:2], k.shape[3], k.dtype),
                    k.device)
    out, lse = _ring(q, k, v, comm, call.scale, mode == "overlap", rec)  # [B, H, Lq_r, D]
    return out.to(q.dtype), lse, kv_lens


class RingAttention(torch.autograd.Function):
    """`ring_attention` with a backward. The forward saves q, k, v (this rank's shards, alive
    anyway), out and lse `[B, H, Lq_r]`: O(L/P) per rank, never a score matrix. The backward
    recomputes each block's probabilities from that lse (`cpcourse.attention.backward`)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        out, lse, kv_lens = _forward(q, k, v, call)
        # dense copies of views: a view of a fused qkv projection would keep all three alive
        ctx.save_for_backward(q.contiguous(), k.contiguous(), v.contiguous(), out, lse)
        ctx.call, ctx.kv_lens = call, kv_lens
        return out

    @staticmethod
    def backward(ctx, dout):
        saved, call = ctx.saved_tensors, ctx.call
        q, k, v, out, lse = saved
        # every rank runs the same transfers whatever its own inputs need: no rank waits alone
        if call.world == 1:
            delta = row_delta(out, dout)  # [B, H, Lq_r]
            grads = attention_backward_from_lse(q, k, v, dout, lse, delta, call.scale)
        elif call.mode == "allgather":
            grads = allgather_backward(saved, dout, ctx.kv_lens, call)
        else:
            grads = ring_backward(saved, dout, ctx.kv_lens, call)
        return (*(g.to(t.dtype) for g, t in zip(grads, (q, k, v), strict=True)), None)
