# Yours to edit. Generated from solutions/ex08_real_models.py by tools/make_exercises.py
# stub-sha256: 89d0fcf34ffcc149 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 08.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 08.1 wan_rope_shard: read notebook 08, \"The rotary table of a "
        "shard\". Hint: a token's channels are [frame part row part column part] (the "
        "docstring). Which of the three parts changes when another rank holds the "
        "token, and which frame number should that part use on a rank whose first "
        "frame is f0? Section 3's table shows what the module gives a shard alone. (2 "
        "more: cpcourse.hint(\"08.1\"))"
    )


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
    # Exercise 08.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 08.2 wan_cp_self_attention: read notebook 08, \"The attention "
        "processor\". Hint: read WanAttnProcessor.__call__ step by step and ask of "
        "each: does this output token depend on any token but itself? (A norm across "
        "a token's heads does not; a softmax over keys does.) What layout does "
        "`attend` want, and where is the heads axis? (2 more: cpcourse.hint(\"08.2\"))"
    )


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
    # Exercise 08.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 08.3 text_ring_step: read notebook 08, \"Joined text, counted once\". "
        "Hint: for each strategy, at which (rank, step) does a text key first enter a "
        "block, and once it is in, which later steps see it again? Which blocks, "
        "then, must carry it when they are passed on? (Section 6, and the figure of "
        "who holds which block when.) (2 more: cpcourse.hint(\"08.3\"))"
    )


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
    # Exercise 08.4: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 08.4 unpad_gathered: read notebook 08, \"Bug hunt: the gathered "
        "tokens\". Hint: picture the buffer the all-gather fills: every rank "
        "contributes a block of the same length, one after the other in rank order, "
        "and the zeros of a short rank sit at the end of ITS block. Where are they "
        "when only the last rank is short, and where when the first ranks hold more? "
        "(2 more: cpcourse.hint(\"08.4\"))"
    )
