"""Notebook 05's hiding roofline (cpcourse.viz.overlap): its thresholds are `cpcourse comm`'s.

    python -m pytest tests/unit/test_viz_overlap.py -q
"""

from __future__ import annotations

import json
import math

import matplotlib
import pytest

matplotlib.use("Agg")

from cpcourse.cli import main  # noqa: E402
from cpcourse.planner import costs  # noqa: E402
from cpcourse.planner.hardware import get_gpu, get_link  # noqa: E402
from cpcourse.planner.tokens import get_model, model_tokens  # noqa: E402
from cpcourse.support.dtypes import nbytes  # noqa: E402
from cpcourse.viz import overlap as vo  # noqa: E402


def _cli_comm(capsys, *argv) -> dict:
    assert main(["comm", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_gpu_is_paired_with_its_own_links():
    rows = vo.thresholds()
    assert [(r["gpu"], r["link"]) for r in rows] == [
        ("a100-80gb-sxm", "nvlink3"), ("a100-80gb-sxm", "pcie4"), ("a100-80gb-sxm", "ib-hdr"),
        ("h100-sxm", "nvlink4"), ("h100-sxm", "pcie5"), ("h100-sxm", "ib-ndr"),
        ("b200", "nvlink5"), ("b200", "pcie5"), ("b200", "ib-ndr")]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_thresholds_equal_what_cpcourse_comm_reports(capsys, dtype):
    b = nbytes(dtype)
    for r in vo.thresholds(dtype=dtype):
        cli = _cli_comm(capsys, "--tokens", "4096", "--cp", "8", "--heads", "24",
                        "--head-dim", "128", "--gpu", r["gpu"], "--link", r["link"],
                        "--dtype", dtype)
        assert r["min_tokens_per_rank_to_hide"] == cli["min_tokens_per_rank_to_hide"]
        assert math.ceil(r["critical_intensity"] * b / 2) == cli["min_tokens_per_rank_to_hide"]
        g, lk = get_gpu(r["gpu"]), get_link(r["link"])  # F / B from the hardware tables
        assert r["critical_intensity"] == pytest.approx(
            g.attention_flops() / (lk.effective_gbps * 1e9), rel=1e-12)
        assert cli["effective_tflops"] * 1e12 == pytest.approx(r["flops_per_s"], rel=1e-12)


def test_model_points_are_the_ring_steps_intensity(capsys):
    for p in vo.model_points(cp=8):
        m = get_model(p["model"])
        n = model_tokens(p["model"]).sequence_length
        cli = _cli_comm(capsys, "--model", p["model"], "--cp", "8", "--link", "ib-ndr")
        assert p["tokens_per_rank"] == cli["tokens_per_rank"] == math.ceil(n / 8)
        assert p["intensity"] == cli["flops_per_step"] / cli["kv_bytes_per_hop"]
        assert p["intensity"] == pytest.approx(p["tokens_per_rank"])  # 2 Lq / b with b = 2
        assert (m.heads, m.head_dim) == (cli["heads"], cli["head_dim"])


def test_figure_draws_the_thresholds_and_the_shares():
    rows, points = vo.thresholds(), vo.model_points()
    fig = vo.roofline_figure(rows, points)
    assert [ax.get_title() for ax in fig.axes] == [vo.short_name(get_gpu(g).name)
                                                   for g in vo.GPUS]
    for r in rows:
        ax = next(a for a in fig.axes if a.get_title() in r["gpu_name"])
        vline = next(ln for ln in ax.get_lines() if ln.get_gid() == f"threshold:{r['link']}")
        assert vline.get_xdata()[0] == r["critical_intensity"]
        roof = next(ln for ln in ax.get_lines() if ln.get_gid() == f"roof:{r['link']}")
        assert max(roof.get_ydata()) == 1.0
        assert f"{r['min_tokens_per_rank_to_hide']:,} tokens/rank" in roof.get_label()
        for p in points:
            mark = next(ln for ln in ax.get_lines()
                        if ln.get_gid() == f"model:{p['model']}:{r['link']}")
            c = costs.comm(p["tokens"], 8, get_model(p["model"]).heads,
                           get_model(p["model"]).head_dim, link=r["link"], gpu=r["gpu"])
            assert mark.get_xdata()[0] == p["intensity"]
            assert mark.get_ydata()[0] == pytest.approx(min(1.0, c["compute_to_comm_ratio"]))
            assert (mark.get_ydata()[0] >= 1 - 1e-12) == c["hidden"]
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert all(f"{p['tokens_per_rank']:,} tokens per rank" in legend for p in points)
