# Yours to edit. Generated from solutions/ex05_overlap.py by tools/make_exercises.py
# stub-sha256: d004725b6d07a159 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 05.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 05.1 overlap_condition: read notebook 05, \"The overlap condition\". "
        "Hint: section 1 and the module docstring give the FLOPs of one step and the "
        "bytes of one hop; divide each by its rate to get seconds. For the threshold, "
        "write the ratio of the two times: heads and head_dim cancel, leaving a "
        "condition on the tokens per rank alone. The answer is the smallest whole "
        "number of tokens, so round the right way. (2 more: cpcourse.hint(\"05.1\"))"
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
