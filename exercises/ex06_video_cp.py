# Yours to edit. Generated from solutions/ex06_video_cp.py by tools/make_exercises.py
# stub-sha256: 16b2cd6444bf37c8 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 06, video tokens and temporal CP: split a video along time.

    python -m pytest tests/graded --ex 06.1 --impl exercises

Layout: a video's q/k/v is `[B, H, T, S, D]` (T latent frames, S = h * w tokens per frame).
Under CP each rank holds a contiguous run of frames, split like `torch.tensor_split` (the first
T % P ranks hold one frame more; some ranks hold none when T < P). The library's versions are in
`cpcourse.video`; check yours in the notebook with `cpcourse.check("06.1")`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.ring import ring_attention
from cpcourse.support.groups import agree, all_gather_single, require_group
from cpcourse.support.shards import shard_sizes


def shard_frames(video: torch.Tensor, rank: int, world: int) -> tuple[torch.Tensor, int]:
    """Rank `rank`'s frames of a whole video and the global index of its first frame.

    video `[B, H, T, S, D]` -> (local `[B, H, T_r, S, D]` contiguous, frame_offset int): the
    frames `torch.tensor_split(range(T), world)[rank]` names, and the global index of the
    first of them. Compute both in O(1) from T, rank and world (a rank of a real model knows
    its rank, not the other ranks' shards), and mind a rank with no frame: its offset is still
    where its (empty) run sits.
    """
    # Exercise 06.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 06.1 shard_frames: read notebook 06, \"The layout, and the split "
        "along time\". Hint: the layout section: a rank's frames follow the "
        "tensor_split rule (the first few ranks hold one frame more, and a rank may "
        "hold none). Work out this rank's frame count, then its first frame as the "
        "total held by the ranks before it; slice the time axis (dim 2) and return a "
        "contiguous copy with that first frame. (2 more: cpcourse.hint(\"06.1\"))"
    )


def gather_frames(local: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's frames `[B, H, T_r, S, D]` -> the whole video `[B, H, T, S, D]` on every rank.

    Shards may differ by one frame (and be empty), and gloo's all-gather needs equal sizes: pad
    each shard to the largest with zeros, `cpcourse.support.groups.all_gather_single` into a
    `[world * B, H, T_max, S, D]` buffer (gloo stacks the ranks along dim 0; view it as
    `[world, B, H, T_max, S, D]`), then keep each rank's first T_r frames.
    `cpcourse.support.groups.agree(group, seq_dim=2, x=local)["x"]` gives every rank's shape.
    """
    # Exercise 06.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 06.2 gather_frames: read notebook 06, \"Exercises 06.2 and 06.3\". "
        "Hint: the docstring and the exercise text of section 4: the all-gather wants "
        "the same size from every rank, so first learn every rank's frame count, pad "
        "your shard with zero frames to the largest, gather into one buffer holding "
        "one slot per rank along the first dimension, then drop each rank's padding "
        "while joining the frames in rank order. (2 more: cpcourse.hint(\"06.2\"))"
    )


def time_to_space(x: torch.Tensor, frames: int, group=None) -> torch.Tensor:
    """The temporal all-to-all: re-shard from a time split to a space split.

    x: this rank's frames, all positions `[B, H, T_r, S, D]` (T = `frames` split over the group
    like tensor_split). Returns all frames for this rank's positions `[B, H, T, S_r, D]`, the
    positions split like `torch.tensor_split(S, world)`. Cut x into `world` chunks along S,
    send chunk j to rank j with one `dist.all_to_all_single` (flatten the chunks into one 1-D
    tensor; split sizes in elements), and put the received pieces in frame order.
    """
    # Exercise 06.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 06.3 time_to_space: read notebook 06, \"Exercises 06.2 and 06.3\". "
        "Hint: section 4's all-to-all: cut your frames into P chunks of positions "
        "(the same split rule, on the S axis) and send chunk j to rank j; from every "
        "rank you receive that rank's frames of your own positions. Every size "
        "follows from T, S and P, with no extra communication; split sizes count "
        "elements. Join the received pieces by source rank, which is frame order. (2 "
        "more: cpcourse.hint(\"06.3\"))"
    )


def full_attention_ring(q, k, v, group=None) -> torch.Tensor:
    """Full 3D attention of a T-sharded video with the ring: `[B, H, T_r, S, D]` in and out.

    Equal, on every rank, to its frames of one process's attention over all T*S tokens. The
    library's `cpcourse.ring.ring_attention` takes sequence shards `[B, H, L_r, D]` in
    tensor_split order: decide whether a rank's frames are such a shard (frames split by
    frames, not tokens, so L_r is not the token split's) and what the ring needs to see.
    """
    # Exercise 06.4: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 06.4 full_attention_ring: read notebook 06, \"Full 3D attention on a "
        "video\". Hint: section 5: in (t, s) order a rank's frames are one contiguous "
        "run of the flattened sequence, so merge the frame and position axes of all "
        "three inputs, hand these local shards to the library's ring with the group, "
        "and undo the merge on the output (its last dimension is the values'). (2 "
        "more: cpcourse.hint(\"06.4\"))"
    )


def joint_attention_cp_buggy(q, k, v, text_q, text_k, text_v, group=None):
    """A joint video+text attention under CP that looks right and is not (do not copy it).

    Every rank holds the whole text: it appends the text tokens to its queries AND to its K/V
    block, and runs the ring. Find what goes wrong, then write `joint_attention_cp`.
    """
    b, h, t, s, d = q.shape
    flat = lambda x, txt: torch.cat([x.reshape(b, h, t * s, x.shape[-1]), txt], dim=2)  # noqa
    out = ring_attention(flat(q, text_q), flat(k, text_k), flat(v, text_v), group=group)
    return out[:, :, :t * s].reshape(b, h, t, s, v.shape[-1]), out[:, :, t * s:]


def joint_attention_cp(q, k, v, text_q, text_k, text_v, group=None):
    """Joint attention of T-sharded video tokens and replicated text tokens, under the ring.

    q, k, v `[B, H, T_r, S, D]` (this rank's frames); text_q/k/v `[B, H, N, D]`, the same on
    every rank. Returns (video out `[B, H, T_r, S, D]`, text out `[B, H, N, D]`) equal to one
    process attending over all T*S + N tokens, on every rank (each rank's text rows are the
    whole text's). Each text key must enter every softmax exactly once, whatever P: where the
    text keys and values go is your design (notebook 06, section 6 compares the choices).
    """
    # Exercise 06.5: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 06.5 joint_attention_cp: read notebook 06, \"Bug hunt: the "
        "replicated text tokens\". Hint: section 6: the ring shows every rank's K/V "
        "block to every rank, so whatever sits in all P blocks enters each softmax P "
        "times. Queries never travel, so the text queries may stay on every rank; the "
        "text keys and values must be in exactly one block. Pick one rank to carry "
        "them; the others append an empty slice, so the code stays the same on all "
        "ranks. (2 more: cpcourse.hint(\"06.5\"))"
    )
