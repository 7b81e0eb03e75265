# Yours to edit. Generated from solutions/ex10_planning.py by tools/make_exercises.py
# stub-sha256: 73649a48c3c6d6ef (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 10, planning a real deployment: three pieces of the planner, by you.

    python -m pytest tests/graded --ex 10.1 --impl exercises

`cpcourse.planner.deployment.cost` prices a layout term by term and
`cpcourse.planner.plan.validity` says which layouts a model's own code accepts. Here you write the
compute one GPU does in one forward under a layout, the communication it waits for, HunyuanVideo's
rule for splitting a video, and (10.4) a prediction: how many GPUs a ring can take before its hops
show. Units: seconds, FLOPs, FLOP/s, GB/s (decimal: 1 GB = 1e9 bytes), pixels; every tensor sent is
bf16 (2 bytes an element). Check yours in the notebook with `cpcourse.check("10.1")`.
"""

from __future__ import annotations

import math

BF16 = 2  # bytes per element of what the engines send


def forward_compute_seconds(model, tok, layout, block_params: float, matmul_flops: float,
                            attention_flops: float) -> dict:
    """Seconds the busiest GPU spends in one forward's linear layers and in its attention:
    `{"linear": seconds, "attention": seconds}`.

    model: a `cpcourse.planner.tokens.ModelPreset` (`hidden`, `layers`, `text_joint`); tok: a
    `cpcourse.planner.tokens.TokenCount` (`sequence_length` N: the tokens self-attention runs over,
    the text included where it is joined; `text_tokens` N_text); layout: a
    `cpcourse.support.layout.Layout`; block_params: the parameters of the blocks one token meets
    (an MoE counts one expert); matmul_flops, attention_flops: the FLOP/s this GPU reaches in
    matmuls and in its attention kernel.

    On ONE GPU, batch 1, a forward costs
      linear     2 FLOPs per parameter per token: 2 N block_params. Except, in a model that
                 reads the text through cross-attention (not `text_joint`, N_text > 0), each
                 layer's K and V projections of that attention (2 hidden^2 parameters a layer,
                 K_x = 2 hidden^2 layers in all) multiply the N_text text tokens, not the
                 video: 2 N (block_params - K_x) + 2 N_text K_x.
      attention  per layer 4 N N hidden FLOPs (the scores and the weighted sum, every query
                 against every key), plus 4 N N_text hidden per layer for the cross-attention
                 where there is one.
    Under `layout` the sequence is split like `torch.tensor_split`, so the busiest GPU holds
    n = ceil(N / d) tokens for the right d. Which of cfg, ring, ulysses and tp divide which of
    these counts is the exercise. Seconds are FLOPs over the rate.
    """
    # Exercise 10.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 10.1 forward_compute_seconds: read notebook 10, \"What a layout "
        "divides\". Hint: ask of each dim what a GPU of it holds. Ring and Ulysses "
        "ranks hold different queries (Ulysses trades its token split for a head "
        "split: the same FLOPs), but every query still meets all N keys, so one N "
        "becomes n and the other stays. TP ranks hold the same tokens with 1/T of "
        "every weight and head. CFG-parallel puts a step's two forwards on two "
        "groups: one forward is unchanged. The text's K/V projections run on every CP "
        "rank (each needs the whole text), so CP does not divide them; TP does. (2 "
        "more: cpcourse.hint(\"10.1\"))"
    )


def comm_seconds(n: int, hidden: int, layers: int, layout, ulysses_gbps: float,
                 ring_gbps: float, attention_flops: float) -> dict:
    """Seconds of one forward that the busiest GPU spends waiting on its Ulysses and ring
    traffic: `{"ulysses": seconds, "ring_exposed": seconds}`.

    n: the tokens this GPU holds (its share of the sequence, as in exercise 10.1); hidden: the
    model's width (all heads together); layers: its self-attention layers; layout: a
    `cpcourse.support.layout.Layout`; ulysses_gbps, ring_gbps: effective GB/s, one direction, of
    the link the Ulysses group and the ring cross; attention_flops: the attention kernel's FLOP/s.
    Every tensor is bf16 (2 bytes an element); tp splits each tensor's channels T ways.
      ulysses  per layer four all-to-alls over the U ranks of a Ulysses group (q, k and v
               before the attention, its output after), each of the GPU's n x hidden / T
               tensor, turning a token split into a head split and back. The attention cannot
               start before the first three, nor the next layer before the last.
      ring     per layer every ring rank's K/V block visits this GPU, one block per hop, while
               it computes attention on the block it holds (4 FLOPs per query-key pair per
               channel). Under USP the ring runs on what Ulysses' all-to-all produced.
    How many bytes each collective takes out of this GPU, and which of them the GPU can spend
    computing, is the exercise: the test compares with `cpcourse.planner.deployment.cost`.
    """
    # Exercise 10.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 10.2 comm_seconds: read notebook 10, \"What a layout sends\". Hint: "
        "for each collective ask two questions. How much of the tensor must leave "
        "this GPU (in an all-to-all of U ranks, which part stays)? And what is the "
        "GPU doing while it travels: waiting, or computing something that does not "
        "need it? Under USP, what shape is a ring block after the all-to-all (tokens, "
        "channels)? (2 more: cpcourse.hint(\"10.2\"))"
    )


def hunyuan_accepts(height: int, width: int, layout) -> bool:
    """Whether the planner lets HunyuanVideo run `layout` for a `height` x `width` video: True
    or False, agreeing with `cpcourse.planner.plan.validity("hunyuanvideo-13b", tok, layout) is
    None`.

    height, width: pixels, multiples of 16 (its VAE shrinks each side 8 times, then 2 x 2
    patches: one token per 16 x 16 pixels); layout: a `cpcourse.support.layout.Layout` of at most
    64 GPUs (the sequence, 256 text tokens at least, always has more tokens than ranks).
    HunyuanVideo has 24 heads and is guidance-distilled: one forward per denoising step. A layout
    is refused when (1) it asks for a CFG pair; (2) Ulysses and TP together cannot split the heads
    evenly; (3) its sequence-parallel ranks (the ring and Ulysses ranks together) divide neither the
    rows of the latent token grid nor its columns: HunyuanVideo's own code (hyvideo/inference.py)
    splits the rows when it can, else the columns. (Its own code offers Ulysses and the ring
    only; the planner also allows TP, which an engine can add, under rules (2) and (3).)
    """
    # Exercise 10.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 10.3 hunyuan_accepts: read notebook 10, \"Which layouts HunyuanVideo "
        "runs\". Hint: three checks, each on a different part of the layout. A "
        "distilled model has no second forward for cfg to take. Ulysses and TP both "
        "hand each GPU a share of the heads. The split over the video is made by ring "
        "x ulysses ranks together (TP ranks hold the same tokens), and it cuts whole "
        "rows of tokens, or else whole columns. (2 more: cpcourse.hint(\"10.3\"))"
    )


def largest_hidden_ring(tokens: int, hidden: int, layers: int, attention_flops: float,
                        link_gbps: float, max_gpus: int = 64) -> int:
    """The most GPUs, from 1 to `max_gpus`, that the ring alone (`Layout(ring=R)`) can spread a
    model over with every hop hidden: nothing exposed, as `deployment.cost` and exercise 10.2
    price a hop against its block's attention.

    tokens: N, the sequence self-attention runs over (split like `torch.tensor_split`); hidden,
    layers: the model's width and self-attention layers; attention_flops: the attention kernel's
    FLOP/s; link_gbps: effective GB/s, one direction, of the link the ring crosses. Not every
    argument matters: which do is part of the exercise. A ring of 1 sends nothing, so the answer
    is at least 1.
    """
    # Exercise 10.4: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 10.4 largest_hidden_ring: read notebook 10, \"How far the ring "
        "hides\". Hint: a hop is hidden when sending one block takes no longer than "
        "attending to it. Write both for a block of n tokens (exercise 10.2's terms, "
        "notebook 05's threshold) and see what cancels: the condition is on n alone, "
        "against the GPU and the link. More GPUs means shorter blocks, so there is a "
        "largest R; remember how the busiest GPU's n is rounded. (2 more: "
        "cpcourse.hint(\"10.4\"))"
    )
