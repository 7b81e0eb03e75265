"""One cost model, one default kernel per GPU: quantities two notebooks show agree.

    timeout 900 .venv/bin/python -m pytest -q tests/unit/test_course_consistency.py

Notebooks 05 and 10 both show the tokens per GPU that hide a ring hop (`costs.hide_threshold`);
09's table prices the article's layout (`article_audit.tp_across_nodes`) beside `plan`'s rows;
00-05 and 11 time attention with `GPU.attention_flops()`. Each pair must come from the same
kernel and the same count, and no notebook may pass a rate of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cpcourse.planner import costs, hardware
from cpcourse.planner.deployment import cost
from cpcourse.planner.plan import plan
from cpcourse.planner.tokens import get_model, model_tokens
from cpcourse.planner.validation import validate
from cpcourse.support.layout import Layout
from cpcourse.viz import article_audit

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


@pytest.mark.parametrize("gpu", sorted(hardware.gpus()))
def test_one_default_kernel_per_gpu_everywhere(gpu):
    g = hardware.get_gpu(gpu)
    p = plan("wan2.1-t2v-1.3b", gpus=2, gpu=gpu, layout="ring=2")
    assert p["kernel"] == g.kernel == hardware.default_kernel(gpu)  # plan's --kernel auto
    c = costs.comm(32_760, 2, 12, 128, link=g.intra_link, gpu=gpu)
    assert c["kernel"] == g.kernel and c["attention_efficiency"] == g.attention_efficiency
    tok = model_tokens("wan2.1-t2v-1.3b")
    assert cost("wan2.1-t2v-1.3b", tok, gpu, Layout(), 8)["kernel_efficiency"] == (
        g.attention_efficiency)


@pytest.mark.parametrize("link", ["nvlink4", "ib-ndr", "pcie5"])
def test_hide_threshold_is_the_same_in_05_and_10(link):
    """05 (`costs.comm`) and 10 (`deployment.cost`, exercise 10.4) hide a hop from one count."""
    h = costs.hide_threshold("h100", link)
    assert h["kernel"] == hardware.get_gpu("h100").kernel
    assert costs.comm(100_000, 8, 24, 128, link=link)["min_tokens_per_rank_to_hide"] == (
        h["tokens"])
    hy = get_model("hunyuanvideo-13b")
    tok = model_tokens(hy.id)
    gpu = hardware.get_gpu("h100")
    per_node = 64 if link == gpu.intra_link else 1
    for ring in (2, 8, 15, 16, 32, 64):
        c = cost(hy.id, tok, "h100", Layout(ring=ring), per_node)
        if c["links"]["ring"] != link:
            continue
        hides = c["breakdown"]["per_forward_seconds"]["ring_exposed"] == 0
        assert hides == (c["tokens_per_rank"] >= h["tokens"]), (ring, c["tokens_per_rank"])


def test_a_kernel_twice_as_fast_needs_twice_the_tokens():
    """The threshold scales with the kernel's rate: FA3 (70%, the paper's) against FA2 (36%,
    measured on the H200, the H100's die) needs 1.9x the tokens."""
    for link in ("nvlink4", "ib-ndr", "pcie5"):
        fa2, fa3 = (costs.hide_threshold("h100", link, k) for k in ("fa2", "fa3"))
        rate = fa3["attention_efficiency"] / fa2["attention_efficiency"]
        assert fa3["tokens"] == pytest.approx(rate * fa2["tokens"], abs=1)


def test_the_article_row_of_09_is_priced_like_plans_rows():
    tpx = article_audit.tp_across_nodes("cosmos-1.0-diffusion-7b", cp=8, tp=2, gpu="h100")
    cos = get_model("cosmos-1.0-diffusion-7b")
    inside = cost(cos.id, model_tokens(cos.id), "h100", Layout(ring=8, tp=2), gpus_per_node=16)
    assert tpx["seconds_per_step_nvlink4"] == pytest.approx(inside["seconds_per_step"],
                                                            rel=1e-12)
    assert tpx["kernel"] == inside["kernel"] == hardware.get_gpu("h100").kernel
    assert tpx["allreduces_per_forward"] == inside["breakdown"]["tp_all_reduces_per_forward"]
    # the lesson 09 teaches: TP across nodes is the slowest of its rows
    p16 = plan(cos.id, gpus=16, gpu="h100", nodes=2)
    inner = next(a for a in p16.alternatives
                 if a["layout"] == {"cfg": 1, "ring": 8, "ulysses": 1, "tp": 2})
    assert tpx["seconds_per_step_ib-ndr"] > inner["seconds_per_step"] > p16["seconds_per_step"]


def test_the_default_kernel_is_the_one_published_runs_agree_with(monkeypatch):
    """`default_kernel`'s docstring: with FA3 on every Hopper the validation misses more."""
    import cpcourse.planner.plan as plan_module

    def hopper(rows):
        return [r for r in rows if hardware.get_gpu(r["gpu"]).arch == "hopper"]

    def median_miss(rows):
        misses = sorted(abs(r["ratio"] - 1) for r in rows)
        return misses[len(misses) // 2]

    fa2 = hopper(validate()["rows"])
    assert fa2 and all(r["kernel"] == "fa2" for r in fa2)
    default = hardware.default_kernel
    monkeypatch.setattr(plan_module, "default_kernel", lambda g: "fa3" if hardware.get_gpu(
        g).arch == "hopper" else default(g))
    fa3 = hopper(validate()["rows"])
    assert all(r["kernel"] == "fa3" for r in fa3)
    assert median_miss(fa3) > 2 * median_miss(fa2)


def test_no_notebook_passes_its_own_attention_rate():
    own = re.compile(r"attention_efficiency\s*=\s*[\d.]|kernel\s*=\s*\"(fa2|fa3|sdpa)\"\s*\)"
                     r"|def \w+\([^)]*kernel\s*=\s*\"")
    for nb in sorted(NOTEBOOKS.glob("*.md")):
        for i, line in enumerate(nb.read_text().splitlines(), 1):
            assert not own.search(line), f"{nb.name}:{i}: {line.strip()}"
