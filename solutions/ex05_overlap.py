"""Exercises of notebook 05, communication and overlap: when does the ring hide its traffic, and
how many GPUs to buy for a layer's time?

    python -m pytest tests/graded --ex 05.1 --impl exercises   # 05.1, 05.2

One ring step on a rank: its Lq queries attend to one visiting K/V block of Lk = Lq tokens
(4 * Lq * Lk * D * H FLOPs) while the next block, K and V of Lq tokens for every head
(2 * Lq * D * H * bytes_per_element bytes), travels one hop. Overlapped, a step costs
max(compute, comm); communication is hidden when compute >= comm. A hop also pays a fixed
latency (alpha, `cpcourse.planner.collectives`), whatever its size. The library's version without
latency is `cpcourse.planner.costs.comm`.
"""

from __future__ import annotations

import math


def overlap_condition(tokens_per_rank: int, heads: int, head_dim: int, bytes_per_element: int,
                      flops_per_s: float, bytes_per_s: float, latency_s: float = 0.0) -> dict:
    """Does one ring step hide its hop, and from how many tokens per rank would it?

    tokens_per_rank: Lq (= Lk of the visiting block); flops_per_s: the attention kernel's
    achieved rate; bytes_per_s: the link's achieved bandwidth, one direction; latency_s: the
    fixed cost of every hop (alpha), paid whatever its size.
    Returns {"compute_s": seconds of one step's attention, "comm_s": seconds of one hop,
    latency included, "hidden": compute_s >= comm_s, "min_tokens_per_rank": the smallest
    integer Lq whose step hides its hop with these heads, head size, rates and latency}.
    """
    # BEGIN SOLUTION 05.1 | notebook 05, "The overlap condition"
    # | hint: section 1 gives the FLOPs of one step and the bytes of one hop; divide each by its
    # | rate, and add the latency to the hop. Without latency the threshold is section 1's
    # | F b / (2 B); with it, write compute >= comm as an inequality in Lq and ask which terms
    # | still cancel. The answer is a whole number of tokens: round the right way, and check it
    # | against your own compute_s and comm_s.
    # | hint2: Lq = 2000, H = 2, D = 64, b = 2, F = 1e12, B = 1e9, no latency: compute = 4 *
    # | 2000^2 * 64 * 2 / 1e12 = 2.048 ms, comm = 2 * 2000 * 64 * 2 * 2 / 1e9 = 1.024 ms; hidden,
    # | from 1000 tokens on. Add a latency of 1 ms: comm = 2.024 ms, still hidden, but the
    # | threshold is now where 5.12e-10 Lq^2 = 1e-3 + 5.12e-7 Lq: from Lq = 1,985 on.
    # | hint3: with a = 4 D H / F, c = 2 D H b / B: a Lq^2 >= latency + c Lq holds from
    # | Lq = (c + sqrt(c^2 + 4 a latency)) / (2 a); take its ceiling, then step it down while
    # | the step below still hides and up while it does not (floating point).
    a = 4 * head_dim * heads / flops_per_s
    c = 2 * head_dim * heads * bytes_per_element / bytes_per_s

    def times(lq):
        return a * lq * lq, latency_s + c * lq

    n = max(1, math.ceil((c + math.sqrt(c * c + 4 * a * latency_s)) / (2 * a)))
    while n > 1 and times(n - 1)[0] >= times(n - 1)[1]:
        n -= 1
    while times(n)[0] < times(n)[1]:
        n += 1
    compute_s, comm_s = times(tokens_per_rank)
    return {"compute_s": compute_s, "comm_s": comm_s, "hidden": compute_s >= comm_s,
            "min_tokens_per_rank": n}
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
