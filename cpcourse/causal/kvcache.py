"""The KV cache of a streaming model under CP: three designs, all exact, different traffic.

    python -m pytest tests/dist/test_causal_cp.py -q

A streaming model makes chunk after chunk; each new chunk (n tokens, split over the P ranks in
`torch.tensor_split` order) attends to itself and to every cached token of the h earlier chunks,
then joins the cache. Where the cache lives decides what travels per new chunk:

    "ulysses"   head-sharded: an all-to-all gives each rank the whole new chunk for H/P heads;
                its cache holds every token for those heads, so attention is local. The new
                chunk's q, k, v and the output travel; the cache never does (MAGI-1, FastVideo).
                Needs P to divide H.
    "pass-q"    sequence-sharded: each rank caches its own shard of every chunk, all heads. The
                new queries go to every rank (an all-gather, padded to the longest shard as gloo
                needs), each returns a partial output and its lse for every query (all-to-all,
                float32), merged with `merge_attention`. Flat in h too.
    "pass-kv"   sequence-sharded, the cache goes round the course's ring (`ring_attention`):
                every rank's cache shard visits every rank, so the bytes grow with h.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.attention import accumulator_dtype, attention_with_lse, merge_attention
from cpcourse.ring import ring_attention
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.groups import agree, forward_only, gather_uneven, require_group, tracked
from cpcourse.ulysses import heads_to_seq, seq_to_heads

DESIGNS = ("ulysses", "pass-q", "pass-kv")


def check_design(design: str, heads: int, world: int) -> None:
    """Raise an InputError unless `design` can run `heads` heads on `world` ranks."""
    require(design in DESIGNS, f"design must be one of {', '.join(DESIGNS)}, got {design!r}")
    heads, world = positive_int("heads", heads), positive_int("world", world)
    if design == "ulysses" and heads % world:
        works = [p for p in range(1, heads + 1) if heads % p == 0]
        raise InputError(
            f"the ulysses cache splits the {heads} heads over {world} ranks, so the world size "
            f"must divide the head count (sizes that work: {', '.join(map(str, works))}); "
            "pass-q and pass-kv have no such limit")


class KVCacheCP:
    """One rank's side of a KV cache under CP. Per new chunk: `append(k, v)`, then `attend(q)`
    (and `drop_last()` when the chunk was a draft, not context for later chunks).

    k, v, q `[B, H, n_r, D]`: this rank's `tensor_split` shard of the new chunk (every rank passes
    the same B, H, D; n may change from chunk to chunk). `attend` returns out `[B, H, n_r, D]` in
    q's dtype: the new chunk's queries over every cached token, the new chunk's own included
    (block-causal). `cache_bytes` is the K/V this rank holds: `[2, B, H/P, T, D]` under
    "ulysses", `[2, B, H, T_r, D]` (T_r: its shards of every chunk) otherwise. `transient_bytes`
    is the working set the last `attend` added beside the cache: ulysses the head-sharded q and
    its output `[B, H/P, n, D]`; pass-q the gathered queries `[B, H, n, D]`, its partials and
    the partials received `[B, H, n(_r), D + 1]`; pass-kv the ring's two receive buffers, each
    the largest cache shard. Must be used by every rank of `group` in step.
    """

    def __init__(self, design: str, group=None, scale=None):
        self.rank, self.world = require_group(group, "KVCacheCP")
        require(design in DESIGNS, f"design must be one of {', '.join(DESIGNS)}, got {design!r}")
        self.design, self.group, self.scale = design, group, scale
        self.k = self.v = None
        self.lens: list[list[int]] = []  # per chunk: every rank's tokens of it
        self.transient_bytes = 0

    @property
    def cache_bytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()

    def _agree(self, what: str, **tensors) -> list[int]:
        shapes = agree(self.group, **tensors)
        first = next(iter(shapes.values()))
        require(all(len(s) == 4 for s in first) and all(
                    t.shape == next(iter(tensors.values())).shape for t in tensors.values()),
                f"{what} takes [B, H, n_r, D] tensors of one shape, got "
                f"{[tuple(t.shape) for t in tensors.values()]}")
        check_design(self.design, first[0][1], self.world)
        return [s[2] for s in first]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add this rank's shard of the new chunk's keys and values to the cache."""
        forward_only("KVCacheCP.append", k, v)
        lens = self._agree("KVCacheCP.append", k=k, v=v)
        if self.design == "ulysses":
            k, v = seq_to_heads(torch.stack([k, v]), lens, self.group, "new k, v")
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        self.lens.append(lens)

    def drop_last(self) -> None:
        """Forget the chunk appended last: a denoising step's noisy k, v are attended once, then
        dropped; only the finished chunk's stay as context (`cpcourse.tinydit.streaming`)."""
        require(bool(self.lens), "KVCacheCP.drop_last: nothing appended")
        last = self.lens.pop()
        keep = self.k.shape[2] - (sum(last) if self.design == "ulysses" else last[self.rank])
        self.k, self.v = self.k[:, :, :keep], self.v[:, :, :keep]

    def attend(self, q: torch.Tensor) -> torch.Tensor:
        """The new chunk's queries (this rank's shard) over the whole cache."""
        forward_only("KVCacheCP.attend", q)
        require(bool(self.lens), "KVCacheCP.attend: append the new chunk's k, v first")
        lens = self._agree("KVCacheCP.attend", q=q)
        require(lens == self.lens[-1],
                f"KVCacheCP.attend: q must be the shards of the chunk appended last, "
                f"{self.lens[-1]} tokens per rank, got {lens}")
        if self.design == "ulysses":
            (qh,) = seq_to_heads(q.unsqueeze(0), lens, self.group, "new q")
            out, _ = attention_with_lse(qh, self.k, self.v, scale=self.scale)
            self.transient_bytes = 2 * qh.numel() * qh.element_size()  # qh and its output
            return heads_to_seq(out, lens, self.rank, self.group)
        if self.design == "pass-q":
            return self._pass_q(q, lens)
        cached = [sum(chunk[r] for chunk in self.lens) for r in range(self.world)]
        # the ring's two receive buffers, each as big as the largest cache shard
        b, h, _, d = self.k.shape
        self.transient_bytes = 2 * max(cached) * 2 * b * h * d * self.k.element_size()
        return ring_attention(q, self.k, self.v, group=self.group, scale=self.scale, lens=cached)

    def _pass_q(self, q: torch.Tensor, lens: list[int]) -> torch.Tensor:
        """All queries to every rank's cache shard; partial (out, lse) back to their owners."""
        q_all = gather_uneven(q, lens, dim=2, group=self.group, what="new q to the cache")
        out, lse = attention_with_lse(q_all, self.k, self.v, scale=self.scale)
        acc = accumulator_dtype(q.dtype)
        part = torch.cat([out.to(acc), lse.to(acc).unsqueeze(-1)], dim=-1)  # [B, H, n, D + 1]
        send = part.permute(2, 0, 1, 3).contiguous()  # token-major: rank d gets its rows
        row = send[0].numel()
        recv = send.new_empty(self.world * lens[self.rank] * row)
        if self.world > 1:
            with tracked("all_to_all_single (partial out, lse to the queries' owners)",
                         group=self.group):
                dist.all_to_all_single(recv, send.view(-1),
                                       output_split_sizes=[lens[self.rank] * row] * self.world,
                                       input_split_sizes=[n * row for n in lens],
                                       group=self.group)
        else:
            recv = send.view(-1)
        parts = recv.view(self.world, lens[self.rank], *send.shape[1:]).permute(0, 2, 3, 1, 4)
        o, l_ = parts[0, ..., :-1], parts[0, ..., -1]
        for p in parts[1:]:
            o, l_ = merge_attention(o, l_, p[..., :-1], p[..., -1])
        self.transient_bytes = sum(t.numel() * t.element_size() for t in (q_all, part, recv))
        return o.to(q.dtype)
