# Yours to edit. Generated from solutions/ex16_sparse.py by tools/make_exercises.py
# stub-sha256: e811c9d0862d86c2 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 16, sparse attention and FP8 under CP: dealing heads to ranks by their
work, and a bug hunt in an FP8 all-to-all whose scale was calibrated on one rank only.

    python -m pytest tests/graded --ex 16.1 --impl exercises

The library's versions are `cpcourse.sparse.cp.greedy_assign` and `cpcourse.fp8_comm`. Check
yours in the notebook with `cpcourse.check("16.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.fp8_comm import Codec, calibrated_scale, roundtrip


def balance_heads(head_work: list[float], world: int) -> list[list[int]]:
    """Deal heads to `world` ranks for Ulysses under a sparse mask: head h costs head_work[h]
    (its kept score entries). Every rank must hold exactly len(head_work) / world heads (world
    divides the head count) and every head exactly once; return each rank's head ids (any
    order). The goal is a small imbalance, max over mean of the ranks' summed work: on
    [8, 7, 6, 5, 4, 3, 2, 1] over 2 ranks, contiguous halves give 26 vs 10 (1.44); you can do
    far better. Example: ([5, 1, 1, 5], 2) -> [[0, 1], [2, 3]] or any deal with loads 6 and 6.
    """
    # Exercise 16.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 16.1 balance_heads: read notebook 16, \"Dealing the work\". Hint: "
        "deal the heaviest heads first; give each to the rank that has the least work "
        "so far among those that still have room (H / P heads each) (2 more: "
        "cpcourse.hint(\"16.1\"))"
    )


def fp8_send_buggy(shards: list[torch.Tensor]) -> list[torch.Tensor]:
    """What each simulated rank's shard looks like after an FP8 all-to-all with one per-tensor
    scale, as a colleague wrote it (do not copy it). Fine on the data it was tried on."""
    scale = calibrated_scale(float(shards[0].abs().max()))
    codec = Codec("fp8-tensor", scale)
    return [roundtrip(x, codec) for x in shards]


def fp8_send(shards: list[torch.Tensor]) -> list[torch.Tensor]:
    """`fp8_send_buggy`, fixed: shards[r] is rank r's tensor (simulated ranks, one process);
    return what arrives for each, sent with ONE per-tensor fp8 scale that every rank shares
    (`Codec("fp8-tensor", scale)`, `roundtrip`), calibrated with `calibrated_scale` so that no
    rank's values are clipped. On real ranks the fix is one collective (which?)."""
    # Exercise 16.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 16.2 fp8_send: read notebook 16, \"Bug hunt: a scale from one rank\". "
        "Hint: whose values did the colleague's scale see? What happens on a rank "
        "whose values are larger than those? (2 more: cpcourse.hint(\"16.2\"))"
    )
