"""Exercises of notebook 05, communication and overlap: when does the ring hide its traffic, and
how many GPUs to buy for a layer's time?

    python -m pytest tests/graded --ex 05.1 --impl exercises   # 05.1, 05.2

One ring step on a rank: its Lq queries attend to one visiting K/V block of Lk = Lq tokens
(4 * Lq * Lk * D * H FLOPs) while the next block, K and V of Lq tokens for every head
(2 * Lq * D * H * bytes_per_element bytes), travels one hop. Overlapped, a step costs
max(compute, comm); communication is hidden when compute >= comm. The library's version is
`cpcourse.planner.costs.comm`.
"""

from __future__ import annotations

import math


def overlap_condition(tokens_per_rank: int, heads: int, head_dim: int, bytes_per_element: int,
                      flops_per_s: float, bytes_per_s: float) -> dict:
    """Per-step compute and per-hop communication of one ring step, and whether comm hides.

    tokens_per_rank: Lq (= Lk of the visiting block); flops_per_s: the attention kernel's
    achieved rate; bytes_per_s: the link's achieved bandwidth, one direction.
    Returns {"compute_s": seconds of one step's attention, "comm_s": seconds of one hop,
    "hidden": compute_s >= comm_s, "min_tokens_per_rank": the smallest integer Lq for which
    compute_s >= comm_s (it depends on neither heads nor head_dim)}.
    """
    # BEGIN SOLUTION 05.1 | notebook 05, "The overlap condition"
    # | hint: section 1 and the module docstring give the FLOPs of one step and the bytes of one
    # | hop; divide each by its rate to get seconds. For the threshold, write the ratio of the two
    # | times: heads and head_dim cancel, leaving a condition on the tokens per rank alone. The
    # | answer is the smallest whole number of tokens, so round the right way.
    # | hint2: Lq = 2000, H = 2, D = 64, b = 2 bytes, F = 1e12 FLOP/s, B = 1e9 bytes/s: compute = 4
    # | * 2000^2 * 64 * 2 / 1e12 = 2.048e-3 s, comm = 2 * 2000 * 64 * 2 * 2 / 1e9 = 1.024e-3 s, so
    # | hidden is True (compute is twice the hop) and the minimum is 1000 tokens per rank. With
    # | B = 3e9 the threshold is 1e12 * 2 / 6e9 = 333.3, so the minimum is 334.
    # | hint3: compute = 4 Lq^2 D H / F, comm = 2 Lq D H b / B; their ratio 2 Lq B / (F b) >= 1
    # | gives Lq >= F b / (2 B): min_tokens_per_rank = math.ceil(F * b / (2 * B)).
    compute_s = 4 * tokens_per_rank ** 2 * head_dim * heads / flops_per_s
    comm_s = 2 * tokens_per_rank * head_dim * heads * bytes_per_element / bytes_per_s
    return {"compute_s": compute_s, "comm_s": comm_s, "hidden": compute_s >= comm_s,
            "min_tokens_per_rank": math.ceil(flops_per_s * bytes_per_element / (2 * bytes_per_s))}
    # END SOLUTION


def fewest_gpus(tokens: int, heads: int, head_dim: int, bytes_per_element: int,
                flops_per_s: float, bytes_per_s: float, target_s: float,
                max_gpus: int) -> int | None:
    """The CP degree to buy: the fewest GPUs whose ring runs one attention layer within
    `target_s` seconds, or None when no number of GPUs up to `max_gpus` does.

    Only degrees P that divide `tokens` count (every rank holds tokens / P of them). Rates and
    sizes as in `overlap_condition`; the layer's time is that of the overlapped ring from start
    to the end of its last step, as `cpcourse.sim.timeline` measures it (no latency).
    """
    # BEGIN SOLUTION 05.2 | notebook 05, "How many GPUs?"
    # | hint: the ring's time for a layer is exercise 03.2's overlapped prediction; work out what
    # | it becomes as P grows, once the hops no longer hide behind the compute. Is there a time no
    # | number of GPUs goes under on a given link? Then return the first degree that meets the
    # | target, or None, without assuming that more GPUs are always faster.
    # | hint2: 1,200 tokens, 1 head of 64, 2 bytes, F = 1e11, B = 1e8. P = 1: 3.69 ms, no hops. P =
    # | 2: a step computes 4 * 600^2 * 64 / 1e11 = 0.92 ms, a hop 2 * 600 * 64 * 2 / 1e8 = 1.54
    # | ms: 1.54 + 0.92 = 2.46 ms. P = 4: 3 * 0.77 + 0.23 = 2.53 ms, slower. P = 12: 11 * 0.26 +
    # | 0.03 = 2.84 ms. A target of 2.5 ms takes P = 2; a target of 2 ms, no P at all.
    # | hint3: for P in 1..max_gpus with tokens % P == 0: L = tokens // P; c = 4 L^2 D H / F; t = 2
    # | L D H b / B; return P if (P - 1) * max(c, t) + c <= target_s. After the loop return None.
    for world in range(1, max_gpus + 1):
        if tokens % world:
            continue
        lq = tokens // world
        compute = 4 * lq * lq * head_dim * heads / flops_per_s
        hop = 2 * lq * head_dim * heads * bytes_per_element / bytes_per_s
        if (world - 1) * max(compute, hop) + compute <= target_s:
            return world
    return None
    # END SOLUTION
