"""Joined text in a ring, simulated: where its keys enter a softmax, and what travels.

    python -m cpcourse.models.text_ring      # both placements on 3 virtual ranks

Text joined into self-attention (HunyuanVideo, CogVideoX) is replicated on every rank, and the
ring must show every query each text key exactly once. Two placements do:

    "course"  the last rank's block carries the text keys around the ring (what
              `cpcourse.models.attention` does on real processes): the text travels P - 1 hops
    "rear"    xDiT's `joint_strategy="rear"` (`xfuser/core/long_ctx_attention/ring/
              ring_flash_attn.py`): every rank appends its own copy of the text to the block it
              holds at the last ring step; no text byte crosses a link

`text_ring(q, k, v, text, world, rule, strategy)` runs P virtual ranks in one process. At each
step every rank asks `rule(held_k, held_v, text_k, text_v, rank, step, world, strategy)` for the
keys its queries attend to and for the block it passes on (exercise 08.3 writes the rule), and
the result records the output and the bytes each rank sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.attention import attention_with_lse, merge_attention
from cpcourse.support.errors import positive_int, require

STRATEGIES = ("course", "rear")


@dataclass(frozen=True)
class TextRing:
    """What a simulated joined-text ring produced.

    out `[B, H, L, D]`: the video rows, in token order; text_out: each rank's text rows
    `[B, H, N, D]` (every rank computes them in full); keys_met: per rank, the keys its queries
    met over all steps (L + N when each key counts once); sent: bytes each rank passed on;
    largest_hop: the most keys in one passed block.
    """

    out: torch.Tensor
    text_out: list[torch.Tensor]
    keys_met: list[int]
    sent: list[int]
    largest_hop: int


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def text_ring(q, k, v, text, world: int, rule, strategy: str) -> TextRing:
    """Ring attention of video q, k, v `[B, H, L, D]` (the whole sequence, split like
    `torch.tensor_split` over `world` virtual ranks) with the text (tq, tk, tv), each
    `[B, H, N, D]`, joined in: every rank's queries are its video shard followed by all N text
    queries, and `rule` decides where the text keys enter.
    """
    world = positive_int("world", world)
    require(strategy in STRATEGIES, f"strategy must be one of {', '.join(STRATEGIES)}, got "
            f"{strategy!r}")
    tq, tk, tv = text
    qs = [torch.cat([qr, tq], dim=2) for qr in torch.tensor_split(q, world, dim=2)]
    held = list(zip(torch.tensor_split(k, world, dim=2), torch.tensor_split(v, world, dim=2),
                    strict=True))
    acc: list = [None] * world
    met, sent, hop = [0] * world, [0] * world, 0
    for step in range(world):
        passed = []
        for rank in range(world):
            (ak, av), send = rule(*held[rank], tk, tv, rank, step, world, strategy)
            o, lse = attention_with_lse(qs[rank], ak, av)
            acc[rank] = (o, lse) if acc[rank] is None else merge_attention(*acc[rank], o, lse)
            met[rank] += ak.shape[2]
            passed.append(send)
        if step == world - 1:
            break  # the last block is used, not passed on
        for rank, (sk, sv) in enumerate(passed):
            sent[rank] += _nbytes(sk, sv)
            hop = max(hop, sk.shape[2])
        held = [passed[(rank - 1) % world] for rank in range(world)]
    n = tq.shape[2]
    out = torch.cat([o[:, :, :o.shape[2] - n].to(q.dtype) for o, _ in acc], dim=2)
    return TextRing(out, [o[:, :, o.shape[2] - n:].to(q.dtype) for o, _ in acc], met, sent, hop)


def every_rank_appends(held_k, held_v, text_k, text_v, rank, step, world, strategy):
    """The rule that miscounts: every rank appends the text to its own block, which travels, so
    each query meets every text key P times (notebook 06's bug, on a real model in notebook 08)."""
    if step == 0:
        held_k, held_v = torch.cat([held_k, text_k], dim=2), torch.cat([held_v, text_v], dim=2)
    return (held_k, held_v), (held_k, held_v)


def _demo() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g, dtype=torch.float64) for _ in range(3))
    text = tuple(torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    r = text_ring(q, k, v, text, 3, every_rank_appends, "course")
    want = attention_with_lse(*(torch.cat([x, t], dim=2)
                                for x, t in zip((q, k, v), text, strict=True)))[0]
    print(f"every rank appends: keys met per rank {r.keys_met} (12 video + 5 text keys exist), "
          f"bytes sent {sum(r.sent):,}, largest hop {r.largest_hop} keys, "
          f"max error {float((r.out - want[:, :, :12]).abs().max()):.2f}")


if __name__ == "__main__":
    _demo()
