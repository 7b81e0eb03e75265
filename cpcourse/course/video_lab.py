"""What notebook 06 runs on each rank: every video CP method, measured, and your exercises.

    python -c "import cpcourse.launch as l; print(l.launch('cpcourse.course.video_lab:measure', 3, \
args=((1, 4, 7, 10, 16),)))"

`measure(shape)` runs on every rank of a launch: the whole video q/k/v `[B, H, T, S, D]` is
drawn from one seed (float64, the reference) and each rank keeps its frames (float32). For each
method it returns the largest error against the float64 one-process answer, the bytes this rank
sent (measured by `cpcourse.support.bytecount`), the bytes the cost model predicts, and the seconds.
It also runs the notebook's exercises 06.2 - 06.5 through `cpcourse.course.exercise`, so an
unsolved one falls back to the reference with a notice.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cpcourse import video
from cpcourse.planner import video_costs
from cpcourse.support.bytecount import count_bytes

METHODS = (("temporal", "all_to_all"), ("temporal", "ring"), ("full", "ring"),
           ("full", "ulysses"))


def whole_video(shape, seed: int = 0, n: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(n)]


def _err(got, want) -> float:
    return float((got.double() - want.double()).abs().max()) if want.numel() else 0.0


def measure(shape, text_tokens: int = 6, few_frames: tuple | None = None) -> dict:
    """Per-rank rows {kind, method, err, bytes, predicted, seconds} and the exercises' errors.

    `few_frames`: a second video shape (e.g. with T < P) on which every method runs once; its
    worst error comes back as "few_frames_err".
    """
    from cpcourse.course.exercises import exercise

    rank, world = dist.get_rank(), dist.get_world_size()
    b, h, t, s, d = shape
    q, k, v = whole_video(shape)
    mine = [video.frame_shard(x, rank, world).float() for x in (q, k, v)]
    refs = {"temporal": video.temporal_attention(q, k, v), "full": video.full_attention(q, k, v)}
    rows = []
    for kind, method in METHODS:
        if method == "ulysses" and h % world:
            continue  # Ulysses splits heads: H must be divisible by P
        fn = video.temporal_attention_cp if kind == "temporal" else video.full_attention_cp
        fn(*mine, method=method)  # warm-up: first calls pay one-off set-up costs
        start = time.perf_counter()
        with count_bytes() as sent:
            out = fn(*mine, method=method)
        rows.append({"kind": kind, "method": method, "seconds": time.perf_counter() - start,
                     "err": _err(out, video.frame_shard(refs[kind], rank, world)),
                     "bytes": sent.total, "predicted": video_costs.predicted_bytes(
                         kind, method, (b, h, t, s, d), world, rank)})
    # the learner's exercises (or the reference, with a notice, while unsolved)
    ex = {}
    ex["06.2 gather_frames"] = _err(exercise("06.2")(mine[0]), q)
    ex["06.3 time_to_space"] = _err(exercise("06.3")(mine[0], t),
                                    torch.tensor_split(q, world, dim=3)[rank])
    ex["06.4 full_attention_ring"] = _err(exercise("06.4")(*mine),
                                          video.frame_shard(refs["full"], rank, world))
    tq, tk, tv = (x[:, :, 0] for x in whole_video((b, h, 1, text_tokens, d), seed=1))
    ref_v, ref_t = video.joint_attention(q, k, v, tq, tk, tv)
    texts = [x.float() for x in (tq, tk, tv)]
    from cpcourse.course.exercises import load

    buggy = load("solutions", "ex06_video_cp").joint_attention_cp_buggy(*mine, *texts)
    fixed = exercise("06.5")(*mine, *texts)
    joint = {"buggy_text_err": _err(buggy[1], ref_t),
             "buggy_video_err": _err(buggy[0], video.frame_shard(ref_v, rank, world)),
             "fixed_text_err": _err(fixed[1], ref_t),
             "fixed_video_err": _err(fixed[0], video.frame_shard(ref_v, rank, world))}
    few_err = None
    if few_frames is not None:
        fq, fk, fv = whole_video(few_frames, seed=2)
        fmine = [video.frame_shard(x, rank, world).float() for x in (fq, fk, fv)]
        few_err = 0.0
        for kind, method in METHODS:
            if method == "ulysses" and few_frames[1] % world:
                continue
            fn = video.temporal_attention_cp if kind == "temporal" else video.full_attention_cp
            ref = (video.temporal_attention if kind == "temporal" else video.full_attention)(
                fq, fk, fv)
            few_err = max(few_err, _err(fn(*fmine, method=method),
                                        video.frame_shard(ref, rank, world)))
    return {"rank": rank, "rows": rows, "exercises": ex, "joint": joint,
            "few_frames_err": few_err}


def summarize(results) -> list[dict]:
    """One row per method across ranks: worst error, bytes of the busiest rank, total bytes."""
    out = []
    for i, row in enumerate(results[0]["rows"]):
        per_rank = [r["rows"][i] for r in results]
        out.append({"attention": row["kind"], "method": row["method"],
                    "max_err": max(r["err"] for r in per_rank),
                    "bytes_max_rank": max(r["bytes"] for r in per_rank),
                    "predicted_max_rank": max(r["predicted"] for r in per_rank),
                    "bytes_total": sum(r["bytes"] for r in per_rank),
                    "exact": all(r["bytes"] == r["predicted"] for r in per_rank),
                    "seconds": max(r["seconds"] for r in per_rank)})
    return out
