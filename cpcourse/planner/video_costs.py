"""The cost model of video CP: bytes each rank sends, per method, predicted from shapes alone.

    python -c "from cpcourse.planner.video_costs import *; print(video_bytes_table(1, 8, 16, 3600,
    64, 4))"

Every function returns the bytes that rank `rank` of `world` puts on the wire (its own slot of a
collective stays home and is not counted), for one attention call on a video `[B, H, T, S, D]`
whose frames are split like `torch.tensor_split(T, world)` and positions like
`tensor_split(S, world)`. `cpcourse.support.bytecount.count_bytes()` measures the same quantity
at the torch.distributed calls, and the tests require equality, not closeness.

Why all-to-all wins for factored models: the ring moves every K/V block to every rank
(about 2 * (P-1)/P of the whole video's K and V per rank), while the all-to-all moves each of
q, k, v and the output once, and only the (P-1)/P of it that belongs elsewhere.
"""

from __future__ import annotations

from cpcourse.support.errors import positive_int, require
from cpcourse.support.shards import shard_sizes


def _check(rank: int, world: int) -> None:
    positive_int("world", world)
    require(0 <= rank < world, f"rank must be in [0, {world}), got {rank}")


def temporal_all_to_all_bytes(b, h, t, s, d, world, rank, elem_bytes=4) -> int:
    """q, k, v go time split -> space split (3 tensors), the output comes back (1 tensor).

    Rank r sends q/k/v rows [T_r, S_j] to every j != r, then output rows [T_i, S_r] to every
    i != r: `(3 * T_r * (S - S_r) + (T - T_r) * S_r) * B * H * D * bytes`.
    """
    _check(rank, world)
    t_r, s_r = shard_sizes(t, world)[rank], shard_sizes(s, world)[rank]
    return (3 * t_r * (s - s_r) + (t - t_r) * s_r) * b * h * d * elem_bytes


def ring_bytes(block_tokens: list[int], rank: int, batch_heads_dim: int, elem_bytes=4) -> int:
    """A ring of P ranks: P - 1 hops; at hop i rank r forwards the K and V block that started on
    rank (r - i) mod P. `block_tokens[j]` is the sequence length of rank j's block."""
    world = len(block_tokens)
    _check(rank, world)
    hops = sum(block_tokens[(rank - i) % world] for i in range(world - 1))
    return 2 * hops * batch_heads_dim * elem_bytes


def temporal_ring_bytes(b, h, t, s, d, world, rank, elem_bytes=4) -> int:
    """The ring over T with the S positions in the batch: blocks of T_j frames, batch B*S."""
    return ring_bytes(shard_sizes(t, world), rank, b * s * h * d, elem_bytes)


def full_ring_bytes(b, h, t, s, d, world, rank, elem_bytes=4) -> int:
    """The ring over all T*S tokens: blocks of T_j * S tokens, batch B."""
    return ring_bytes([n * s for n in shard_sizes(t, world)], rank, b * h * d, elem_bytes)


def full_ulysses_bytes(b, h, t, s, d, world, rank, elem_bytes=4) -> int:
    """Ulysses: q, k, v sequence split -> head split (3 tensors), output back (1 tensor).

    Rank r holds L_r = T_r * S tokens and, after the all-to-all, heads H_r (H split like
    tensor_split): `(3 * L_r * (H - H_r) + (L - L_r) * H_r) * B * D * bytes`.
    """
    _check(rank, world)
    l_r, h_r = shard_sizes(t, world)[rank] * s, shard_sizes(h, world)[rank]
    return (3 * l_r * (h - h_r) + (t * s - l_r) * h_r) * b * d * elem_bytes


def gather_frames_bytes(b, h, t, s, d, world, rank, elem_bytes=4) -> int:
    """`gather_frames`: each rank sends its frames, padded to the largest shard, to P - 1 ranks."""
    _check(rank, world)
    return (world - 1) * max(shard_sizes(t, world)) * s * b * h * d * elem_bytes


PREDICTORS = {
    ("temporal", "all_to_all"): temporal_all_to_all_bytes,
    ("temporal", "ring"): temporal_ring_bytes,
    ("full", "ring"): full_ring_bytes,
    ("full", "ulysses"): full_ulysses_bytes,
    ("gather", "all_gather"): gather_frames_bytes,
}


def predicted_bytes(kind: str, method: str, shape, world, rank, elem_bytes=4) -> int:
    """Bytes rank `rank` sends for one call of `kind` ("temporal", "full", "gather") by `method`
    on q, k, v of `shape` (b, h, t, s, d): `[B, H, T, S, D]`, T frames of S tokens each."""
    fn = PREDICTORS.get((kind, method))
    require(fn is not None, f"no cost model for {kind!r} by {method!r}: use one of "
            f"{sorted(PREDICTORS)}")
    return fn(*shape, world, rank, elem_bytes)


def video_bytes_table(b, h, t, s, d, world, elem_bytes=4) -> list[dict]:
    """One row per method: bytes sent by the busiest rank and in total over all ranks."""
    rows = []
    for (kind, method), fn in PREDICTORS.items():
        if kind == "gather":
            continue
        per_rank = [fn(b, h, t, s, d, world, r, elem_bytes) for r in range(world)]
        rows.append({"attention": kind, "method": method, "max_rank_bytes": max(per_rank),
                     "total_bytes": sum(per_rank)})
    return rows
