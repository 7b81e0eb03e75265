"""Self-attention of a frame shard over the whole video, with text tokens joined in, counted once.

    python -m cpcourse.cli models --arch hunyuanvideo --nproc 3 --method usp --compare

`cp_attention(q, k, v, cp, text=...)` is what the attention processors of `cpcourse.models` call.
Every rank holds its video shard q, k, v `[B, H, L_r, D]` and, for the models that join text into
self-attention (HunyuanVideo, CogVideoX), the WHOLE text q, k, v `[B, H, N, D]`: text is
replicated, it is not split. The softmax of every query must run over the L video keys plus the
N text keys exactly once. Appending the text keys on every rank would show them P times to each
query (the ring passes every rank's block to every rank): so only one rank of the ring appends
them. Text queries are appended on every rank, so each rank computes the text rows in full
(cheap: N is small) and needs no broadcast.

Methods, for a world of P = ulysses x ring ranks:
    "ring"      ring_attention over all P ranks (blocks passed rank to rank, overlapped)
    "allgather" every rank all-gathers K/V, then one local call (P x the K/V memory)
    "ulysses"   all-to-all to a head split (P must divide the heads), local attention, back
    "usp"       Ulysses inside groups of `ulysses` neighbouring ranks, the ring across groups
Text keys behind a padding mask (HunyuanVideo) are dropped before the call: a padded key has
weight 0 in the softmax, so dropping it is exact.
"""

from __future__ import annotations

import torch

from cpcourse.attention import attention_with_lse
from cpcourse.ring import ring_attention
from cpcourse.support.groups import all_gather_single, comm_device
from cpcourse.ulysses import heads_to_seq, seq_to_heads


def _with_text(x, t, keep: bool):
    return torch.cat([x, t], dim=2) if keep else x


def _heads_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's head group of a replicated `[B, H, N, D]` tensor (Ulysses' head order)."""
    hp = t.shape[1] // world
    return t[:, rank * hp:(rank + 1) * hp]


def _gather_heads(t: torch.Tensor, world: int, group) -> torch.Tensor:
    """Head groups `[B, H/u, N, D]` of the u ranks of `group` -> `[B, H, N, D]` on each."""
    if world == 1:
        return t
    buf = torch.empty(world * t.shape[0], *t.shape[1:], dtype=t.dtype, device=comm_device(group))
    all_gather_single(buf, t.contiguous().to(buf.device), group=group)
    b, hp, n, d = t.shape
    # [u * B, H/u, N, D] -> [u, B, H/u, N, D] -> [B, H, N, D] (head group j from rank j)
    return buf.view(world, b, hp, n, d).permute(1, 0, 2, 3, 4).reshape(b, world * hp, n, d).to(
        t.device)


def _ring_lens(lens: list[int], text) -> list[int]:
    """Every ring rank's K/V length, known from the split (the pre-hook agreed on it once per
    forward): the ring then skips its own shape agreement at every layer. The text keys (their
    unpadded part) ride on the last ring rank's block."""
    if text is not None:
        lens[-1] += text[1].shape[2]
    return lens


def _attend(q, k, v, cp, text):
    """One batch group: video shards plus (optional) text, through cp.method."""
    n_text = 0 if text is None else text[0].shape[2]
    if cp.method in ("ring", "allgather"):
        if text is not None:
            owner = cp.rank == cp.world - 1  # the one rank whose ring block carries the text K/V
            q = _with_text(q, text[0], True)  # [B, H, L_r + N, D]
            k, v = _with_text(k, text[1], owner), _with_text(v, text[2], owner)  # + N on owner
        out = ring_attention(q, k, v, group=cp.ring_group, mode=cp.ring_mode,
                             lens=_ring_lens(list(cp.lens), text))
        # [B, H, L_r, D] video rows, [B, H, N, D] text rows
        return (out, None) if text is None else (out[:, :, :-n_text], out[:, :, -n_text:])
    # ulysses / usp: a head split inside the Ulysses group, then the ring (if any) across groups
    u, u_rank = cp.ulysses, cp.u_rank
    if u > 1:
        # [3, B, H, L_r, D] -> [3, B, H/u, L_group, D]: the Ulysses group's tokens, my heads
        qh, kh, vh = seq_to_heads(torch.stack([q, k, v]), cp.u_lens, cp.u_group, "q, k, v")
    else:
        qh, kh, vh = q, k, v
    if text is not None:
        tq, tk, tv = (_heads_of(t, u_rank, u) for t in text)  # [B, H/u, N, D] each
        owner = cp.ring_rank == cp.ring - 1
        qh, kh, vh = _with_text(qh, tq, True), _with_text(kh, tk, owner), _with_text(vh, tv, owner)
    if cp.ring > 1:
        blocks = [sum(cp.lens[g * u:(g + 1) * u]) for g in range(cp.ring)]
        out = ring_attention(qh, kh, vh, group=cp.ring_group, mode=cp.ring_mode,
                             lens=_ring_lens(blocks, text))
    else:
        out, _ = attention_with_lse(qh, kh, vh)
        out = out.to(q.dtype)
    text_out = None
    if text is not None:
        # video [B, H/u, L_group, D]; text [B, H/u, N, D] -> [B, H, N, D]
        out, text_out = out[:, :, :-n_text], _gather_heads(out[:, :, -n_text:], u, cp.u_group)
    if u > 1:
        out = heads_to_seq(out.contiguous(), cp.u_lens, u_rank, cp.u_group)  # [B, H, L_r, D]
    return out, text_out


def cp_attention(q, k, v, cp, text=None, text_keep=None):
    """Attention of this rank's video queries (and the text's) over all video and text keys.

    q, k, v `[B, H, L_r, D]`: this rank's frame shard (tensor_split order over cp's ranks).
    text: None, or (tq, tk, tv), each `[B, H, N, D]`, the same on every rank. text_keep: None
    (all N text keys count) or a list of B ints, the leading text keys that are not padding.
    `cp` carries the method and groups (`cpcourse.models.parallel.CPState`).
    Returns out `[B, H, L_r, D]` and, when text is given, text_out `[B, H, N, D]`.
    """
    if text is not None and text[0].shape[2] == 0:  # no text tokens at all
        return _attend(q, k, v, cp, None)[0], text[0].new_empty(text[0].shape)
    if text is None or text_keep is None or len(set(text_keep)) == 1:
        if text is not None and text_keep is not None:
            n = text_keep[0]  # text keys and values: the n unpadded tokens, [B, H, n, D]
            text = (text[0], text[1][:, :, :n], text[2][:, :, :n])
        return _attend(q, k, v, cp, text)
    # Different pad lengths per sample: one call per sample (every rank loops alike).
    outs = [_attend(q[i:i + 1], k[i:i + 1], v[i:i + 1], cp,
                    (text[0][i:i + 1], text[1][i:i + 1, :, :n], text[2][i:i + 1, :, :n]))
            for i, n in enumerate(text_keep)]
    return torch.cat([o for o, _ in outs]), torch.cat([t for _, t in outs])
