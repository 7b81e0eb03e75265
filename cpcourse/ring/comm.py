"""One rank's side of the ring: its peers, two K/V buffers used in turn, the hop in flight.

    python -m pytest tests/dist/test_ring.py -q      # the ring, on 1-4 local processes

`RingComm` is what `cpcourse.ring` (forward), `cpcourse.ring.backward` and the block-causal
ring (`cpcourse.causal.attention_cp`) share: the packing of K/V `[2, B, H, L_r, D]` into one
message, the isend/irecv of each hop and the "my shapes changed" flag. `RingCall` is one
`ring_attention` call's settings, checked before any transfer, and `gather_kv` the all-gather
mode's one collective.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpcourse.support.groups import all_gather_single, global_rank, tracked


@dataclass(frozen=True)
class RingCall:
    """One `ring_attention` call's settings, the same on every rank (see its docstring):
    the group and this rank's place in it, the softmax scale (None: 1/sqrt(D)), the mode, the
    per-step `stats` list (or None) and every rank's K/V length when the caller knows them."""

    group: object
    rank: int
    world: int
    scale: float | None
    mode: str
    stats: list | None = None
    lens: list[int] | None = None


class RingComm:
    """One rank's side of the ring: its peers, two K/V buffers used in turn, the hop in flight.

    K and V travel packed `[2, B, H, L, D]` so each hop is one message. Step s receives into
    buffer s % 2 while it computes on the other; the local block starts in buffer 1 and its send
    completes before step 1 reuses it, so a rank holds two K/V blocks, never P of them.
    `spec` is every block's (B, H, D, dtype). With `flagged`, each message carries one more
    element: its owner's "my shapes changed" flag (`cpcourse.support.agreement`); every block
    passes every rank, so after the last hop every rank has seen every flag.
    """

    def __init__(self, group, rank: int, world: int, kv_lens: list[int], spec: tuple,
                 device, flagged: bool = False, parts: int = 2):
        self.group, self.rank, self.world, self.kv_lens = group, rank, world, kv_lens
        # the backward's blocks are [K, V, dK, dV] (parts=4) and take one more hop: home
        self.hops = world - 1 if parts == 2 else world
        self.dst = global_rank(group, (rank + 1) % world)
        self.src = global_rank(group, (rank - 1) % world)
        b, h, d, dtype = spec
        self.row, self.flagged = parts * b * h * d, int(flagged)  # per token; flag slot
        self.shape = (parts, b, h, -1, d)
        size = self.row * max(kv_lens) + self.flagged  # [parts * B * H * max L_r * D + flag]
        self.bufs = [torch.empty(size, dtype=dtype, device=device) for _ in range(2)]
        self.reqs, self.seen = [], None

    def _view(self, buf: torch.Tensor, n: int):  # (K/V block, its message, its flag slot)
        m = self.row * n
        # flat [parts * B * H * n * D] -> [parts, B, H, n, D]
        return buf[:m].view(self.shape), buf[:m + self.flagged], buf[m:m + self.flagged]

    def load(self, k: torch.Tensor, v: torch.Tensor, stale: bool = False) -> torch.Tensor:
        """Pack this rank's own K/V as the first block; a stale rank sends zeros, flagged."""
        kv, self.msg, flag = self._view(self.bufs[1], self.kv_lens[self.rank])
        if stale:  # its K/V may not even fit the agreed shape
            kv.zero_()
        else:
            kv[0].copy_(k)  # [B, H, L_r, D] into [2, B, H, L_r, D]
            kv[1].copy_(v)
        if self.flagged:
            flag.fill_(float(stale))
            self.seen = flag.to(torch.float32, copy=True)  # a copy: the buffer is reused
        return kv

    def next_block(self, step: int) -> torch.Tensor | None:
        """The buffer for the block step + 1 computes on (rank - step - 1's); None at the end."""
        if step >= self.hops:
            return None
        n = self.kv_lens[(self.rank - step - 1) % self.world]
        self.nxt, self.nmsg, self.nflag = self._view(self.bufs[step % 2], n)
        return self.nxt

    def exchange(self, step: int) -> None:
        """Start sending the current block to rank + 1 and receiving the next from rank - 1.
        Empty blocks are skipped on both sides (both know every shard length)."""
        ops = [dist.P2POp(op, t, peer, self.group) for op, t, peer in (
            (dist.isend, self.msg, self.dst), (dist.irecv, self.nmsg, self.src)) if t.numel()]
        if ops:
            with tracked("batch_isend_irecv", group=self.group, ring_step=step,
                         send_to=self.dst, recv_from=self.src):
                self.reqs = dist.batch_isend_irecv(ops)

    def wait(self, step: int) -> None:
        if self.reqs:
            with tracked("wait for K/V block", ring_step=step, send_to=self.dst,
                         recv_from=self.src):
                for req in self.reqs:
                    req.wait()
        self.reqs = []

    def advance(self) -> torch.Tensor:
        """The received block becomes the current one (its flag read before it is reused)."""
        if self.flagged:
            self.seen += self.nflag.float()
        self.msg = self.nmsg
        return self.nxt

    def flag_raised(self) -> bool:
        return bool(self.seen.item()) if self.flagged else False


def gather_kv(k: torch.Tensor, v: torch.Tensor, kv_lens: list[int], group) -> tuple:
    """The whole K/V `[2, B, H, L, D]` on every rank, by one all-gather padded to the longest
    shard (gloo cannot gather uneven sizes); and the bytes this rank sent."""
    world = len(kv_lens)
    b, h, _, d = k.shape
    padded = k.new_zeros(2, b, h, max(kv_lens), d)  # [2, B, H, max L_r, D]
    padded[0, :, :, : k.shape[2]] = k
    padded[1, :, :, : v.shape[2]] = v
    gathered = k.new_empty(world, *padded.shape)  # [P, 2, B, H, max L_r, D]
    with tracked("all_gather (K/V)", group=group):
        all_gather_single(gathered, padded, group=group)
    # drop each rank's padding: [2, B, H, L, D]
    full = torch.cat([gathered[r, :, :, :, : kv_lens[r]] for r in range(world)], dim=3)
    return full, (world - 1) * padded.numel() * padded.element_size()
