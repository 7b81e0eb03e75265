"""Gradients of ring attention (every mode) and Ulysses on real gloo processes, P = 2, 3, 4.

    python -m pytest tests/dist/test_cp_backward.py -q

One launch per world size: inside the ranks, random shapes drawn from one seed (odd lengths,
uneven shards, lengths below P so a rank may hold no token, float32 and float64) go through
every method with q, k, v requiring grad; each rank's dq, dk, dv of its own shards are compared
with the shards of one process's float64 autograd through softmax(q k^T / sqrt(D)) v, with a random
upstream gradient. A planted bug (the first ring step's K/V reused by every step of the
backward, diffusers #14265) must fail the same check. The ranks return numbers; the assertions
happen here so a failure names the case.
"""

import random

import pytest
import torch

from cpcourse.launch import launch
from cpcourse.support.tolerance import tolerance

pytestmark = pytest.mark.dist

# max |grad - float64 autograd| / max(1, max |float64 grad|) <= the course's one rule,
# `tolerance("ring", dtype)` (1e-5 fp32, 1e-12 fp64) for every method: each gradient is a sum of
# partial products taken in another order than one process's, as a merge is. Measured worst over
# these shapes at P = 2..4: 6.4e-7 (fp32, ring and Ulysses alike), 1.7e-15 (fp64).
TOL = {dtype: tolerance("ring", dtype) for dtype in ("float32", "float64")}
BUG_MIN = 1e-2  # the planted bug's error: the research file's bar for "caught"
METHODS = ("overlap", "blocking", "allgather", "ulysses")


def _cases(world: int, seed: int) -> list[tuple]:
    """(name, B, H, Lq, Lk, D, dtype, seed): seeded random shapes, drawn the same on every rank."""
    rng = random.Random(seed)
    cases = [("below_world", 1, world, world - 1, world - 1, 8, "float64", 1),
             ("cross", 1, 2, 2 * world + 1, 3 * world + 2, 8, "float32", 2)]
    for i in range(4):
        length = rng.randint(world, 12 * world + 3)
        cases.append((f"random{i}", rng.randint(1, 2), rng.choice([world, 2 * world, 3]),
                      length, length, rng.choice([4, 8, 16]), rng.choice(["float32", "float64"]),
                      100 * seed + i))
    return cases


def _whole(b, h, lq, lk, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64)
            for shape in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d), (b, h, lq, d))]


def _reference_grads(q, k, v, dout):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    (torch.softmax(scores, dim=-1) @ v).backward(dout)  # plain float64 autograd, one process
    return q.grad, k.grad, v.grad


def _cp_grads(method, q, k, v, dout):
    from cpcourse.ring import ring_attention
    from cpcourse.ulysses import ulysses_attention

    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = (ulysses_attention(q, k, v) if method == "ulysses" else
           ring_attention(q, k, v, mode=method))
    out.backward(dout)
    return q.grad, k.grad, v.grad


def _err(got, want) -> float:
    if got is None or got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    return float((got.double() - want).abs().max()) / max(1.0, float(want.abs().max()))


def grad_cases(seed: int, bug: bool = False):
    """Runs on every rank: rows of (case, method, dtype, max relative error of dq, dk, dv)."""
    import torch.distributed as dist

    from cpcourse.support.errors import InputError
    from cpcourse.support.shards import shard

    rank, world = dist.get_rank(), dist.get_world_size()
    if bug:
        _plant_stale_kv(world)
    rows = []
    for name, b, h, lq, lk, d, dtype, case_seed in _cases(world, seed):
        q, k, v, dout = _whole(b, h, lq, lk, d, case_seed)
        want = _reference_grads(q, k, v, dout)
        mine = [shard(x, rank, world).to(getattr(torch, dtype)) for x in (q, k, v, dout)]
        for method in ("overlap",) if bug else METHODS:
            row = {"case": name, "method": method, "dtype": dtype, "q_tokens": mine[0].shape[2]}
            try:
                got = _cp_grads(method, *mine)
                row["errs"] = [_err(g, shard(w, rank, world)) for g, w in zip(got, want,
                                                                               strict=True)]
            except InputError as exc:  # Ulysses: P must divide the heads
                row["error"] = str(exc)
            rows.append(row)
    if not bug:
        rows.append(_mismatch(rank, world))
    return rows


def _mismatch(rank, world) -> dict:
    """A rank whose shard disagrees: every rank raises, none waits in the backward."""
    from cpcourse.ring import ring_attention
    from cpcourse.support.errors import InputError

    q = torch.randn(1, 2, 3, 8 if rank < world - 1 else 4, requires_grad=True)
    try:
        ring_attention(q, q, q).sum().backward()
        return {"case": "mismatch", "error": None}
    except InputError as exc:
        return {"case": "mismatch", "error": str(exc)}


def _plant_stale_kv(world: int) -> None:
    """diffusers #14265 in our ring: every backward step reuses the K/V of its first step."""
    import cpcourse.ring.backward as ring

    real, first, calls = ring.attention_backward_from_lse, {}, [0]

    def stale(q, k, v, dout, lse, delta, scale=None):
        if calls[0] % world == 0:
            first["kv"] = (k, v)
        calls[0] += 1
        k0, v0 = first["kv"]
        return real(q, k0, v0, dout, lse, delta, scale) if k0.shape == k.shape else \
            real(q, k, v, dout, lse, delta, scale)

    ring.attention_backward_from_lse = stale


@pytest.fixture(scope="module", params=[2, 3, 4])
def world_rows(request):
    world = request.param
    seed = 7 * world
    return world, launch(f"{__file__}:grad_cases", world, timeout=240, args=(seed,),
                         stream=False)


def test_gradients_equal_one_process_autograd(world_rows):
    world, results = world_rows
    checked = set()
    for rank, rows in enumerate(results):
        for row in rows:
            if "errs" not in row:
                continue
            where = f"P={world} rank={rank} {row['case']} {row['method']} {row['dtype']}"
            assert max(row["errs"]) <= TOL[row["dtype"]], f"{where}: dq, dk, dv {row['errs']}"
            checked.add((row["method"], row["dtype"]))
    assert {m for m, _ in checked} == set(METHODS)
    assert {d for _, d in checked} == {"float32", "float64"}
    assert any(r.get("q_tokens") == 0 for rows in results for r in rows)  # an empty shard


def test_ulysses_refuses_heads_the_world_does_not_divide(world_rows):
    world, results = world_rows
    for rows in results:
        for row in rows:
            if row.get("method") == "ulysses" and "error" in row:
                assert "world size must divide the head count" in row["error"]


def test_mismatched_shapes_raise_on_every_rank_before_the_backward(world_rows):
    _, results = world_rows
    errors = [next(r for r in rows if r["case"] == "mismatch")["error"] for rows in results]
    assert all(e and "differs across ranks" in e for e in errors), errors


def test_the_planted_stale_kv_bug_is_caught():
    results = launch(f"{__file__}:grad_cases", 2, timeout=240, args=(14,),
                     kwargs={"bug": True}, stream=False)
    worst = max(max(r["errs"]) for rows in results for r in rows if "errs" in r)
    assert worst >= BUG_MIN, worst
