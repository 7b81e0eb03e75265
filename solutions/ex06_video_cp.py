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
    # BEGIN SOLUTION 06.1 | notebook 06, "The layout, and the split along time"
    # | hint: the layout section: a rank's frames follow the tensor_split rule (the first few ranks
    # | hold one frame more, and a rank may hold none). Work out this rank's frame count, then its
    # | first frame as the total held by the ranks before it; slice the time axis (dim 2) and return
    # | a contiguous copy with that first frame.
    # | hint2: T = 7, P = 3: sizes [3, 2, 2], first frames [0, 3, 5]. T = 10, P = 4: sizes [3, 3, 2,
    # | 2], rank 3 starts at frame 8. T = 2, P = 3: sizes [1, 1, 0]; rank 2 gets an empty [B, H, 0,
    # | S, D] slice with offset 2.
    # | hint3: base, extra = divmod(T, world); size = base + (1 if rank < extra else 0); offset =
    # | rank * base + min(rank, extra); return video[:, :, offset:offset + size].contiguous(),
    # | offset.
    t = video.shape[2]
    base, extra = divmod(t, world)
    size = base + (1 if rank < extra else 0)
    offset = rank * base + min(rank, extra)
    return video[:, :, offset:offset + size].contiguous(), offset
    # END SOLUTION


def gather_frames(local: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's frames `[B, H, T_r, S, D]` -> the whole video `[B, H, T, S, D]` on every rank.

    Shards may differ by one frame (and be empty), and gloo's all-gather needs equal sizes: pad
    each shard to the largest with zeros, `cpcourse.support.groups.all_gather_single` into a
    `[world * B, H, T_max, S, D]` buffer (gloo stacks the ranks along dim 0; view it as
    `[world, B, H, T_max, S, D]`), then keep each rank's first T_r frames.
    `cpcourse.support.groups.agree(group, seq_dim=2, x=local)["x"]` gives every rank's shape.
    """
    # BEGIN SOLUTION 06.2 | notebook 06, "Exercises 06.2 and 06.3"
    # | hint: the docstring and the exercise text of section 4: the all-gather wants the same size
    # | from every rank, so first learn every rank's frame count, pad your shard with zero frames to
    # | the largest, gather into one buffer holding one slot per rank along the first dimension,
    # | then drop each rank's padding while joining the frames in rank order.
    # | hint2: T = 7 on P = 3: sizes [3, 2, 2], so T_max = 3; each rank sends [B, H, 3, S, D]; the
    # | buffer is [3 * B, H, 3, S, D], viewed [3, B, H, 3, S, D]; keep 3, 2 and 2 frames of slots 0,
    # | 1, 2: 7 frames. T = 2 on P = 3 (sizes [1, 1, 0]): rank 2 sends one frame of zeros and
    # | contributes none.
    # | hint3: sizes = [s[2] for s in agree(group, seq_dim=2, x=local)["x"]]; pad to max(sizes) on
    # | dim 2; all_gather_single(buf, padded, group=group) into [world * B, H, T_max, S, D];
    # | view(world, B, H, T_max, S, D); cat buf[r, :, :, :sizes[r]] over r on dim 2.
    _, world = require_group(group, "gather_frames")
    sizes = [shape[2] for shape in agree(group, seq_dim=2, x=local)["x"]]
    most = max(sizes)
    padded = local.new_zeros(*local.shape[:2], most, *local.shape[3:])
    padded[:, :, :local.shape[2]] = local
    buf = local.new_empty(world * padded.shape[0], *padded.shape[1:])  # ranks stacked on dim 0
    all_gather_single(buf, padded, group=group)
    buf = buf.view(world, *padded.shape)
    return torch.cat([buf[r, :, :, :n] for r, n in enumerate(sizes)], dim=2)
    # END SOLUTION


def time_to_space(x: torch.Tensor, frames: int, group=None) -> torch.Tensor:
    """The temporal all-to-all: re-shard from a time split to a space split.

    x: this rank's frames, all positions `[B, H, T_r, S, D]` (T = `frames` split over the group
    like tensor_split). Returns all frames for this rank's positions `[B, H, T, S_r, D]`, the
    positions split like `torch.tensor_split(S, world)`. Cut x into `world` chunks along S,
    send chunk j to rank j with one `dist.all_to_all_single` (flatten the chunks into one 1-D
    tensor; split sizes in elements), and put the received pieces in frame order.
    """
    # BEGIN SOLUTION 06.3 | notebook 06, "Exercises 06.2 and 06.3"
    # | hint: section 4's all-to-all: cut your frames into P chunks of positions (the same split
    # | rule, on the S axis) and send chunk j to rank j; from every rank you receive that rank's
    # | frames of your own positions. Every size follows from T, S and P, with no extra
    # | communication; split sizes count elements. Join the received pieces by source rank, which is
    # | frame order.
    # | hint2: T = 7, S = 10, P = 3, B = H = D = 1: frames [3, 2, 2], positions [4, 3, 3]. Rank 0 (3
    # | frames) sends 3 * 4 = 12, 3 * 3 = 9 and 9 elements; it receives 3 * 4 = 12, 2 * 4 = 8 and 8
    # | elements (positions 0-3 of the frames of ranks 0, 1, 2) and returns [1, 1, 7, 4, 1].
    # | hint3: chunks = torch.tensor_split(x, world, dim=3); send = the flattened chunks
    # | concatenated, send sizes their numel(); receive sizes B * H * T_src * S_mine * D, with T_src
    # | = shard_sizes(frames, P)[src] and S_mine = shard_sizes(S, P)[rank]; view piece src as [B, H,
    # | T_src, S_mine, D] and cat on dim 2.
    rank, world = require_group(group, "time_to_space")
    b, h, _, s, d = x.shape
    t_sizes, s_sizes = shard_sizes(frames, world), shard_sizes(s, world)
    chunks = torch.tensor_split(x, world, dim=3)
    send = torch.cat([c.reshape(-1) for c in chunks])
    recv_counts = [b * h * t_sizes[src] * s_sizes[rank] * d for src in range(world)]
    recv = send.new_empty(sum(recv_counts))
    dist.all_to_all_single(recv, send, recv_counts, [c.numel() for c in chunks], group=group)
    pieces = torch.split(recv, recv_counts)
    return torch.cat([p.view(b, h, t_sizes[src], s_sizes[rank], d)
                      for src, p in enumerate(pieces)], dim=2)
    # END SOLUTION


def full_attention_ring(q, k, v, group=None) -> torch.Tensor:
    """Full 3D attention of a T-sharded video with the ring: `[B, H, T_r, S, D]` in and out.

    Equal, on every rank, to its frames of one process's attention over all T*S tokens. The
    library's `cpcourse.ring.ring_attention` takes sequence shards `[B, H, L_r, D]` in
    tensor_split order: decide whether a rank's frames are such a shard (frames split by
    frames, not tokens, so L_r is not the token split's) and what the ring needs to see.
    """
    # BEGIN SOLUTION 06.4 | notebook 06, "Full 3D attention on a video"
    # | hint: section 5: in (t, s) order a rank's frames are one contiguous run of the flattened
    # | sequence, so merge the frame and position axes of all three inputs, hand these local shards
    # | to the library's ring with the group, and undo the merge on the output (its last dimension
    # | is the values').
    # | hint2: T = 7 frames of S = 10 on P = 3: rank 0 holds tokens 0-29 of the 70, rank 1 (frames 3
    # | and 4) tokens 30-49, rank 2 tokens 50-69. On rank 0, q [1, 2, 3, 10, 16] becomes [1, 2, 30,
    # | 16]; the ring returns [1, 2, 30, 16], reshaped to [1, 2, 3, 10, 16].
    # | hint3: b, h, t, s, d = q.shape; out = ring_attention(*(x.reshape(b, h, t * s, x.shape[-1])
    # | for x in (q, k, v)), group=group); return out.reshape(b, h, t, s, v.shape[-1]).
    b, h, t, s, d = q.shape
    out = ring_attention(*(x.reshape(b, h, t * s, x.shape[-1]) for x in (q, k, v)), group=group)
    return out.reshape(b, h, t, s, v.shape[-1])
    # END SOLUTION


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
    # BEGIN SOLUTION 06.5 | notebook 06, "Bug hunt: the replicated text tokens"
    # | hint: section 6: the ring shows every rank's K/V block to every rank, so whatever sits in
    # | all P blocks enters each softmax P times. Queries never travel, so the text queries may stay
    # | on every rank; the text keys and values must be in exactly one block. Pick one rank to carry
    # | them; the others append an empty slice, so the code stays the same on all ranks.
    # | hint2: P = 3, N = 4 text tokens, 20 video tokens per rank: the buggy ring sees 3 * (20 + 4)
    # | = 72 keys, each text key three times. The fix: 24 queries on every rank, K/V blocks of 20,
    # | 20 and 24 tokens (text on rank 2 only), 64 = 60 + 4 keys in all, as on one process; every
    # | rank gets the same full text rows.
    # | hint3: keep text_q on every rank, but append text K/V to ONE rank's block only: n_text = N
    # | on the last rank, 0 elsewhere; K = cat(flat(k), text_k[:, :, :n_text]), same for V;
    # | ring_attention; split the output at T_r * S into video and text rows. (xDiT's "rear"
    # | keeps the text out of the ring and merges a local text attention by lse instead.)
    rank, world = require_group(group, "joint_attention_cp")
    b, h, t, s, d = q.shape
    n_text = text_k.shape[2] if rank == world - 1 else 0
    flat = lambda x, txt: torch.cat([x.reshape(b, h, t * s, x.shape[-1]), txt], dim=2)  # noqa
    out = ring_attention(flat(q, text_q), flat(k, text_k[:, :, :n_text]),
                         flat(v, text_v[:, :, :n_text]), group=group)
    return out[:, :, :t * s].reshape(b, h, t, s, v.shape[-1]), out[:, :, t * s:]
    # END SOLUTION
