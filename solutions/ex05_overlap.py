"""Exercise of notebook 05, communication and overlap: when does the ring hide its traffic?

    python -m pytest tests/graded --ex 05.1 --impl exercises

One ring step on a rank: its Lq queries attend to one visiting K/V block of Lk = Lq tokens
(4 * Lq * Lk * D * H FLOPs) while the next block, K and V of Lq tokens for every head
(2 * Lq * D * H * bytes_per_element bytes), travels one hop. Overlapped, a step costs
max(compute, comm); communication is hidden when compute >= comm. The library's version is
`cpcourse.costs.comm`.
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
