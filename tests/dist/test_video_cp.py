"""Video CP on real processes (gloo) at P = 1..4 against one-process float64 references.

One launch per world size runs every case; the ranks return numbers and the assertions happen
here, so a failure names the case. Bytes sent are measured (`count_bytes`) and must equal the
cost model (`video_costs`) exactly.
"""

import pytest
import torch

from cpcourse.launch import launch

pytestmark = pytest.mark.dist

# (name, B, H, T, S, D): T and S not divisible by most P; T < P appears at P = 3, 4.
CASES = [("uneven", 1, 2, 7, 5, 8), ("batch2", 2, 4, 5, 6, 6), ("short", 1, 4, 2, 9, 8),
         ("one_frame", 1, 6, 1, 4, 8)]
TOL = 2e-5  # float32 against float64 (cpcourse.attention.TOLERANCES)


def _whole(b, h, t, s, d, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, s, d, generator=gen, dtype=torch.float64) for _ in range(3)]


def video_cases(cases):
    """Runs on every rank: each method on each case; returns rows of measured numbers."""
    import torch.distributed as dist

    from cpcourse import video
    from cpcourse.planner import video_costs
    from cpcourse.support.bytecount import count_bytes
    from cpcourse.support.errors import InputError
    from cpcourse.tinydit.rope import rope_3d

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for i, (name, b, h, t, s, d) in enumerate(cases):
        q, k, v = _whole(b, h, t, s, d, seed=i)
        mine = [video.frame_shard(x, rank, world).float() for x in (q, k, v)]
        refs = {"temporal": video.temporal_attention(q, k, v),
                "full": video.full_attention(q, k, v)}
        runs = [("temporal", "all_to_all"), ("temporal", "ring"), ("full", "ring")]
        if h % world == 0:
            runs.append(("full", "ulysses"))
        for kind, method in runs:
            fn = video.temporal_attention_cp if kind == "temporal" else video.full_attention_cp
            with count_bytes() as sent:
                out = fn(*mine, method=method)
            want = video.frame_shard(refs[kind], rank, world)
            rows.append({"case": name, "kind": kind, "method": method,
                         "err": float((out.double() - want).abs().max()) if out.numel() else 0.0,
                         "shape_ok": out.shape == want.shape, "bytes": sent.total,
                         "predicted": video_costs.predicted_bytes(kind, method, (b, h, t, s, d),
                                                                  world, rank)})
        # spatial attention needs no communication at all
        with count_bytes() as sent:
            out = video.spatial_attention(*mine)
        err = (out.double() - video.frame_shard(video.spatial_attention(q, k, v), rank, world))
        rows.append({"case": name, "kind": "spatial", "method": "local", "shape_ok": True,
                     "err": float(err.abs().max()) if err.numel() else 0.0,
                     "bytes": sent.total, "predicted": 0})
        # gathering the frames back; rotary at the global frame index
        with count_bytes() as sent:
            whole = video.gather_frames(mine[0])
        rows.append({"case": name, "kind": "gather", "method": "all_gather",
                     "err": float((whole.double() - q).abs().max()), "shape_ok": True,
                     "bytes": sent.total, "predicted": video_costs.predicted_bytes(
                         "gather", "all_gather", (b, h, t, s, d), world, rank)})
        if s % 3 == 0:
            roped = rope_3d(video.frame_shard(q, rank, world), 3, s // 3,
                            frame_offset=video.frame_offset(t, rank, world))
            want = video.frame_shard(rope_3d(q, 3, s // 3), rank, world)
            rows.append({"case": name, "kind": "rope", "method": "global offset",
                         "err": float((roped - want).abs().max()) if want.numel() else 0.0,
                         "shape_ok": True, "bytes": 0, "predicted": 0})
    # joint video + replicated text: text K/V must be counted once
    q, k, v = _whole(1, 2, 5, 4, 8, seed=99)
    tq, tk, tv = (x[:, :, 0] for x in _whole(1, 2, 3, 6, 8, seed=98))  # [1, 2, 6, 8]
    ref_v, ref_t = video.joint_attention(q, k, v, tq, tk, tv)
    out_v, out_t = video.joint_attention_cp(*(video.frame_shard(x, rank, world) for x in (q, k, v)),
                                            tq, tk, tv)
    rows.append({"case": "joint", "kind": "joint", "method": "ring", "shape_ok": True,
                 "err": max(float((out_t - ref_t).abs().max()),
                            float((out_v - video.frame_shard(ref_v, rank, world)).abs().max())
                            if out_v.numel() else 0.0),
                 "bytes": 0, "predicted": 0})
    # errors every rank raises the same way, without a hang
    errors = []
    try:
        video.temporal_attention_cp(*mine, method="zigzag")
    except InputError as exc:
        errors.append(str(exc))
    try:
        bad = torch.zeros(1, 2, 1, 3 + rank, 8)
        video.temporal_attention_cp(bad, bad, bad)
    except InputError as exc:
        errors.append(str(exc))
    try:  # Ulysses splits heads: P + 1 heads cannot be split over P > 1 ranks
        odd = torch.zeros(1, world + 1, 1, 2, 8)
        video.full_attention_cp(odd, odd, odd, method="ulysses")
    except InputError as exc:
        errors.append(str(exc))
    return {"rows": rows, "errors": errors}


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request):
    world = request.param
    return world, launch(f"{__file__}:video_cases", world, timeout=90, args=(CASES,),
                         stream=False)


def test_every_method_matches_float64_reference(results):
    world, per_rank = results
    for rank, res in enumerate(per_rank):
        for row in res["rows"]:
            where = f"P={world} rank {rank} {row['case']} {row['kind']}/{row['method']}"
            assert row["shape_ok"], where
            tol = 1e-12 if row["kind"] == "rope" else TOL
            assert row["err"] <= tol, f"{where}: max error {row['err']:.3g}"


def test_bytes_measured_equal_predicted(results):
    world, per_rank = results
    seen = set()
    for rank, res in enumerate(per_rank):
        for row in res["rows"]:
            where = f"P={world} rank {rank} {row['case']} {row['kind']}/{row['method']}"
            assert row["bytes"] == row["predicted"], \
                f"{where}: measured {row['bytes']} B, predicted {row['predicted']} B"
            seen.add((row["kind"], row["method"]))
    if world > 1:  # the comparison is not vacuous: every method really sent bytes
        sent = {(r["kind"], r["method"]) for res in per_rank for r in res["rows"] if r["bytes"]}
        assert {("temporal", "all_to_all"), ("temporal", "ring"), ("full", "ring"),
                ("full", "ulysses")} <= sent


def test_bad_input_raises_the_same_clear_error_on_every_rank(results):
    world, per_rank = results
    for res in per_rank:
        assert "method must be one of" in res["errors"][0]
        if world > 1:
            assert "differs across ranks" in res["errors"][1]
            assert "head" in res["errors"][2], res["errors"][2]
