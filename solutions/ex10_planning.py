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
    # BEGIN SOLUTION 10.1 | notebook 10, "What a layout divides"
    # | hint: ask of each dim what a GPU of it holds. Ring and Ulysses ranks hold different
    # | queries (Ulysses trades its token split for a head split: the same FLOPs), but every
    # | query still meets all N keys, so one N becomes n and the other stays. TP ranks hold the
    # | same tokens with 1/T of every weight and head. CFG-parallel puts a step's two forwards
    # | on two groups: one forward is unchanged. The text's K/V projections run on every CP rank
    # | (each needs the whole text), so CP does not divide them; TP does.
    # | hint2: HunyuanVideo 720p, 129 frames on 8 H100s as ring 2 x ulysses 4: N = 119,056 (the
    # | text is joined), n = ceil(119,056 / 8) = 14,882. Attention 60 x 4 x 14,882 x 119,056 x
    # | 3,072 = 1.306e15 FLOPs at 0.35 x 989e12 FLOP/s = 3.77 s; linear 2 x 14,882 x 6.79e9
    # | (the weights a video token meets) = 2.02e14 FLOPs at 0.78 x 989e12 = 0.262 s. As tp 2 x
    # | ulysses 4 instead: n = 29,764 and both divided by T = 2, the same seconds.
    # | hint3: n = math.ceil(N / (layout.ring * layout.ulysses)); t = layout.tp; linear = (2 * n
    # | * (block_params - k_x) + 2 * n_text * k_x) / t / matmul_flops with k_x = 0 without
    # | cross-attention; attention = layers * 4 * n * (N + n_text if cross else N) * hidden / t
    # | / attention_flops.
    n_seq, n_text = tok.sequence_length, tok.text_tokens
    cross = not model.text_joint and n_text > 0
    n = math.ceil(n_seq / (layout.ring * layout.ulysses))
    t, h, layers = layout.tp, model.hidden, model.layers
    k_x = 2 * h * h * layers if cross else 0
    linear = (2 * n * (block_params - k_x) / t + 2 * n_text * k_x / t) / matmul_flops
    keys = n_seq + (n_text if cross else 0)
    attention = layers * 4 * n * keys * h / t / attention_flops
    return {"linear": linear, "attention": attention}
    # END SOLUTION


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
    # BEGIN SOLUTION 10.2 | notebook 10, "What a layout sends"
    # | hint: for each collective ask two questions. How much of the tensor must leave this GPU
    # | (in an all-to-all of U ranks, which part stays)? And what is the GPU doing while it
    # | travels: waiting, or computing something that does not need it? Under USP, what shape
    # | is a ring block after the all-to-all (tokens, channels)?
    # | hint2: an all-to-all of U ranks keeps 1/U and sends (U - 1) / U; a ring hop carries K
    # | and V of one block while that block's attention runs, so only max(0, hop - compute) is
    # | exposed; under USP a block is n U tokens by hidden / (U T) channels. Wan 2.1 1.3B
    # | (hidden 1,536, 30 layers) at 480p on 8 RTX 4090s as ring 8: n =
    # | 4,095 (an even split), a hop 2 x 4,095 x 1,536 x 2 B = 25.2 MB over the box's PCIe at
    # | 5.0 GB/s (no peer-to-peer: the planner's `pcie4-host` link) = 5.03 ms, the block's
    # | attention 4 x 4,095^2 x 1,536 FLOPs at 148.7 TFLOP/s = 0.693 ms: 4.34 ms exposed per
    # | hop, x 7 hops x 30 layers = 911 ms per forward. HunyuanVideo as ring 2 x
    # | ulysses 4 on NVLink (360 GB/s): Ulysses 60 x 4 x 3/4 x 14,882 x 3,072 x 2 B / 360e9 =
    # | 45.7 ms; its ring hop (0.51 ms) hides behind 31.4 ms of attention.
    # | hint3: uly = layers * 4 * (u - 1) / u * n * hidden / t * 2 / (ulysses_gbps * 1e9); hop =
    # | 2 * (n * u) * (hidden / (u * t)) * 2 / (ring_gbps * 1e9); block = 4 * (n * u) ** 2 *
    # | (hidden / (u * t)) / attention_flops; ring = layers * (r - 1) * max(0, hop - block).
    r, u, t = layout.ring, layout.ulysses, layout.tp
    uly = layers * 4 * (u - 1) / u * n * hidden / t * BF16 / (ulysses_gbps * 1e9)
    ring = 0.0
    if r > 1:
        tokens, channels = n * u, hidden / (u * t)   # one ring block, after the all-to-all
        hop = 2 * tokens * channels * BF16 / (ring_gbps * 1e9)
        block = 4 * tokens * tokens * channels / attention_flops
        ring = layers * (r - 1) * max(0.0, hop - block)
    return {"ulysses": uly, "ring_exposed": ring}
    # END SOLUTION


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
    # BEGIN SOLUTION 10.3 | notebook 10, "Which layouts HunyuanVideo runs"
    # | hint: three checks, each on a different part of the layout. A distilled model has no
    # | second forward for cfg to take. Ulysses and TP both hand each GPU a share of the heads.
    # | The split over the video is made by ring x ulysses ranks together (TP ranks hold the
    # | same tokens), and it cuts whole rows of tokens, or else whole columns.
    # | hint2: 960 x 960 is a 60 x 60 token grid. ulysses 8: 24 heads split 8 ways, but 60 rows
    # | and 60 columns do not divide by 8: refused. ring 2 x ulysses 3 (6 ranks): 60 / 6 = 10
    # | rows each: runs. 1280 wide x 720 high: 45 rows, 80 columns; on 8 ranks the rows do not
    # | divide, the columns do: it splits the width. ulysses 4 x tp 2: 8 shares of 24 heads, 4
    # | sequence ranks: runs.
    # | hint3: rows, cols, sp = height // 16, width // 16, layout.ring * layout.ulysses; return
    # | layout.cfg == 1 and 24 % (layout.ulysses * layout.tp) == 0 and (rows % sp == 0 or cols %
    # | sp == 0).
    rows, cols = height // 16, width // 16
    sp = layout.ring * layout.ulysses
    heads_ok = 24 % (layout.ulysses * layout.tp) == 0
    return layout.cfg == 1 and heads_ok and (rows % sp == 0 or cols % sp == 0)
    # END SOLUTION


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
    # BEGIN SOLUTION 10.4 | notebook 10, "How far the ring hides"
    # | hint: a hop is hidden when sending one block takes no longer than attending to it. Write
    # | both for a block of n tokens (exercise 10.2's terms, notebook 05's threshold) and see what
    # | cancels: the condition is on n alone, against the GPU and the link. More GPUs means
    # | shorter blocks, so there is a largest R; remember how the busiest GPU's n is rounded.
    # | hint2: HunyuanVideo (N = 119,056) over InfiniBand NDR between H100 nodes: attention at
    # | 0.35 x 989e12 = 3.46e14 FLOP/s, the link at 46.5 GB/s. A hop of n tokens sends 2 x n x
    # | hidden x 2 bytes, its block's attention is 4 x n x n x hidden FLOPs: equal at n = 3.46e14
    # | / 46.5e9 = 7,444 tokens, whatever the hidden size. ceil(119,056 / 15) = 7,938 hides;
    # | ceil(119,056 / 16) = 7,441 does not: 15 GPUs.
    # | hint3: critical = attention_flops / (link_gbps * 1e9); return max([1] + [r for r in
    # | range(2, max_gpus + 1) if math.ceil(tokens / r) >= critical]); hidden and layers cancel.
    critical = attention_flops / (link_gbps * 1e9)  # tokens per GPU at which a hop = its block
    return max([1] + [r for r in range(2, max_gpus + 1) if math.ceil(tokens / r) >= critical])
    # END SOLUTION
