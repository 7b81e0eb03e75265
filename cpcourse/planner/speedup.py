"""Where a table's most-GPU run loses its P-fold speedup, part by part, by the model.

    python -c "from cpcourse.planner.speedup import speedup_losses as s; \
print(s('hunyuanvideo-720p-h100'))"

Against one GPU's predicted time / P: the serial part (decode, text encoder), the exposed
communication, the collectives' latency, attention's split cost, the rest; then what the
published time adds that the model does not price. Notebooks 10 and 12 print it.
"""

from __future__ import annotations

from cpcourse.planner.facts import holdout_runs, published_runs
from cpcourse.planner.plan import plan
from cpcourse.planner.validation import how_run, predict_runs
from cpcourse.support.errors import require
from cpcourse.support.layout import Layout


def _costed(run: dict, layout: dict) -> dict:
    """A published run priced as it was made (`how_run`) with `layout`: plan's best."""
    how = how_run(run)
    return plan(run["model"], run["height"], run["width"], run["frames"], run["gpus"],
                run["gpu"], steps=run["steps"], kernel=run.get("kernel") or "auto",
                fsdp=how["fsdp"], released=how["released"], offload=how["offload"],
                text_encoder_cpu=how["text_encoder_cpu"], layout=Layout(**layout)).best


def speedup_losses(table: str) -> dict:
    """Where a table's most-GPU run loses its P-fold speedup, by the model, in seconds beyond
    the predicted one-GPU time / P: `serial` (the decode and text encoder, which no GPU count
    shortens: fixed x (1 - 1/P)), `communication` (the exposed bytes of all-to-alls, ring hops,
    all-reduces and gathers), `latency` (the collectives' alphas), `split` (attention cut into
    blocks and merged: the ring's folds, priced at the H200's measured overhead), `rest`
    (what else does not divide: text tokens every rank attends, rounding of shards, FSDP's
    copies, one-GPU offloading, the first call's warm-up); and `not_priced`, the published time
    less the predicted one.
    Keys also: gpus, one_gpu_s, ideal_s (one-GPU predicted / P), predicted_s, published_s,
    published_speedup, predicted_speedup."""
    runs = [r for r in published_runs()["runs"] + holdout_runs()["runs"] if r["table"] == table]
    require(len({r["gpus"] for r in runs}) >= 2, f"table {table!r}: needs two GPU counts")
    rows = {row["gpus"]: row for row in predict_runs(runs)["rows"]}
    lo_run, hi_run = min(runs, key=lambda r: r["gpus"]), max(runs, key=lambda r: r["gpus"])
    one, top = (_costed(r, rows[r["gpus"]]["layout"]) for r in (lo_run, hi_run))
    p = hi_run["gpus"] / lo_run["gpus"]
    steps, fw = hi_run["steps"], top["forwards_per_step"]
    per = top["breakdown"]["per_forward_seconds"]
    lat = steps * fw * top["breakdown"]["comm_latency_seconds"]
    comm = steps * fw * sum(per.get(k, 0.0) for k in ("ulysses", "ring_exposed", "tp_allreduce",
                                                     "fsdp_exposed", "attn2d"))
    one_s, top_s = rows[lo_run["gpus"]]["predicted_s"], rows[hi_run["gpus"]]["predicted_s"]
    out = {"gpus": [lo_run["gpus"], hi_run["gpus"]], "one_gpu_s": one_s, "ideal_s": one_s / p,
           "serial": top["seconds_fixed"] - one["seconds_fixed"] / p,
           "communication": comm - lat, "latency": lat,
           "split": steps * fw * per["ring_merge"] - one["breakdown"]["per_forward_seconds"][
               "ring_merge"] * steps * one["forwards_per_step"] / p,
           "predicted_s": top_s, "published_s": hi_run["seconds_total"]}
    out["rest"] = out["predicted_s"] - out["ideal_s"] - sum(
        out[k] for k in ("serial", "communication", "latency", "split"))
    out["not_priced"] = out["published_s"] - out["predicted_s"]
    out["published_speedup"] = lo_run["seconds_total"] / hi_run["seconds_total"]
    out["predicted_speedup"] = one_s / top_s
    return out
