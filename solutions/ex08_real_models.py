"""Exercises of notebook 08, CP on a real model: what you change inside diffusers' Wan.

    python -m pytest tests/graded --ex 08.1 --impl exercises

Three pieces of `cpcourse.models`, written by you: the rotary rows of a frame shard
(`cpcourse.models.rotary.wan_rope_shard`), Wan's self-attention with the softmax handed to a CP
function (`cpcourse.models.processors.WanCPProcessor`), the rule that lets replicated text
keys into a ring exactly once, two ways (`cpcourse.models.text_ring`), and a bug hunt in the
gather that hands `proj_out`'s tokens back whole (`cpcourse.support.groups.gather_uneven`).
Layouts: diffusers keeps q/k/v as `[B, L, H, D]` inside its processors; cpcourse's attention
functions take `[B, H, L, D]`.
Check yours in the notebook with `cpcourse.check("08.1")`.
"""

from __future__ import annotations

import torch


def wan_rope_shard(rope, f0: int, nf: int, pph: int, ppw: int):
    """Wan's rotary (cos, sin), each `[1, nf * pph * ppw, 1, D]`, for latent frames f0 .. f0+nf-1.

    `rope` is a `WanRotaryPosEmbed`: `rope.freqs_cos` and `rope.freqs_sin` are `[max_seq_len, D]`
    tables whose channels are three parts side by side, widths `rope.t_dim`, `rope.h_dim`,
    `rope.w_dim` (frame, row, column); row i of a part is position i on that axis. Token order is
    (frame, row, column). Must equal rows f0 * pph * ppw .. of the whole video's table
    (`rope(latents)`), without building that table.
    """
    # BEGIN SOLUTION 08.1 | notebook 08, "The rotary table of a shard"
    # | hint: a token's channels are [frame part | row part | column part] (the docstring). Which
    # | of the three parts changes when another rank holds the token, and which frame number
    # | should that part use on a rank whose first frame is f0? Section 3's table shows what the
    # | module gives a shard alone.
    # | hint2: frames 5 on 2 ranks: rank 1 holds frames 3 and 4, so f0 = 3 and its first token is
    # | row 3 * pph * ppw of the whole table. With pph = ppw = 4, token j of the shard is frame
    # | 3 + j // 16, row (j // 4) % 4, column j % 4. The notebook's bug cell shows the error when
    # | the frame part starts at 0.
    # | hint3: t, h, w = table.split([rope.t_dim, rope.h_dim, rope.w_dim], dim=1); grid =
    # | torch.cat([t[f0:f0 + nf].view(nf, 1, 1, -1).expand(nf, pph, ppw, -1), h[:pph].view(1, pph,
    # | 1, -1).expand(nf, pph, ppw, -1), w[:ppw].view(1, 1, ppw, -1).expand(nf, pph, ppw, -1)],
    # | dim=-1).reshape(1, nf * pph * ppw, 1, -1), for each of freqs_cos and freqs_sin.
    out = []
    for table in (rope.freqs_cos, rope.freqs_sin):
        t, h, w = table.split([rope.t_dim, rope.h_dim, rope.w_dim], dim=1)
        grid = torch.cat([t[f0:f0 + nf].view(nf, 1, 1, -1).expand(nf, pph, ppw, -1),
                          h[:pph].view(1, pph, 1, -1).expand(nf, pph, ppw, -1),
                          w[:ppw].view(1, 1, ppw, -1).expand(nf, pph, ppw, -1)], dim=-1)
        out.append(grid.reshape(1, nf * pph * ppw, 1, -1))
    return out[0], out[1]
    # END SOLUTION


def wan_cp_self_attention(attn, hidden_states, rotary_emb, attend):
    """Wan's video self-attention (a block's `attn1`) with the softmax done by `attend`.

    attn: the block's `WanAttention` (`to_q`, `to_k`, `to_v`, `norm_q`, `norm_k`, `heads`,
    `to_out`); hidden_states `[B, L_r, C]` (this rank's tokens); rotary_emb: the shard's
    (cos, sin), each `[1, L_r, 1, D]` with every angle stored twice (channels 2i and 2i+1).
    attend(q, k, v) takes and returns `[B, H, L_r, D]` (a ring or Ulysses in a real run).
    Returns `[B, L_r, C]`, equal to what diffusers' own processor gives for these tokens when
    the softmax sees the whole video's keys.

    The spec is diffusers' code: `WanAttnProcessor.__call__` in
    `diffusers/models/transformers/transformer_wan.py` (print it with `inspect.getsource`), the
    self-attention path (no `encoder_hidden_states`, no image branch). Which of its steps need
    other ranks' tokens and which can run on this rank's alone is for you to decide; the
    graded test runs yours inside the real model under CP and compares with one process.
    """
    # BEGIN SOLUTION 08.2 | notebook 08, "The attention processor"
    # | hint: read WanAttnProcessor.__call__ step by step and ask of each: does this output
    # | token depend on any token but itself? (A norm across a token's heads does not; a softmax
    # | over keys does.) What layout does `attend` want, and where is the heads axis?
    # | hint2: everything but the softmax works token by token, so it runs on the shard as Wan
    # | runs it on the whole video: project, RMS-norm q and k, split heads, rotate (pairs 2i,
    # | 2i+1: c = cos[..., 2i], s = sin[..., 2i+1]), attend, merge heads, to_out[0], to_out[1].
    # | hidden_states [1, 40, 96] with 12 heads: q after to_q and norm_q is [1, 40, 96];
    # | unflatten(2, (12, -1)) gives [1, 40, 12, 8]; attend wants [1, 12, 40, 8] (transpose(1, 2))
    # | and returns the same; transpose back, flatten(2, 3) to [1, 40, 96], then to_out.
    # | hint3: x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1); c, s = cos[..., 0::2], sin[..., 1::2];
    # | out = torch.empty_like(x); out[..., 0::2] = x1 * c - x2 * s; out[..., 1::2] = x1 * s + x2
    # | * c; then o = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).
    def rotate(x, cos, sin):
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        c, s = cos[..., 0::2], sin[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x1 * s + x2 * c
        return out.type_as(x)

    q = attn.norm_q(attn.to_q(hidden_states))
    k = attn.norm_k(attn.to_k(hidden_states))
    v = attn.to_v(hidden_states)
    q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))
    q, k = rotate(q, *rotary_emb), rotate(k, *rotary_emb)
    o = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    o = o.transpose(1, 2).flatten(2, 3).type_as(q)
    return attn.to_out[1](attn.to_out[0](o))
    # END SOLUTION


def text_ring_step(held_k, held_v, text_k, text_v, rank: int, step: int, world: int,
                   strategy: str):
    """One ring step of joined-text attention on one rank: what its queries attend to, and what
    it passes to rank + 1.

    held_k, held_v `[B, H, L_b, D]`: the block this rank holds at `step` (step 0: its own video
    keys and values; later: what rank - 1 passed it at the step before); text_k, text_v
    `[B, H, N, D]`: the whole text's, the same on every rank. Over the `world` steps every
    query must meet every video key once and every text key ONCE, with the text placed by
    `strategy`:
        "course"  the text keys ride in the last rank's block (rank world - 1), around the ring
        "rear"    xDiT's joint_strategy="rear": the text keys travel nowhere; each rank uses its
                  own copy, at the last ring step
    Returns ((attend_k, attend_v), (send_k, send_v)): the keys and values this rank's queries
    attend to now, and the block it passes on (ignored after the last step).
    """
    # BEGIN SOLUTION 08.3 | notebook 08, "Joined text, counted once"
    # | hint: for each strategy, at which (rank, step) does a text key first enter a block, and
    # | once it is in, which later steps see it again? Which blocks, then, must carry it when
    # | they are passed on? (Section 6, and the figure of who holds which block when.)
    # | hint2: world 3, N = 7 text keys. "course": rank 2 at step 0 attends to its video keys
    # | and the 7 text keys and passes all of them on, so ranks 0 and 1 meet the text at steps 1
    # | and 2. "rear": every rank meets the text at step 2 only, and no passed block holds it.
    # | hint3: course: if step == 0 and rank == world - 1, cat the text onto held_k/held_v, then
    # | attend to and send that; rear: send held_k/held_v, attend to them with the text catted
    # | on only when step == world - 1.
    with_text = (torch.cat([held_k, text_k], dim=2), torch.cat([held_v, text_v], dim=2))
    if strategy == "rear":
        return (with_text if step == world - 1 else (held_k, held_v)), (held_k, held_v)
    block = with_text if step == 0 and rank == world - 1 else (held_k, held_v)
    return block, block
    # END SOLUTION


def unpad_gathered_buggy(gathered: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The tokens of every rank after the `proj_out` all-gather, as a colleague wrote it (do not
    copy it). Its author tested it on 2 ranks with every number of frames from 2 to 9, even and
    uneven splits: exact. On 3 ranks it is not always. Find why.

    gathered `[B, P * max(sizes), C]`: what the all-gather returned, each rank's `[B, L_r, C]`
    shard zero-padded to the longest first (gloo cannot all-gather unequal sizes); sizes: the
    ranks' token counts.
    """
    return gathered[:, :sum(sizes)]  # the padding is zeros: drop it


def unpad_gathered(gathered: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """`unpad_gathered_buggy`, fixed: the whole video's tokens `[B, sum(sizes), C]`, in the order
    one process holds them, from the padded all-gather `[B, P * max(sizes), C]` (same inputs).
    Must be exact for any sizes, equal or not.
    """
    # BEGIN SOLUTION 08.4 | notebook 08, "Bug hunt: the gathered tokens"
    # | hint: picture the buffer the all-gather fills: every rank contributes a block of the same
    # | length, one after the other in rank order, and the zeros of a short rank sit at the end of
    # | ITS block. Where are they when only the last rank is short, and where when the first
    # | ranks hold more?
    # | hint2: 5 frames of 16 tokens on 2 ranks: sizes [48, 32], blocks of 48. The buffer holds
    # | rank 0's 48 tokens, then rank 1's 32 and 16 zeros. Keeping the first 80 is right here,
    # | but 7 frames on 3 ranks ([3, 2, 2] frames) puts 16 zeros after rank 1's tokens, in the
    # | middle, and the last frame is cut off: frames 0, 1, 2, 3, 4, pad, 5.
    # | hint3: most = max(sizes); blocks = gathered.unflatten(1, (len(sizes), most)); return
    # | torch.cat([blocks[:, r, :n] for r, n in enumerate(sizes)], dim=1).
    most = max(sizes)
    blocks = gathered.unflatten(1, (len(sizes), most))  # [B, P, max(sizes), C]
    return torch.cat([blocks[:, r, :n] for r, n in enumerate(sizes)], dim=1)
    # END SOLUTION
