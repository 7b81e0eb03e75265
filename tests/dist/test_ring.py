"""Ring attention (overlap, blocking, all-gather) and Ulysses on real gloo processes, P = 1..4.

    python -m pytest tests/dist/test_ring.py -q

One launch per world size runs every case (seeded random shapes, lengths not divisible by P,
lengths smaller than P so some ranks hold no tokens, cross-attention lengths, float32 and bf16)
against one-process float64 attention; the ranks return numbers and the assertions happen here so
a failure names the case. The ring's measured bytes must equal the simulator's.
"""

import random

import pytest
import torch

from cpcourse.launch import RankError, launch
from cpcourse.sim import bytes_sent, simulate_ring

pytestmark = pytest.mark.dist

TOL = {"float32": 1e-5, "bfloat16": 2e-2}  # max |out - reference|, outputs are O(1)
MODES = ("overlap", "blocking", "allgather")


def _cases(world: int) -> list[tuple]:
    """(name, B, H, Lq, Lk, D, dtype, seed): fixed edge cases plus seeded random shapes."""
    rng = random.Random(world)
    cases = [("uneven", 1, 2 * world, 4 * world + 3, 4 * world + 3, 16, "float32", 1),
             ("shorter_than_world", 2, 2, max(1, world - 1), max(1, world - 1), 8, "float32", 2),
             ("cross", 1, 2, 2 * world + 1, 3 * world + 2, 8, "float32", 3),
             ("bf16", 1, 4, 5 * world + 1, 5 * world + 1, 32, "bfloat16", 4),
             # the same values in a strided layout (head dim not unit-stride): fused CPU attention
             # once read such views as garbage
             ("strided", 1, 2 * world, 3 * world + 2, 3 * world + 2, 16, "float32", 5)]
    for i in range(3):
        length = rng.randint(1, 9 * world)
        cases.append((f"random{i}", rng.randint(1, 2), rng.choice([1, 2, 3, 4, 6]), length,
                      length, rng.choice([3, 8, 17, 64]), "float32", 10 + i))
    return cases


def _whole(b, h, lq, lk, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=g, dtype=torch.float64),
            torch.randn(b, h, lk, d, generator=g, dtype=torch.float64),
            torch.randn(b, h, lk, d, generator=g, dtype=torch.float64))


def cp_cases(cases):
    """Runs on every rank: each case through every mode and Ulysses; returns error rows."""
    import torch.distributed as dist

    from cpcourse.attention import reference_attention
    from cpcourse.ring import ring_attention
    from cpcourse.support.errors import InputError
    from cpcourse.support.shards import shard
    from cpcourse.ulysses import ulysses_attention

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for name, b, h, lq, lk, d, dtype, seed in cases:
        dt = getattr(torch, dtype)
        whole = [x.to(dt).double() for x in _whole(b, h, lq, lk, d, seed)]  # inputs as rounded
        want = shard(reference_attention(*whole)[0], rank, world)
        mine = [shard(x, rank, world).to(dt) for x in whole]
        if name == "strided":
            mine = [x.transpose(-1, -2).contiguous().transpose(-1, -2) for x in mine]
            assert all(x.stride(-1) != 1 for x in mine)
        for method in (*MODES, "ulysses", "known_lens"):
            stats = []
            try:
                if method == "ulysses":
                    out = ulysses_attention(*mine, stats=stats)
                elif method == "known_lens":  # the caller vouches for the K/V lengths
                    lens = [x.shape[2] for x in torch.tensor_split(whole[1], world, dim=2)]
                    out = ring_attention(*mine, stats=stats, lens=lens)
                else:
                    out = ring_attention(*mine, mode=method, stats=stats)
            except InputError as exc:
                rows.append({"case": name, "method": method, "error": str(exc)})
                continue
            rows.append({"case": name, "method": method, "dtype": dtype,
                         "err": float((out.double() - want).abs().max()) if out.numel() else 0.0,
                         "shape_ok": out.shape == want.shape and out.dtype == dt,
                         "bytes": sum(s["bytes_sent"] for s in stats)})
    # Inputs that disagree across ranks: the same clear error on every rank, and no hang (the
    # group stays usable: the checks run on an all-gather that every rank completes).
    q = torch.randn(1, 2, 3, 8 if rank == world - 1 and world > 1 else 4)
    try:
        ring_attention(q, q, q)
        rows.append({"case": "mismatch", "method": "overlap", "error": None})
    except InputError as exc:
        rows.append({"case": "mismatch", "method": "overlap", "error": str(exc)})
    rows += _grad_refusals(world)
    rows += _remembered_agreement(world)
    try:  # lens that contradict this rank's own k are refused before any transfer
        ring_attention(q, q, q, lens=[q.shape[2] + 1] * world)
        rows.append({"case": "bad_lens", "method": "overlap", "error": None})
    except InputError as exc:
        rows.append({"case": "bad_lens", "method": "overlap", "error": str(exc)})
    qm = torch.randn(1, world, 3, 8)
    try:  # the all-to-all used to promote mixed dtypes silently, while the ring refused them
        ulysses_attention(qm, qm, qm.double())
        rows.append({"case": "mixed_dtype", "method": "ulysses (mixed dtypes)", "error": None})
    except InputError as exc:
        rows.append({"case": "mixed_dtype", "method": "ulysses (mixed dtypes)",
                     "error": str(exc)})
    dist.barrier()
    return rows


def _grad_refusals(world: int) -> list[dict]:
    """Paths whose communication has no backward refuse inputs that want a gradient (and name
    the path that has one); the ring, Ulysses and full 3D attention on them take such inputs.
    Everything runs under no_grad."""
    from cpcourse import video
    from cpcourse.ring import ring_attention
    from cpcourse.support.errors import InputError
    from cpcourse.ulysses import ulysses_attention

    q = torch.randn(1, world, 2, 8, requires_grad=True)
    qv = torch.randn(1, world, 1, 3, 8, requires_grad=True)  # a video shard [B, H, T_r, S, D]
    calls = {"ring_attention": lambda: ring_attention(q, q, q),
             "ring_attention(allgather)": lambda: ring_attention(q, q, q, mode="allgather"),
             "ulysses_attention": lambda: ulysses_attention(q, q, q),
             "temporal_attention_cp": lambda: video.temporal_attention_cp(qv, qv, qv),
             "full_attention_cp": lambda: video.full_attention_cp(qv, qv, qv),
             "gather_frames": lambda: video.gather_frames(qv)}
    rows = []
    for what, call in calls.items():
        try:
            call().sum().backward()
            rows.append({"case": "grad", "method": what, "error": None})
        except InputError as exc:
            rows.append({"case": "grad", "method": what, "error": str(exc)})
        with torch.no_grad():
            call()  # the same call without grad mode runs
    return rows


def _remembered_agreement(world: int) -> list[dict]:
    """Calls that run on the group's remembered agreement (no all-gather), and every way a shape
    change can meet them: each row is one call's error against float64, its error message, and
    how many agreements (all-gathers) it made."""
    import torch.distributed as dist

    import cpcourse.ring as ring
    import cpcourse.support.agreement as agreement
    from cpcourse.attention import reference_attention
    from cpcourse.support.errors import InputError
    from cpcourse.support.shards import shard

    rank = dist.get_rank()
    agreements = []
    real = agreement.agree
    agreement.agree = lambda *a, **kw: agreements.append(1) or real(*a, **kw)

    def call(name, total, heads=2, d=8, dtype=torch.float32, alone=None, mode="overlap"):
        whole = [x.to(dtype).double() for x in _whole(1, heads, total, total, d, len(name))]
        mine = [shard(x, rank, world).to(dtype) for x in whole]
        if alone is not None and rank == world - 1:  # this rank alone changes its inputs
            mine = [alone(x) for x in mine]
        before, stats = len(agreements), []
        try:
            out = ring.ring_attention(*mine, mode=mode, stats=stats)
            want = shard(reference_attention(*whole)[0], rank, world)
            if alone is not None:  # the keys changed on one rank: no reference here
                want = out.double()
            row = {"max_err": float((out.double() - want).abs().max()) if out.numel() else 0.0,
                   "steps": len(stats), "error": None}
        except InputError as exc:
            row = {"error": str(exc)}
        return {"case": "remembered", "method": "remembered", "name": name,
                "agreements": len(agreements) - before, **row}

    rows = [call(f"steady{i}", 4 * world + 1) for i in range(4)]
    rows.append(call("blocking", 4 * world + 1, mode="blocking"))
    if world > 1:  # one rank alone changes: heads, dtype, then its K/V length
        rows.append(call("heads_alone", 4 * world + 1, alone=lambda x: x.repeat(1, 2, 1, 1)))
        rows.append(call("dtype_alone", 4 * world + 1, alone=lambda x: x.double()))
        rows.append(call("length_alone", 4 * world + 1, alone=lambda x: x[:, :, :1]))
    rows.append(call("after_errors", 4 * world + 1))
    rows.append(call("all_longer", 6 * world + 5))
    rows += [call(f"alternate{i}", (4, 7)[i % 2] * world + 1) for i in range(4)]
    rows += [call(f"few_tokens{i}", max(1, world - 1)) for i in range(3)]  # a rank holds none
    rows.append(call("bf16", 3 * world + 2, dtype=torch.bfloat16))
    agreement.agree = real
    if world > 1:  # a bad scale with one rank changed alone: refused before any transfer
        q = torch.randn(1, 2, 4, 8)
        for mode in ("overlap", "blocking"):
            for _ in range(3):
                ring.ring_attention(q, q, q, mode=mode)
            kv = q[:, :, :3] if rank == world - 1 else q
            try:
                ring.ring_attention(q, kv, kv, mode=mode, scale=float("nan"))
                error = None
            except InputError as exc:
                error = str(exc)
            out = ring.ring_attention(q, q, q, mode=mode)  # the group still works
            rows.append({"case": "remembered", "method": "remembered", "name": f"nan_{mode}",
                         "bad_scale_error": error, "next_ok": out.shape == q.shape})
    # A destroyed group's remembered agreement goes with it (it held the group's sockets open)
    import gc
    for _ in range(3):
        g = dist.new_group(list(range(world)))
        for _ in range(3):
            ring.ring_attention(torch.randn(1, 1, 2, 4), *[torch.randn(1, 1, 2, 4)] * 2, group=g)
        dist.destroy_process_group(g)
        del g
    gc.collect()
    rows.append({"case": "remembered", "method": "remembered", "name": "groups_kept",
                 "count": sum(1 for key in agreement.AGREED.keys() if key is not dist.group.WORLD)})
    return rows


def mismatched_shapes():
    import torch.distributed as dist

    from cpcourse.ring import ring_attention

    heads = 3 if dist.get_rank() == 1 else 2
    q = torch.randn(1, heads, 5, 8)
    return ring_attention(q, q, q)


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def world_rows(request):
    world = request.param
    cases = _cases(world)
    results = launch(f"{__file__}:cp_cases", world, timeout=120, args=(cases,), stream=False)
    return world, cases, results


def test_every_mode_matches_float64_attention(world_rows):
    world, cases, results = world_rows
    for rank, rows in enumerate(results):
        for row in rows:
            if "err" not in row:
                continue
            where = f"P={world} rank={rank} case={row['case']} method={row['method']}"
            assert row["shape_ok"], where
            assert row["err"] <= TOL[row["dtype"]], f"{where}: max error {row['err']:.3g}"
    checked = {(r["case"], r["method"]) for rows in results for r in rows if "err" in r}
    assert {m for _, m in checked} == {*MODES, "ulysses", "known_lens"}
    assert len(checked) >= 3 * len(cases)  # every case ran through every ring mode


def test_ulysses_runs_or_refuses_by_head_count(world_rows):
    world, cases, results = world_rows
    heads = {name: h for name, _, h, *_ in cases}
    for rows in results:
        for row in rows:
            if row["method"] != "ulysses":
                continue
            if heads[row["case"]] % world == 0:
                assert "err" in row, row
            else:
                assert "world size must divide the head count" in row["error"]
                assert "ring_attention has no such limit" in row["error"]


def test_ring_bytes_equal_the_simulators(world_rows):
    world, cases, results = world_rows
    for name, b, h, lq, lk, d, dtype, seed in cases:
        q, k, v = (x.to(getattr(torch, dtype)) for x in _whole(b, h, lq, lk, d, seed))
        expected = bytes_sent(simulate_ring(q, k, v, world).events, world)
        for mode in ("overlap", "blocking"):
            measured = [next(r["bytes"] for r in rows if r["case"] == name and
                             r["method"] == mode) for rows in results]
            assert measured == expected, (name, mode)


def test_disagreeing_inputs_raise_on_every_rank(world_rows):
    world, _, results = world_rows
    errors = [next(r for r in rows if r["case"] == "mismatch")["error"] for rows in results]
    if world == 1:
        assert errors == [None]
        return
    assert all(e and "q differs across ranks" in e for e in errors), errors
    assert all(f"rank {world - 1} has [1, 2, 3, 8] float32" in e for e in errors)


def test_inputs_that_want_a_gradient_are_refused_where_there_is_no_backward(world_rows):
    world, _, results = world_rows
    refused = {"temporal_attention_cp": "method='ring'",
               "gather_frames": "cp_boundaries.gather_sequence"}
    for rank, rows in enumerate(results):
        grad = [r for r in rows if r["case"] == "grad"]
        assert len(grad) == 6
        for row in grad:
            if row["method"] in refused:
                assert row["error"] and "forward only" in row["error"] and "torch.no_grad()" in (
                    row["error"]) and refused[row["method"]] in row["error"], (world, rank, row)
            else:  # differentiable (tests/dist/test_cp_backward.py checks the gradients)
                assert row["error"] is None, (world, rank, row)


def test_ulysses_refuses_mixed_dtypes(world_rows):
    _, _, results = world_rows
    for rows in results:
        row = next(r for r in rows if r["case"] == "mixed_dtype")
        assert row["error"] and "one floating dtype" in row["error"], row


def test_a_mismatched_shape_ends_the_run_with_a_clear_error():
    with pytest.raises(RankError) as info:
        launch(f"{__file__}:mismatched_shapes", 3, timeout=60, stream=False)
    err = info.value
    assert err.exc_type == "InputError" and "q differs across ranks" in err.message
    assert "rank 1 has [1, 3, 5, 8]" in err.message and sorted(err.others + [err.rank]) == [0, 1, 2]


def test_without_a_process_group_the_error_says_how_to_start_one():
    import torch.distributed as dist

    from cpcourse.ring import ring_attention
    from cpcourse.support.errors import InputError
    from cpcourse.ulysses import ulysses_attention

    assert not dist.is_initialized()
    q = torch.randn(1, 1, 2, 4)
    for fn in (ring_attention, ulysses_attention):
        with pytest.raises(InputError, match="needs an initialised process group.*%%torchrun"):
            fn(q, q, q)


def test_a_remembered_agreement_gives_the_same_answers_and_errors(world_rows):
    """Shapes are agreed while they change, then remembered; a rank that changes alone raises
    the same error on every rank as a fresh agreement does, and the group goes on working."""
    world, _, results = world_rows
    for rank, rows in enumerate(results):
        by = {r["name"]: r for r in rows if r["case"] == "remembered"}
        assert by.pop("groups_kept")["count"] == 0, "a destroyed group is still remembered"
        for mode in ("overlap", "blocking") if world > 1 else ():
            row = by.pop(f"nan_{mode}")
            assert row["bad_scale_error"] and "scale must be finite" in row["bad_scale_error"]
            assert row["next_ok"], row
        for name, row in by.items():
            if name in ("heads_alone", "dtype_alone"):
                assert row["error"] and "differs across ranks" in row["error"], (rank, row)
            elif name == "length_alone":  # a valid change (shards may differ in length)
                assert row["error"] is None and row["steps"] == world, (rank, row)
            else:
                tol = TOL["bfloat16"] if name == "bf16" else TOL["float32"]
                assert row["error"] is None and row["max_err"] < tol, (world, rank, row)
                assert row["steps"] == world, row  # a dropped flagged attempt leaves no steps
        # a new shape is agreed twice (the second confirms it), then remembered
        if world == 1:  # nothing to agree with
            assert {r["agreements"] for r in by.values()} == {0}
        else:
            assert [by[f"steady{i}"]["agreements"] for i in range(4)] == [1, 1, 0, 0]
            assert by["blocking"]["agreements"] == 0
            assert by["length_alone"]["agreements"] == 1  # the flag, then one agreement
            assert by["all_longer"]["agreements"] == 1
            # shapes that keep changing are agreed once per call, as without the memory
            assert [by[f"alternate{i}"]["agreements"] for i in range(4)] == [1, 1, 1, 1]


def test_lens_that_contradict_the_local_shard_are_refused(world_rows):
    _, _, results = world_rows
    for rows in results:
        error = next(r for r in rows if r["case"] == "bad_lens")["error"]
        assert error and "lens[" in error and "this rank's k and v" in error, error
