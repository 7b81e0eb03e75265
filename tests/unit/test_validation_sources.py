"""Validation per source, with nothing read from the source it predicts, and the interval.

    python -m pytest tests/unit/test_validation_sources.py -q
"""

import json
import statistics
from pathlib import Path

import pytest

from cpcourse.cli import main
from cpcourse.planner import uncertainty
from cpcourse.planner.facts import added_runs, holdout_runs, published_runs
from cpcourse.planner.hardware import generation_kernel
from cpcourse.planner.plan import plan
from cpcourse.planner.validation import INCLUDES, included, source_id, validate, warmup_share
from cpcourse.support.layout import Layout


def _size(row: dict) -> dict:
    run = next(r for r in published_runs()["runs"] + added_runs()["runs"]
               + holdout_runs()["runs"] if r["table"] == row["table"] and r["gpus"] == row["gpus"])
    return {k: run[k] for k in ("height", "width", "frames", "steps")}


DATA = Path(__file__).resolve().parents[2] / "cpcourse" / "data"


@pytest.fixture(scope="module")
def v():
    return validate()


def test_every_source_is_reported_with_its_own_errors_and_coverage(v):
    rows = v["rows"] + v["holdout"]["rows"] + v["added"]["rows"]
    assert set(v["by_source"]) >= {source_id(r) for r in published_runs()["runs"]}
    for sid, s in v["by_source"].items():
        mine = [r for r in rows if r["source_id"] == sid]
        errs = [abs(r["ratio"] - 1) for r in mine]
        assert s["runs"] == len(mine)
        assert s["median_abs_rel_error"] == pytest.approx(statistics.median(errs))
        assert s["worst_abs_rel_error"] == max(errs)
        assert s["interval_coverage"] == sum(r["covered"] for r in mine) / len(mine)
        assumed = [r for r in mine if r["kernel_stated"] == "unknown"
                   and r["kernel"] != generation_kernel(r["gpu"])[0]]
        if s["median_abs_rel_error"] <= 0.15:  # the bar, per source
            continue
        # the one exception, explained: a source that names no kernel, on a GPU whose engines
        # run another than the default FA2 (Blackwell: FA4); with that kernel it is met
        assert len(assumed) == len(mine), sid
        for r in assumed:
            gen = generation_kernel(r["gpu"])[0]
            t = plan(r["model"], gpus=r["gpus"], gpu=r["gpu"], kernel=gen, layout=Layout(
                **r["layout"]), **_size(r))["seconds_total"]
            assert abs(t / r["published_s"] - 1) <= 0.15, (r["table"], gen, t)
    assert "no number read from that source" in v["leave_one_source_out"]


def test_no_measurement_the_planner_reads_comes_from_a_validation_source():
    """Leave-one-source-out with nothing fitted: the measurements the cost model reads (the
    H200 run, the timed decodes, the derived counts) cite none of the sources the validation
    runs come from, so leaving a source out changes no prediction."""
    runs = published_runs()["runs"]
    sources = {source_id(r) for r in runs} | {r["source"].split()[0] for r in runs}
    for name in ("gpu_measured_h200.json", "vae_decode_measured.json", "dit_derived_costs.json",
                 "vae_decode_flops.json"):
        text = (DATA / name).read_text()
        assert not any(sid in text for sid in sources), name


def test_the_second_xdit_table_is_not_called_held_out(v):
    assert v["holdout"]["held_out"] is False
    assert "same page" in v["holdout"]["why_not_held_out"]
    assert not any(r["held_out"] for r in v["rows"] + v["holdout"]["rows"])


def test_a_time_that_includes_the_first_call_pays_its_warm_up(v):
    """xDiT's page times one call with no warm-up before it: the first forward's planning and
    allocations are in its times, priced at the share the H200 measured (Wan 1.3B, 8%)."""
    share, source = warmup_share()
    assert 0.05 < share < 0.1 and "first forward" in source
    row = next(r for r in v["rows"] if r["table"] == "hunyuanvideo-720p-h100" and r["gpus"] == 1)
    assert "warmup" in row["includes"]


def test_a_published_time_includes_the_whole_generate_call_unless_it_says(v):
    run = dict(published_runs()["runs"][0])
    assert set(INCLUDES) <= set(included(run))
    run["includes"] = ["text_encoder", "denoise"]
    from cpcourse.planner.validation import predict_runs
    run["table"] = "no-provenance"  # a table the provenance lacks: its own list counts
    whole = predict_runs([{**run, "includes": list(INCLUDES)}])
    no_decode = predict_runs([run])
    p = plan(run["model"], run["height"], run["width"], run["frames"], run["gpus"], run["gpu"],
             steps=run["steps"], layout="ulysses=1")
    assert whole["rows"][0]["predicted_s"] - no_decode["rows"][0]["predicted_s"] == \
        pytest.approx(p["vae_decode_seconds"])


def test_the_interval_brackets_the_prediction_and_moves_with_its_inputs():
    p = plan("wan2.1-t2v-14b", gpus=8, gpu="h800", layout="ulysses=8")
    lo, hi = p["seconds_total_interval"]
    assert lo < p["seconds_total"] < hi
    assert set(p["interval_inputs"]) >= {"kernel_share", "link", "alpha", "split", "decode",
                                         "elementwise"}
    with uncertainty.edge("slow"):
        slow = plan("wan2.1-t2v-14b", gpus=8, gpu="h800", layout="ulysses=8")["seconds_total"]
    assert slow == pytest.approx(hi)
    assert uncertainty.current() == "mid"  # the edge does not leak out of its block


def test_plan_json_and_text_carry_the_interval(capsys):
    argv = ["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--gpu", "h800"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    lo, hi = d["seconds_total_interval"]
    assert lo <= d["seconds_total"] <= hi
    assert main(argv) == 0
    assert f"{lo:.0f}-{hi:.0f} s" in capsys.readouterr().out


def test_validate_prints_sources_and_coverage(capsys):
    assert main(["plan", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-source-out" in out and "interval" in out
    assert "held out (not used to build the planner)" not in out


def test_where_eight_gpus_lose_their_eight_x():
    """The parts add up to the predicted time; the ring (the 4090 box) pays a split cost that
    Ulysses (HunyuanVideo on H100s) does not; the collectives' latency is under a second."""
    from cpcourse.planner.speedup import speedup_losses

    parts = ("serial", "communication", "latency", "split", "rest")
    for table in ("hunyuanvideo-720p-h100", "wan2.1-t2v-1.3b-480p-4090"):
        d = speedup_losses(table)
        assert d["ideal_s"] + sum(d[k] for k in parts) == pytest.approx(d["predicted_s"])
        assert d["published_s"] - d["predicted_s"] == pytest.approx(d["not_priced"])
        assert 0 < d["latency"] < 1.0
    assert speedup_losses("hunyuanvideo-720p-h100")["split"] == 0
    assert speedup_losses("wan2.1-t2v-1.3b-480p-4090")["split"] > 0


def test_an_auto_kernel_says_what_it_assumed_and_what_a_current_engine_runs():
    """On Hopper the default (FA2, what the published runs' code installs) is slower than FA3,
    which current engines run there: the plan names both times. On Blackwell, which flash-attn
    2 does not support, the default is the generation's kernel (FA4)."""
    p = plan("wan2.2-t2v-a14b", 720, 1280, 81, gpus=1, gpu="h100")
    line = next(r for r in p["reasoning"] if r.startswith("Kernel assumed"))
    assert "fa2" in line and "fa3" in line
    fa3 = plan("wan2.2-t2v-a14b", 720, 1280, 81, gpus=1, gpu="h100", kernel="fa3")
    assert f"{fa3['seconds_total']:.0f} s instead of {p['seconds_total']:.0f} s" in line
    given = plan("wan2.2-t2v-a14b", 720, 1280, 81, gpus=1, gpu="h100", kernel="fa2")
    assert not any(r.startswith("Kernel assumed") for r in given["reasoning"])
    assert plan("wan2.2-t2v-a14b", 720, 1280, 81, gpus=1, gpu="b200")["kernel"] == "fa4"
