# Yours to edit. Generated from solutions/ex15_tiling.py by tools/make_exercises.py
# stub-sha256: ca5efab03d9f167f (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 15, CP as tilings of the attention matrix: the grid's groups (who
gathers with whom), and a bug hunt in the combine step that merges a row's partial outputs.

    python -m pytest tests/graded --ex 15.1 --impl exercises

The library's versions are `cpcourse.tiling.tile` and `cpcourse.tiling.merge_partials`; Attention2D
on processes is `cpcourse.tiling.attention_2d`. Check yours in the notebook with
`cpcourse.check("15.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.attention import merge_attention


def grid_tiles(rows: int, cols: int) -> list[tuple[list[int], list[int]]]:
    """For each of the P = rows x cols ranks, the tile of the score matrix it scores:
    (query shards, key shards), shards numbered like the ranks that hold them (rank r holds
    shard r of q, k and v, tensor_split order).

    Rank r gathers the q shards of its query group and the k, v shards of its key group, so:
    every (query shard, key shard) pair must be scored by exactly one rank; each rank's query
    group holds `cols` shards and its key group `rows` shards (what the grid's bytes assume);
    and a rank must score its own queries, since it is the one that merges their partials.
    Which ranks share a group is your decision. Example: (1, 2) -> [([0, 1], [0]),
    ([0, 1], [1])]: both ranks score both queries, each against its own keys.
    """
    # Exercise 15.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 15.1 grid_tiles: read notebook 15, \"Exercise 15.1: the grid's "
        "groups\". Hint: draw the P x P block matrix (query shards down, key shards "
        "across) and cut it into P tiles of cols x rows blocks, each touching its "
        "rank's own row of blocks. Which ranks must share a query group so that the "
        "key groups of that query group cover every key? (2 more: "
        "cpcourse.hint(\"15.1\"))"
    )


def combine_partials_buggy(outs: torch.Tensor, lses: torch.Tensor):
    """A colleague's combine step (the bug hunt of notebook 15): merges an owner's partials.
    It is right on a 2x2 grid and wrong on others."""
    out, lse = outs[0], lses[0]
    for c in range(1, outs.shape[0]):
        out, _ = merge_attention(out, lse, outs[c], lses[c])
    return out, lse


def combine_partials(outs: torch.Tensor, lses: torch.Tensor):
    """`combine_partials_buggy`, fixed: the owner's merge of the partial attentions its row sent.

    outs `[C, B, H, L, D]`, lses `[C, B, H, L]`: C partials of the same L queries, each over a
    disjoint set of keys (out in float32 or float64, lse its log-sum-exp; a partial over no keys
    has lse = -inf). Returns (out `[B, H, L, D]`, lse `[B, H, L]`): the attention over the union
    of the key sets and its log-sum-exp, as one call over all the keys would give.
    """
    # Exercise 15.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 15.2 combine_partials: read notebook 15, \"Exercise 15.2: bug hunt "
        "in the combine\". Hint: run the buggy combine with C = 2 and with C = 3 "
        "partials of the same queries. Which of merge_attention's two results does it "
        "drop, and which merge needs it? (2 more: cpcourse.hint(\"15.2\"))"
    )
