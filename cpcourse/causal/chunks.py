"""The block-causal mask, and who computes what when its chunks are dealt out to P ranks.

    python -m cpcourse.causal.chunks       # the work and ring-traffic table, P = 4, 8 chunks

A streaming video model generates chunks of frames one after another; every token sees its own
chunk and all earlier ones (block-causal). Query chunk i of n_i tokens therefore scores
n_i * (n_0 + ... + n_i) pairs: the later a chunk, the more work. Which chunks a rank holds
decides how evenly that work spreads (`assign_chunks`) and how much of a plain ring's traffic
lands on a rank that cannot use it (`ring_traffic`). Everything here is arithmetic on chunk
sizes; `cpcourse.causal.attention_cp` runs it.
"""

from __future__ import annotations

import heapq
import math

import torch

from cpcourse.support.errors import positive_int, require

SCHEMES = ("contiguous", "zigzag", "striped", "greedy", "balanced")


def chunk_of_frames(frames: int, chunk: int, tokens_per_frame: int) -> torch.Tensor:
    """The chunk index of every token of a video laid out frame-major: long `[L]`,
    L = frames * tokens_per_frame, chunks of `chunk` frames (the last one may be shorter)."""
    frames = positive_int("frames", frames)
    chunk = positive_int("chunk", chunk)
    tokens_per_frame = positive_int("tokens_per_frame", tokens_per_frame)
    return (torch.arange(frames * tokens_per_frame) // tokens_per_frame) // chunk


def block_causal_mask(frames: int, chunk: int, tokens_per_frame: int) -> torch.Tensor:
    """bool `[L, L]`, True where query token i may attend to key token j: chunk(j) <= chunk(i).
    L = frames * tokens_per_frame; chunks of `chunk` frames, the last one shorter when `chunk`
    does not divide `frames`."""
    c = chunk_of_frames(frames, chunk, tokens_per_frame)
    return c[None, :] <= c[:, None]


def chunk_sizes(chunk_of_token) -> list[int]:
    """Tokens per chunk of a layout `chunk_of_token` (long `[L]`: 0, 0, ..., 1, 1, ...): chunks
    numbered from 0 without gaps, in order, each at least one token."""
    c = torch.as_tensor(chunk_of_token)
    require(c.dim() == 1 and c.numel() > 0 and not c.is_floating_point(),
            f"chunk_of_token must be a non-empty 1-d integer tensor [L], got "
            f"{c.dtype} {tuple(c.shape)}")
    steps = c[1:] - c[:-1]
    require(int(c[0]) == 0 and bool(((steps == 0) | (steps == 1)).all()),
            "chunk_of_token must number the chunks 0, 1, 2, ... in token order without gaps "
            "(use chunk_of_frames(frames, chunk, tokens_per_frame))")
    return torch.bincount(c).tolist()


def chunk_work(sizes: list[int]) -> list[int]:
    """Score-matrix area of each query chunk under the block-causal mask: n_i * (n_0 + .. + n_i)."""
    sizes = _sizes(sizes)
    seen, work = 0, []
    for n in sizes:
        seen += n
        work.append(n * seen)
    return work


def _sizes(sizes) -> list[int]:
    """`sizes` as a list of positive whole token counts, or an InputError."""
    sizes = list(sizes)
    require(len(sizes) > 0 and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                   for n in sizes),
            f"sizes must be positive whole token counts, one per chunk, got {sizes}")
    return sizes


def _assignment(assignment, n_chunks: int | None = None) -> list[list[int]]:
    """`assignment` checked: every rank holds at least one chunk, each chunk index whole, in
    range (when `n_chunks` is given) and held by one rank only."""
    assignment = [list(mine) for mine in assignment]
    flat = [j for mine in assignment for j in mine]
    require(len(assignment) > 0 and all(assignment), "assignment must give every rank at "
            f"least one chunk (assign_chunks makes one), got {assignment}")
    require(all(isinstance(j, int) and not isinstance(j, bool) and j >= 0 for j in flat)
            and len(set(flat)) == len(flat), "assignment must hold each chunk index (a whole "
            f"number >= 0) on one rank only, got {assignment}")
    require(n_chunks is None or max(flat) < n_chunks, f"assignment names chunk {max(flat)}, "
            f"but there are only {n_chunks} chunks")
    return assignment


def _segments(n_chunks: int, parts: int) -> list[list[int]]:
    """0..n_chunks-1 cut into `parts` contiguous runs, longer ones first (torch.tensor_split)."""
    return [t.tolist() for t in torch.arange(n_chunks).tensor_split(parts)]


def _greedy(work: list[int], world: int) -> list[list[int]]:
    """Largest remaining work to the least-loaded rank (ties: the lower rank)."""
    owners: list[list[int]] = [[] for _ in range(world)]
    heap = [(0, r) for r in range(world)]
    for i in sorted(range(len(work)), key=lambda i: (-work[i], i)):
        load, r = heapq.heappop(heap)
        owners[r].append(i)
        heapq.heappush(heap, (load + work[i], r))
    return [sorted(o) for o in owners]


def _balanced(work: list[int], world: int) -> list[list[int]]:
    """`_greedy` under a count limit: rank r holds as many chunks as `torch.tensor_split` would
    give it. With chunks of equal size (MagiAttention dispatches equal chunks) that keeps the
    tokens, so the linear layers, activations and cache, even while the attention work is
    evened out as far as the limit allows."""
    room = [len(t) for t in torch.arange(len(work)).tensor_split(world)]
    owners: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(work)), key=lambda i: (-work[i], i)):
        # least loaded; on a tie the rank with fewer places left (it gets fewer cheap chunks)
        r = min((r for r in range(world) if len(owners[r]) < room[r]),
                key=lambda r: (load[r], room[r] - len(owners[r]), r))
        owners[r].append(i)
        load[r] += work[i]
    return [sorted(o) for o in owners]


def assign_chunks(n_chunks: int, world: int, scheme: str,
                  sizes: list[int] | None = None) -> list[list[int]]:
    """The chunks each of `world` ranks holds (ascending), under `scheme`:
    "contiguous" (runs of neighbours), "zigzag" (segments r and 2P-1-r of 2P runs), "striped"
    (chunk i to rank i mod P), "greedy" (largest remaining work to the least-loaded rank, work
    from `sizes`, tokens per chunk, default all equal: balances attention only, a rank may hold
    many more chunks than another), "balanced" (greedy, but rank r holds as many chunks as
    `torch.tensor_split` gives it, as MagiAttention's dispatch solver keeps equal chunk counts
    so that linear layers and memory stay even). Every rank gets at least one chunk."""
    n_chunks = positive_int("n_chunks", n_chunks)
    world = positive_int("world", world)
    require(scheme in SCHEMES, f"scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    require(world <= n_chunks,
            f"world {world} is larger than the {n_chunks} chunks: every rank needs a chunk; use "
            f"at most {n_chunks} ranks, or smaller chunks (more of them)")
    sizes = [1] * n_chunks if sizes is None else list(sizes)
    require(len(sizes) == n_chunks and all(n > 0 for n in sizes),
            f"sizes must give {n_chunks} positive token counts, got {sizes}")
    if scheme == "contiguous":
        return _segments(n_chunks, world)
    if scheme == "zigzag":
        seg = _segments(n_chunks, 2 * world)
        return [seg[r] + seg[2 * world - 1 - r] for r in range(world)]
    if scheme == "striped":
        return [list(range(r, n_chunks, world)) for r in range(world)]
    if scheme == "balanced":
        return _balanced(chunk_work(sizes), world)
    return _greedy(chunk_work(sizes), world)


def rank_work(assignment: list[list[int]], sizes: list[int]) -> list[int]:
    """Score-matrix area each rank computes: the work of its query chunks."""
    work = chunk_work(sizes)
    assignment = _assignment(assignment, len(work))
    return [sum(work[i] for i in mine) for mine in assignment]


def imbalance(per_rank: list[int]) -> float:
    """max / mean: the slowest rank's time over the time a perfect split would take."""
    per_rank = list(per_rank)
    require(len(per_rank) > 0 and all(isinstance(w, int | float) and not isinstance(w, bool)
                                      and 0 <= w < math.inf for w in per_rank)
            and 0 < sum(per_rank) < math.inf,
            f"per_rank must be the work of each rank (finite numbers >= 0, not all 0), got "
            f"{per_rank}")
    return max(per_rank) * len(per_rank) / sum(per_rank)


def ring_traffic(assignment: list[list[int]], sizes: list[int]) -> list[dict]:
    """K/V tokens each rank receives in a ring that passes every block to every rank:
    {"useful": tokens of other ranks' chunks it attends to, "wasted": the rest}. A chunk j is
    useful to a rank iff j <= its last chunk. Multiply by 2 * B * H * D * element size for bytes."""
    sizes = _sizes(sizes)
    assignment = _assignment(assignment, len(sizes))
    out = []
    for r, mine in enumerate(assignment):
        last = max(mine)
        other = [j for s, theirs in enumerate(assignment) if s != r for j in theirs]
        useful = sum(sizes[j] for j in other if j <= last)
        out.append({"useful": useful, "wasted": sum(sizes[j] for j in other) - useful})
    return out


def wasted_fraction(traffic: list[dict]) -> float:
    """The share of all ring traffic that arrives where it is not needed."""
    wasted = sum(t["wasted"] for t in traffic)
    return wasted / max(1, wasted + sum(t["useful"] for t in traffic))


def rank_tokens(chunk_of_token, assignment: list[list[int]], rank: int) -> torch.Tensor:
    """Positions (long `[L_r]`, ascending) of the tokens of `rank`'s chunks in the whole layout."""
    c = torch.as_tensor(chunk_of_token)
    n_chunks = len(chunk_sizes(c))
    assignment = _assignment(assignment, n_chunks)
    require(isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < len(assignment),
            f"rank must be in [0, {len(assignment)}) (the ranks of the assignment), got {rank!r}")
    return torch.isin(c, torch.tensor(assignment[rank], dtype=c.dtype)).nonzero().flatten()


def _demo() -> None:
    sizes = [1] * 8
    print(f"{'scheme':>10}  work per rank (chunk^2)  max/mean  ring wasted")
    for scheme in SCHEMES:
        a = assign_chunks(8, 4, scheme, sizes)
        work = rank_work(a, sizes)
        print(f"{scheme:>10}  {str(work):>23}  {imbalance(work):8.2f}  "
              f"{wasted_fraction(ring_traffic(a, sizes)):10.0%}")


if __name__ == "__main__":
    _demo()
