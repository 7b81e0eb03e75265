"""Throughput against latency: N GPUs on one video under CP, or on N / g videos at once.

    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --objective throughput --json
    python -c "from cpcourse.planner.throughput import published; print(published())"

Latency asks how soon one video is done; throughput asks how many videos an hour the GPUs make.
A group of g GPUs that takes t_g seconds per video makes 3600 / t_g videos an hour, and N / g
such replicas make N / g x 3600 / t_g; one video then costs g x t_g GPU-seconds. CP on all N
GPUs runs at speedup s = t_1 / t_N, so replicas of one GPU make N / s times as many videos:
whenever s < N (always, once anything is serial or communicates) replicas win on throughput.
CP is still the answer when (a) the model fits no single GPU: the smallest group that holds it is
a replica, and CP (or TP) runs inside it; or (b) a latency target (`max_seconds`) that the
replicas miss: the option with the most videos an hour among those that meet it wins, and when
none meets it, the fastest one (`meets_target` False says so).

`throughput(...)` prices every group size g that divides N (and packs into the nodes) with
`cpcourse.planner.plan.plan`'s best layout for g GPUs; `published(table)` does the same arithmetic
on a published table's measured times (`cpcourse.planner.facts.published_runs`), its fewest-GPU
run as the replica and its most-GPU run as CP.
"""

from __future__ import annotations

from cpcourse.planner.facts import published_runs
from cpcourse.planner.plan import TIE, plan
from cpcourse.support.errors import InputError, positive_float, positive_int, require
from cpcourse.support.layout import MAX_WORLD, Layout, divisors

HOUR = 3600.0


def rates(gpus: int, group_gpus: int, seconds_per_video: float) -> dict:
    """N = `gpus` split into replicas of `group_gpus`, each making one video in
    `seconds_per_video`: replicas, videos_per_hour (all of them), videos_per_gpu_hour and
    gpu_seconds_per_video."""
    gpus, group = positive_int("gpus", gpus), positive_int("group_gpus", group_gpus)
    require(gpus <= MAX_WORLD, f"gpus {gpus}: use {MAX_WORLD} or fewer")
    require(gpus % group == 0, f"group_gpus {group} does not divide gpus {gpus}: every GPU "
            "would not be in a replica")
    # bounded so that every rate below stays finite
    t = positive_float("seconds_per_video", seconds_per_video, low=1e-6, high=1e30)
    replicas = gpus // group
    return {"group_gpus": group, "replicas": replicas, "seconds_per_video": t,
            "videos_per_hour": replicas * HOUR / t, "videos_per_gpu_hour": HOUR / (group * t),
            "gpu_seconds_per_video": group * t}


def group_sizes(gpus: int, nodes: int) -> list[int]:
    """Replica sizes g of `gpus` GPUs over `nodes` nodes: g divides the GPUs and either packs
    into one node or spans whole nodes (a replica never straddles a node boundary)."""
    gpus, nodes = positive_int("gpus", gpus), positive_int("nodes", nodes)
    require(gpus % nodes == 0, f"gpus {gpus} do not split evenly over nodes={nodes}")
    per_node = gpus // nodes
    return [g for g in divisors(gpus) if per_node % g == 0 or g % per_node == 0]


def _option(model_id, size, gpus, per_node, gpu, kw) -> dict:
    """One replica size costed by the planner, or why it cannot run."""
    try:
        p = plan(model_id, *size, gpus=gpus, gpu=gpu, nodes=max(1, gpus // per_node), **kw)
    except InputError as e:  # no valid layout of this many GPUs (heads, split rule)
        return {"group_gpus": gpus, "valid": False, "reason": str(e)}
    b = p.best
    return {"valid": True, "reason": None, "layout": b["layout"], "fits": b["fits"],
            "per_gpu_bytes": b["per_gpu_bytes"], "seconds_total": b["seconds_total"]}


def throughput(model_id: str, height: int | None = None, width: int | None = None,
               frames: int | None = None, gpus: int = 8, gpu: str = "h100", nodes: int = 1, *,
               max_seconds: float | None = None, **kw) -> dict:
    """The N = `gpus` GPUs as replicas of every possible size (`group_sizes`), each costed by
    `plan` (keyword arguments as `plan`'s: steps, kernel, fsdp, released, offload,
    text_encoder_cpu, text_encoder, parallel_vae) and priced by `rates`; the one with the most
    videos an hour that fits (and meets `max_seconds`, when given) wins. Keys: objective, the
    winner's `rates` and layout, fits, meets_target, `cp` (all N GPUs on one video),
    advantage_over_cp (videos an hour, as a ratio), cp_because (why the winner is a CP group,
    not single GPUs), options, reasoning."""
    require("layout" not in kw, "layout: throughput compares layouts itself; cost one layout "
            "with objective latency")
    # replicas share out the N GPUs; an encoder on a GPU of its own would be outside them
    require(kw.get("text_encoder") != "own-gpu", "text_encoder own-gpu: throughput splits the "
            "GPUs into replicas and counts no GPU outside them; use resident, freed or cpu")
    if max_seconds is not None:
        require(isinstance(max_seconds, int | float) and not isinstance(max_seconds, bool),
                f"max_seconds must be a number of seconds, got {max_seconds!r}")
        max_seconds = positive_float("max_seconds", max_seconds)
    probe = plan(model_id, height, width, frames, gpus, gpu, nodes, **kw)  # checks every input
    size, per_node = (height, width, frames), gpus // nodes
    options = []
    for g in group_sizes(probe.gpus, probe.nodes):
        o = _option(model_id, size, g, per_node, gpu, kw)
        if o["valid"]:
            o = {**rates(probe.gpus, g, o.pop("seconds_total")), **o}
            o["meets_target"] = max_seconds is None or o["seconds_per_video"] <= max_seconds
        options.append(o)
    valid = [o for o in options if o["valid"]]
    pool = [o for o in valid if o["fits"]] or valid
    met = [o for o in pool if o["meets_target"]]
    best = (max(met, key=lambda o: (o["videos_per_hour"], -o["seconds_per_video"])) if met
            else min(pool, key=lambda o: o["seconds_per_video"]))
    cp = next(o for o in options if o["group_gpus"] == probe.gpus)
    out = {"model": probe.model, "gpu": probe.gpu, "gpus": probe.gpus, "nodes": probe.nodes,
           "steps": probe.steps, "kernel": probe.kernel, "objective": "throughput",
           "max_seconds": max_seconds, **{k: best[k] for k in (
               "group_gpus", "replicas", "layout", "seconds_per_video", "videos_per_hour",
               "videos_per_gpu_hour", "gpu_seconds_per_video", "fits", "per_gpu_bytes",
               "meets_target")},
           # how the pipeline was assumed to run, as the latency answer says it
           "fsdp": probe.fsdp, "released": probe.released,
           "offload": probe.best["breakdown"]["residency"]["offload"],
           "text_encoder": {"place": probe.best["text_encoder"]["place"]},
           "vae_parallel": probe.best["vae_parallel"],
           "cp": cp, "advantage_over_cp": best["videos_per_hour"] / cp["videos_per_hour"]
           if cp["valid"] else None, "options": options}
    out["cp_because"] = _cp_because(out, options, max_seconds)
    out["reasoning"] = _reasoning(out, bool(met), pool is valid)
    return out


def _cp_because(out: dict, options: list[dict], max_seconds: float | None) -> list[str]:
    """Why the winner is a group of GPUs, not one GPU per video (empty when it is one GPU)."""
    if out["group_gpus"] == 1:
        return []
    why = []
    single = next(o for o in options if o["group_gpus"] == 1)
    if not single["valid"]:
        why.append(f"one GPU cannot run it: {single['reason']}")
    elif not single["fits"]:
        why.append(f"the model fits no single GPU ({single['per_gpu_bytes'] / 1e9:.1f} GB on "
                   f"one), so a replica needs {out['group_gpus']} GPUs")
    if max_seconds is not None and single["valid"] and not single["meets_target"]:
        why.append(f"one GPU takes {single['seconds_per_video']:.0f} s per video, over the "
                   f"latency target of {max_seconds:.3g} s")
    if not why:  # scaling better than linear in the model: a smaller group is slower per GPU
        why.append("a group of GPUs makes more videos an hour than single GPUs here")
    return why


def _reasoning(out: dict, met: bool, none_fit: bool) -> list[str]:
    cp = out["cp"]
    n, g = out["replicas"], out["group_gpus"]
    lines = [f"{n} replica{'s' * (n != 1)} of {g} GPU{'s' * (g != 1)} "
             f"({Layout(**out['layout'])}): {out['seconds_per_video']:.0f} s per video, "
             f"{out['videos_per_hour']:.3g} videos an hour, {out['gpu_seconds_per_video']:.0f} "
             "GPU-seconds per video."]
    if out["group_gpus"] != out["gpus"] and cp["valid"]:
        lines.append(f"CP on all {out['gpus']} GPUs ({Layout(**cp['layout'])}): "
                     f"{cp['seconds_per_video']:.0f} s per video, {cp['videos_per_hour']:.3g} "
                     f"videos an hour: the replicas make {out['advantage_over_cp']:.2f}x as many.")
        if out["advantage_over_cp"] <= 1 + TIE:
            lines.append("Within 2% of CP on all GPUs: the model cannot tell them apart.")
    lines += [f"CP is still the answer, because {why}." for why in out["cp_because"]]
    if not met:
        lines.append(f"No option meets {out['max_seconds']:g} s per video: the fastest is shown.")
    if none_fit:
        lines.append("Nothing fits: add GPUs, TP or FSDP, or offload.")
    return lines


def published(table: str = "hunyuanvideo-720p-h100") -> dict:
    """A published table's measured times as throughput: its fewest-GPU run (g GPUs, t_g) as
    replicas and its most-GPU run (N GPUs, t_N) as CP: speedup t_g / t_N, efficiency (speedup
    over N / g), both as `rates`, and replicas_advantage = the replicas' videos an hour over
    CP's, less 1 (= 1 / efficiency - 1)."""
    runs = [r for r in published_runs()["runs"] if r["table"] == table]
    tables = sorted({r["table"] for r in published_runs()["runs"]})
    require(runs, f"table {table!r} is not in published_runs.json: use one of "
            f"{', '.join(tables)}")
    lo, hi = min(runs, key=lambda r: r["gpus"]), max(runs, key=lambda r: r["gpus"])
    require(lo["gpus"] < hi["gpus"] and hi["gpus"] % lo["gpus"] == 0, f"table {table!r}: "
            f"its GPU counts {lo['gpus']} and {hi['gpus']} do not make replicas")
    speedup = lo["seconds_total"] / hi["seconds_total"]
    reps, cp = (rates(hi["gpus"], lo["gpus"], lo["seconds_total"]),
                rates(hi["gpus"], hi["gpus"], hi["seconds_total"]))
    return {"table": table, "model": lo["model"], "gpu": lo["gpu"], "gpus": hi["gpus"],
            "group_gpus": lo["gpus"], "speedup": speedup,
            "efficiency": speedup / (hi["gpus"] // lo["gpus"]), "replicas": reps, "cp": cp,
            "replicas_advantage": reps["videos_per_hour"] / cp["videos_per_hour"] - 1,
            "source": hi["source"]}
