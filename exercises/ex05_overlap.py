# Yours to edit. Generated from solutions/ex05_overlap.py by tools/make_exercises.py
# stub-sha256: 35949a41dd61dcf5 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 05.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 05.1 overlap_condition: read notebook 05, \"The overlap condition\". "
        "Hint: section 1 gives the FLOPs of one step and the bytes of one hop; divide "
        "each by its rate, and add the latency to the hop. Without latency the "
        "threshold is section 1's F b / (2 B); with it, write compute >= comm as an "
        "inequality in Lq and ask which terms still cancel. The answer is a whole "
        "number of tokens: round the right way, and check it against your own "
        "compute_s and comm_s. (2 more: cpcourse.hint(\"05.1\"))"
    )


def fewest_gpus(tokens: int, heads: int, head_dim: int, bytes_per_element: int,
                flops_per_s: float, bytes_per_s: float, target_s: float,
                max_gpus: int) -> int | None:
    """The CP degree to buy: the fewest GPUs whose ring runs one attention layer within
    `target_s` seconds, or None when no number of GPUs up to `max_gpus` does.

    Only degrees P that divide `tokens` count (every rank holds tokens / P of them). Rates and
    sizes as in `overlap_condition`; the layer's time is that of the overlapped ring from start
    to the end of its last step, as `cpcourse.sim.timeline` measures it (no latency).
    """
    # Exercise 05.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 05.2 fewest_gpus: read notebook 05, \"How many GPUs?\". Hint: the "
        "ring's time for a layer is exercise 03.2's overlapped prediction; work out "
        "what it becomes as P grows, once the hops no longer hide behind the compute. "
        "Is there a time no number of GPUs goes under on a given link? Then return "
        "the first degree that meets the target, or None, without assuming that more "
        "GPUs are always faster. (2 more: cpcourse.hint(\"05.2\"))"
    )
