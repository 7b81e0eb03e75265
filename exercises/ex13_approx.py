# Yours to edit. Generated from solutions/ex13_approx.py by tools/make_exercises.py
# stub-sha256: 0e92a442da757dde (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 13, trading exactness for communication: the stale K/V buffer of
displaced patches (DistriFusion), and a bug hunt in a first-block cache whose ranks decide alone.

    python -m pytest tests/graded --ex 13.1 --impl exercises

The library's versions are `cpcourse.approx.displaced.DisplacedAttention` (on processes) and
`cpcourse.approx.fbcache.FirstBlockCache`. Check yours in the notebook with
`cpcourse.check("13.1")`.
"""

from __future__ import annotations


def displaced_buffer(kv_steps, rank: int, step: int, warmup: int) -> list:
    """What rank `rank` attends to at denoising step `step` under displaced patches, simulated
    in one process.

    kv_steps[s][q]: rank q's fresh K/V at step s, `[B, H, L_q, 2D]` (keys and values side by
    side). The first `warmup` steps gather synchronously, so every rank's K/V is fresh. After
    them a rank's own K/V is fresh and every other rank's is the one it sent a step earlier (the
    asynchronous gather started then has just been waited on). At step 0 with warmup 0 nothing
    has arrived yet: other ranks' entries are None.
    Returns a list of P entries, entry q the tensor (not a copy) rank `rank` uses for rank q.
    """
    # Exercise 13.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 13.1 displaced_buffer: read notebook 13, \"What each method makes "
        "stale\". Hint: at step s, when did the gather that delivers rank q's K/V "
        "start, and is that the same for q == rank? What has arrived before step 0? "
        "(2 more: cpcourse.hint(\"13.1\"))"
    )


def cache_decisions_buggy(first_outputs, threshold: float) -> list[list[bool]]:
    """A first-block cache's skip decisions on P simulated ranks, as a colleague wrote it (do not
    copy it). first_outputs[s][r]: rank r's first-block output at step s, `[B, T_r, S, hidden]`.
    Returns decisions[r][s]: whether rank r skips the other blocks at step s. Each rank compares
    only its own frames, so the ranks can disagree.
    """
    decisions = []
    for r in range(len(first_outputs[0])):
        mine = [False]
        for s in range(1, len(first_outputs)):
            h, prev = first_outputs[s][r], first_outputs[s - 1][r]
            mine.append(float((h - prev).abs().sum() / prev.abs().sum()) < threshold)
        decisions.append(mine)
    return decisions


def cache_decisions(first_outputs, threshold: float) -> list[list[bool]]:
    """`cache_decisions_buggy`, fixed: the same decision on every rank, the one a single process
    holding the whole video would make.

    first_outputs[s][r]: rank r's first-block output at step s, `[B, T_r, S, hidden]` (its
    frames). The change at step s >= 1 is the whole video's relative L1 change of the first
    block's output against step s - 1: sum|h - h_prev| / sum|h_prev| over every rank's frames.
    A step skips when the change is below `threshold`; step 0 never skips.
    Returns decisions[r][s] (P lists of len(first_outputs) booleans).
    """
    # Exercise 13.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 13.2 cache_decisions: read notebook 13, \"Bug hunt: a cache decision "
        "made alone\". Hint: a rank whose frames barely moved and a rank whose frames "
        "moved a lot: what does each decide, and what does one process holding both "
        "decide? (2 more: cpcourse.hint(\"13.2\"))"
    )
