"""The ring's shape agreement: every rank learns every rank's K/V length, or all fail together.

    python -m pytest tests/dist/test_ring.py -q -k "remembered or mismatch"

Ring attention needs each rank's K/V shard length before the first hop (a receive buffer must fit
the block), and ranks that pass tensors that do not fit together must all raise the same
InputError rather than hang in a transfer. `agree_kv_lens` is the one entry point: it returns every
rank's K/V length in one of three ways, cheapest first:

- the caller passed them (`lens`, a model's CP hooks know them): checked locally, no transfer;
- this group has agreed the same shapes twice in a row (`confirmed`): the ring runs on that
  remembered agreement, and each of its messages carries one more element, its sender's
  "my shapes changed" flag. The ring reports whether any flag was up; if so, the caller agrees
  again (below) and reruns, so a rank that changes shape alone still gets the clear error;
- otherwise: one all-gather of every rank's shapes and dtypes (`cpcourse.support.groups.agree`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpcourse.support.errors import require
from cpcourse.support.groups import agree

# A group's first AGREED_CALLS ring calls of one shape agree (the second confirms the first);
# later ones carry the flag. `cpcourse.tinydit.costs` counts the flag bytes from this.
AGREED_CALLS = 2


@dataclass
class Agreement:
    """A group's last shape agreement. Every field is the same on every rank of the group
    except `sig` (this rank's own), because each is set only from what all ranks saw."""
    sig: tuple          # this rank's q, k, v dtypes and shapes (q's length left out)
    shapes: dict        # every rank's shapes, as `agree` returned them
    kv_lens: list[int]
    spec: tuple         # B, H, D and dtype of every K/V block
    confirmed: bool     # the agreement before this one found the same shapes and dtype

    def changed(self, q, k, v) -> bool:
        """This rank's inputs differ from the ones it agreed on (its flag to the others)."""
        return signature(q, k, v) != self.sig


# group -> Agreement. Weak keys: a destroyed group's entry (and its sockets) goes with it, and a
# ProcessGroup hashes by identity, so a new group never finds an old group's agreement.
AGREED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def signature(q, k, v) -> tuple:
    """What must not change for a remembered agreement to hold (q's length may change)."""
    return (q.dtype, k.dtype, v.dtype, tuple(q.shape[:2]) + tuple(q.shape[3:]), q.dim(),
            tuple(k.shape), tuple(v.shape))


def check_agreed(q, k, v, shapes: dict) -> list[int]:
    """Checks that give the same answer on every rank (after `agree`); returns K/V lengths.

    q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`; `shapes` holds every rank's k and v shapes.
    """
    require(q.dim() == 4, f"q, k, v must be [B, H, L, D] shards, got q of shape {tuple(q.shape)}")
    require(k.dtype == q.dtype and v.dtype == q.dtype and q.dtype.is_floating_point,
            f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    require(q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3],
            f"q and k must share B, H and D: got {tuple(q.shape)} and {tuple(k.shape)}")
    kv_lens = [s[2] for s in shapes["k"]]
    require(kv_lens == [s[2] for s in shapes["v"]] and k.shape[3] == v.shape[3],
            f"k and v must have the same shape on every rank: k lengths {kv_lens}, v lengths "
            f"{[s[2] for s in shapes['v']]}, head dims {k.shape[3]} and {v.shape[3]}")
    return kv_lens


def _check_known(q, k, v, lens, rank: int, world: int) -> list[int]:
    """The same checks as after `agree`, when the caller passed every rank's K/V lengths."""
    require(isinstance(lens, (list, tuple)) and len(lens) == world and all(
        isinstance(n, int) and n >= 0 for n in lens), f"lens must list {world} shard lengths "
        f"(one per rank of the group), got {lens!r}")
    require(k.dim() == 4 and v.dim() == 4 and k.shape[2] == v.shape[2] == lens[rank],
            f"lens[{rank}] = {lens[rank]}, but this rank's k and v have shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}")
    shapes = {x: [tuple(t.shape[:2]) + (n, t.shape[3]) for n in lens]
              for x, t in (("k", k), ("v", v))}
    return check_agreed(q, k, v, shapes)


def _agree(q, k, v, group) -> list[int]:
    """Agree shapes with every rank (one all-gather), check them, remember the agreement."""
    shapes = agree(group, q=q, k=k, v=v)
    kv_lens = check_agreed(q, k, v, shapes)
    key = group if group is not None else dist.group.WORLD
    last, spec = AGREED.get(key), (*k.shape[:2], k.shape[3], k.dtype)
    AGREED[key] = Agreement(signature(q, k, v), shapes, kv_lens, spec, confirmed=(
        last is not None and last.shapes == shapes and last.spec == spec))
    return kv_lens


def remembered(group) -> Agreement | None:
    """The group's confirmed agreement, which a ring may run on with flagged messages, or None."""
    last = AGREED.get(group if group is not None else dist.group.WORLD)
    return last if last is not None and last.confirmed else None


def agree_kv_lens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, rank: int,
                  world: int, lens: list[int] | None = None) -> list[int]:
    """Every rank's K/V shard length, checked the same way on every rank.

    From `lens` when the caller knows them (no transfer: a caller that passes wrong lens on one
    rank gets a timeout, not this module's clear error), from the shapes themselves when the
    group has one rank, else by agreeing (one all-gather). Raises InputError on every rank alike.
    """
    if lens is not None:
        return _check_known(q, k, v, lens, rank, world)
    if world == 1:
        return check_agreed(q, k, v, {"k": [tuple(k.shape)], "v": [tuple(v.shape)]})
    return _agree(q, k, v, group)
