"""Video attention under context parallelism: the T split, factored spatial/temporal CP, full 3D.

    python -m pytest tests/unit/test_video.py tests/dist/test_video_cp.py -q

Layout: q, k, v `[B, H, T, S, D]`: T latent frames, S = h * w tokens per frame, in (t, h, w)
order, so flattening (T, S) gives the `[B, H, L, D]` sequence of `cpcourse.attention` and a
contiguous shard of that sequence is a run of frames. Under CP each rank holds the frames
`torch.tensor_split(range(T), P)[rank]` (the first `T % P` ranks hold one frame more; a rank may
hold none when T < P).

- `spatial_attention`: attention within each frame. Under a T split every frame is whole on
  its rank, so it needs no communication at all.
- `temporal_attention_cp(..., method=)`: attention across frames at each spatial position.
  `"all_to_all"` re-shards time split -> space split (each rank gets all T frames for ~S/P
  positions), attends locally, and re-shards back: each token crosses the wire once each way.
  `"ring"` keeps the T split and runs `cpcourse.ring.ring_attention` over time with the S
  positions folded into the batch (`[B*S, H, T_local, D]`): every rank's K/V visits every rank.
- `full_attention_cp(..., method=)`: attention over all T*S tokens (Cosmos, Wan, HunyuanVideo):
  the ring or Ulysses on the flattened local frames `[B, H, T_local*S, D]`.
- `joint_attention_cp`: full 3D attention plus text tokens that every rank holds whole. The text
  K/V must enter the softmax once: only the last rank adds them to its ring block.

Bytes each rank sends: measure with `cpcourse.support.bytecount.count_bytes()`, predict with
`cpcourse.planner.video_costs`; they agree exactly. The layouts themselves (an axis folded into
the batch, frames sharded along T) are `cpcourse.video.layout`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.attention import attention_with_lse
from cpcourse.support.errors import require
from cpcourse.support.groups import (
    agree,
    comm_device,
    forward_only,
    require_group,
    tracked,
)
from cpcourse.support.shards import shard_sizes
from cpcourse.video.layout import (
    batch_to_frames,
    batch_to_positions,
    flatten_video,
    frame_offset,
    frame_shard,
    frames_to_batch,
    gather_frames,
    positions_to_batch,
)

# the layouts are re-exported from cpcourse.video.layout: callers import them from here too
__all__ = ["FULL_METHODS", "TEMPORAL_METHODS", "batch_to_frames", "batch_to_positions",
           "flatten_video",
           "frame_offset", "frame_shard", "frames_to_batch", "full_attention",
           "full_attention_cp", "gather_frames", "joint_attention", "joint_attention_cp",
           "positions_to_batch", "space_to_time", "spatial_attention", "temporal_attention",
           "temporal_attention_cp", "time_to_space"]

TEMPORAL_METHODS = ("all_to_all", "ring")
FULL_METHODS = ("ring", "ulysses")


def _check_video(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        require(isinstance(t, torch.Tensor) and t.dim() == 5,
                f"{name} must be a 5-d video tensor [B, H, T, S, D], got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    require(q.shape == k.shape and q.shape[:-1] == v.shape[:-1],
            f"q, k, v must share [B, H, T, S] (and q, k the head dim): got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    # The all-to-all paths would quietly promote mixed dtypes; the ring refuses them: so do all.
    require(q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point,
            f"q, k, v must share one floating dtype: got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_text(q, v, text_q, text_k, text_v) -> None:
    """Text tokens `[B, H, N, D]` that can join the video's: same B, H, head dims and dtype."""
    for name, t, like in (("text_q", text_q, q), ("text_k", text_k, q), ("text_v", text_v, v)):
        require(isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[:2] == q.shape[:2]
                and t.shape[-1] == like.shape[-1] and t.dtype == q.dtype,
                f"{name} must be text tokens [B, H, N, D] with the video's B, H, head dim and "
                f"dtype {(*q.shape[:2], 'N', like.shape[-1])} {q.dtype}, got "
                f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    require(text_q.shape[2] == text_k.shape[2] == text_v.shape[2],
            f"text_q, text_k, text_v must hold the same N tokens, got {tuple(text_q.shape)}, "
            f"{tuple(text_k.shape)}, {tuple(text_v.shape)}")


# --- one-process references ----------------------------------------------------------------------

def spatial_attention(q, k, v, scale=None) -> torch.Tensor:
    """Attention among the S tokens of each frame: `[B, H, T, S, D]` -> `[B, H, T, S, D]`.

    Under a T split this is the whole story: every frame is on one rank, no communication.
    """
    _check_video(q, k, v)
    b, _, t, _, _ = q.shape
    out, _ = attention_with_lse(frames_to_batch(q), frames_to_batch(k), frames_to_batch(v),
                                scale=scale)
    return batch_to_frames(out, b, t)


def temporal_attention(q, k, v, scale=None) -> torch.Tensor:
    """Attention across the T frames at each spatial position (one process, whole video)."""
    _check_video(q, k, v)
    b, _, _, s, _ = q.shape
    out, _ = attention_with_lse(positions_to_batch(q), positions_to_batch(k),
                                positions_to_batch(v), scale=scale)
    return batch_to_positions(out, b, s)


def full_attention(q, k, v, scale=None) -> torch.Tensor:
    """Attention over all T*S tokens (one process, whole video): `[B, H, T, S, D]` out."""
    _check_video(q, k, v)
    out, _ = attention_with_lse(flatten_video(q), flatten_video(k), flatten_video(v), scale=scale)
    return out.reshape(q.shape[:-1] + (v.shape[-1],))


# --- temporal attention under a T split ----------------------------------------------------------

def time_to_space(x: torch.Tensor, t_sizes: list[int], group=None,
                  keep: list | None = None) -> torch.Tensor:
    """Re-shard `[..., T_r, S, D]` (my frames, all positions) -> `[..., T, S_r, D]` (all frames,
    my positions). Positions split like tensor_split(S, P); one all_to_all_single.

    Leading dims (e.g. a stacked q/k/v) ride along. Bytes sent: everything but my own slot.
    `keep`: a list that receives the send and receive buffers, so that the caller frees them at
    a known point (gloo's worker thread drops its own reference to them at a time of its
    choosing, which would make the measured peak memory vary from run to run).
    """
    rank, world = require_group(group, "time_to_space")
    forward_only("time_to_space", x, use="temporal_attention_cp(..., method='ring')")
    lead, s, d = x.shape[:-3], x.shape[-2], x.shape[-1]
    s_sizes = shard_sizes(s, world)
    chunks = torch.tensor_split(x, world, dim=-2)
    send = torch.cat([c.reshape(-1) for c in chunks]).to(comm_device(group))
    recv_counts = [lead.numel() * t_sizes[src] * s_sizes[rank] * d for src in range(world)]
    recv = send.new_empty(sum(recv_counts))
    with tracked("all_to_all (time -> space)", group=group):
        dist.all_to_all_single(recv, send, recv_counts, [c.numel() for c in chunks], group=group)
    if keep is not None:
        keep += [send, recv]
    parts = torch.split(recv, recv_counts)
    return torch.cat([p.view(*lead, t_sizes[src], s_sizes[rank], d)
                      for src, p in enumerate(parts)], dim=-3).to(x.device)


def space_to_time(x: torch.Tensor, t_sizes: list[int], s_total: int, group=None) -> torch.Tensor:
    """Inverse of `time_to_space`: `[..., T, S_r, D]` -> `[..., T_r, S, D]`."""
    rank, world = require_group(group, "space_to_time")
    forward_only("space_to_time", x, use="temporal_attention_cp(..., method='ring')")
    lead, d = x.shape[:-3], x.shape[-1]
    s_sizes = shard_sizes(s_total, world)
    chunks = torch.split(x, t_sizes, dim=-3)
    send = torch.cat([c.reshape(-1) for c in chunks]).to(comm_device(group))
    recv_counts = [lead.numel() * t_sizes[rank] * s_sizes[src] * d for src in range(world)]
    recv = send.new_empty(sum(recv_counts))
    with tracked("all_to_all (space -> time)", group=group):
        dist.all_to_all_single(recv, send, recv_counts, [c.numel() for c in chunks], group=group)
    parts = torch.split(recv, recv_counts)
    return torch.cat([p.view(*lead, t_sizes[rank], s_sizes[src], d)
                      for src, p in enumerate(parts)], dim=-2).to(x.device)


def _usp(q, k, v, mesh, kind: str, scale=None):
    """Temporal or full attention of this rank's frames by USP on a `cpcourse.mesh` mesh:
    Ulysses inside its ulysses dim, the ring across its ring dim (`mesh.usp_attention`)."""
    from cpcourse.mesh import usp_attention

    require(hasattr(mesh, "mesh_dim_names"), "method 'usp' takes a cpcourse.mesh.make_mesh(...) "
            "DeviceMesh as its group")
    _check_video(q, k, v)
    b, _, _, s, _ = q.shape
    if kind == "full":
        return usp_attention(*(flatten_video(x) for x in (q, k, v)), mesh, scale=scale).reshape(
            q.shape[:-1] + (v.shape[-1],))
    out = usp_attention(*(positions_to_batch(x) for x in (q, k, v)), mesh, scale=scale)
    return batch_to_positions(out, b, s).contiguous()


def temporal_attention_cp(q, k, v, group=None, method: str = "all_to_all", scale=None):
    """Temporal attention of a T-sharded video: local `[B, H, T_r, S, D]` in, same shape out.

    Equals `frame_shard(temporal_attention(whole q, k, v), rank, P)`. `all_to_all` sends each
    rank's q, k, v once (time -> space) and the output once back; `ring` passes K/V blocks
    around the ring P - 1 times. T < P is fine for both (ranks without frames still take part).
    `usp` takes a `cpcourse.mesh` DeviceMesh as `group`: Ulysses inside it, the ring across.
    """
    if method == "usp":
        return _usp(q, k, v, group, "temporal", scale)
    require(method in TEMPORAL_METHODS,
            f"method must be one of {TEMPORAL_METHODS} (or 'usp' on a mesh), got {method!r}")
    _check_video(q, k, v)
    _, world = require_group(group, "temporal_attention_cp")
    if method != "ring":  # the ring's backward exists; the time <-> space all-to-alls have none
        forward_only("temporal_attention_cp", q, k, v, use="method='ring'")
    agreed = agree(group, seq_dim=2, q=q, k=k, v=v)
    t_sizes = [shape[2] for shape in agreed["q"]]
    b, _, _, s, _ = q.shape
    if method == "ring":
        from cpcourse.ring import ring_attention

        # every rank's frame counts are agreed above: the ring need not agree them again
        out = ring_attention(positions_to_batch(q), positions_to_batch(k), positions_to_batch(v),
                             group=group, scale=scale, lens=[shape[2] for shape in agreed["k"]])
        return batch_to_positions(out, b, s).contiguous()
    require(q.shape[-1] == v.shape[-1], "the all_to_all path needs v's head dim equal to q's")
    buffers: list = []  # held until the attention is done: a fixed, predictable peak
    qkv = time_to_space(torch.stack([q, k, v]), t_sizes, group, keep=buffers)  # [3,B,H,T,S_r,D]
    out = temporal_attention(qkv[0], qkv[1], qkv[2], scale=scale)
    del qkv, buffers
    return space_to_time(out.contiguous(), t_sizes, s, group).contiguous()


# --- full 3D attention --------------------------------------------------------------------------

def full_attention_cp(q, k, v, group=None, method: str = "ring", scale=None):
    """Full 3D attention of a T-sharded video: local `[B, H, T_r, S, D]` in, same shape out.

    The local frames flatten to a contiguous run `[B, H, T_r*S, D]` of the global sequence, so
    the sequence-parallel attention of `cpcourse.ring` or `cpcourse.ulysses` applies as is.
    Equals `frame_shard(full_attention(whole q, k, v), rank, P)`. method "usp" takes a
    `cpcourse.mesh` DeviceMesh as `group` (USP: Ulysses inside its ulysses dim, ring across).
    """
    if method == "usp":
        return _usp(q, k, v, group, "full", scale)
    require(method in FULL_METHODS,
            f"method must be one of {FULL_METHODS} (or 'usp' on a mesh), got {method!r}")
    _check_video(q, k, v)
    require_group(group, "full_attention_cp")
    if method == "ring":
        from cpcourse.ring import ring_attention as attend
    else:
        from cpcourse.ulysses import ulysses_attention as attend
    out = attend(flatten_video(q), flatten_video(k), flatten_video(v), group=group, scale=scale)
    return out.reshape(q.shape[:-1] + (v.shape[-1],))


# --- joint attention with replicated text tokens -------------------------------------------------

def joint_attention(q, k, v, text_q, text_k, text_v, scale=None):
    """One process: video `[B, H, T, S, D]` and text `[B, H, N, D]` attend jointly.

    Returns (video out `[B, H, T, S, D]`, text out `[B, H, N, D]`): softmax over T*S + N keys.
    """
    _check_video(q, k, v)
    _check_text(q, v, text_q, text_k, text_v)
    seq = lambda a, t: torch.cat([flatten_video(a), t], dim=2)  # noqa: E731
    out, _ = attention_with_lse(seq(q, text_q), seq(k, text_k), seq(v, text_v), scale=scale)
    n_video = q.shape[2] * q.shape[3]
    return out[:, :, :n_video].reshape(q.shape[:-1] + (v.shape[-1],)), out[:, :, n_video:]


def joint_attention_cp(q, k, v, text_q, text_k, text_v, group=None, scale=None):
    """Joint video+text attention under a T split, text replicated on every rank.

    Every rank appends the text queries to its own (each rank then computes the text rows in
    full), but only the LAST rank appends the text keys/values to its ring block: the ring shows
    every block to every rank, so text K/V appended everywhere would be counted P times in each
    softmax (silent corruption: sglang#33353 guarded such ring paths). xDiT's
    `joint_strategy="rear"` is the other design: text K/V never enter the ring, each rank
    attends to them locally and merges by lse. Returns (local video out, text out).
    """
    _check_video(q, k, v)
    _check_text(q, v, text_q, text_k, text_v)
    rank, world = require_group(group, "joint_attention_cp")
    from cpcourse.ring import ring_attention

    mine = rank == world - 1
    empty = text_k[:, :, :0]
    kk = torch.cat([flatten_video(k), text_k if mine else empty], dim=2)
    vv = torch.cat([flatten_video(v), text_v if mine else text_v[:, :, :0]], dim=2)
    qq = torch.cat([flatten_video(q), text_q], dim=2)
    out = ring_attention(qq, kk, vv, group=group, scale=scale)
    n_video = q.shape[2] * q.shape[3]
    return out[:, :, :n_video].reshape(q.shape[:-1] + (v.shape[-1],)), out[:, :, n_video:]

