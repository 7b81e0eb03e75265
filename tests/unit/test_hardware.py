"""The GPU and link tables: every GPU sourced, each with its own intra-node link, and the
published runs' GPUs resolvable (issue 14)."""

import copy
import json
from pathlib import Path

import pytest

from cpcourse.planner import costs, hardware
from cpcourse.planner.facts import facts, published_runs
from cpcourse.planner.plan import plan
from cpcourse.planner.tokens import get_model
from cpcourse.support.errors import InputError
from cpcourse.viz.article_audit import tp_across_nodes

PCIE_ONLY = ("l40s", "l20", "rtx4090")
NVLINK_400 = {"h800": "nvlink4-h800", "a800-80gb-sxm": "nvlink3-a800"}
SHARED_RUNS = Path(__file__).resolve().parents[3] / "shared" / "facts" / "published_runs.json"


def _entry(gpu_id):
    return next(g for g in facts()["hardware"] if g["id"] == gpu_id)


def test_every_gpu_loads_with_sources_and_its_own_links():
    table, links = hardware.gpus(), hardware.links()
    assert set(table) >= {"h20", "h800", "a800-80gb-sxm", "l40s", "l20", "rtx4090"}
    for g in table.values():
        assert g.sources and all(isinstance(s, str) and s for s in g.sources)
        assert g.name and g.bf16_tflops > 0 and g.hbm_gb > 0
        assert 0 < g.attention_efficiency <= 1 and g.efficiency_source
        # one default kernel per GPU, the one `kernel_efficiency` prices
        assert g.kernel == hardware.default_kernel(g.id) in hardware.KERNELS
        assert (g.attention_efficiency, g.efficiency_source) == hardware.kernel_efficiency(
            g.id, g.kernel)
        assert g.arch in ("ampere", "hopper", "ada", "blackwell")
        assert g.intra_link in links and g.pcie in links and g.nic in links
        assert g.nvlink is None or g.nvlink == g.intra_link
        entry = _entry(g.id)
        for key in ("hbm_type", "hbm_TBps", "pcie", "nic", "nvlink_GBps_per_dir",
                    "nvlink_GBps_bidir"):
            assert key in entry, (g.id, key)


def test_pcie_only_gpus_have_no_nvlink():
    nvlinks = {lk for lk in hardware.links() if lk.startswith("nvlink")}
    for gid in PCIE_ONLY:
        g, e = hardware.get_gpu(gid), _entry(gid)
        # GeForce cards have no GPU P2P: their transfers go through host memory
        assert g.nvlink is None and g.intra_link == ("pcie4-host" if gid in ("rtx4090", "4090")
                                                     else "pcie4")
        assert g.intra_link not in nvlinks
        assert e["nvlink_gen"] is None and e["nvlink_links"] == 0
        assert e["nvlink_GBps_per_dir"] == 0 and e["nvlink_GBps_bidir"] == 0
    assert hardware.get_link("pcie4").gbps_per_direction == 31.5


def test_a_geforce_box_without_p2p_runs_at_nccls_own_figure():
    """Stock RTX 4090s have no GPU peer-to-peer: NCCL stages through host memory, and its own
    topology search on such a box settles on one ring channel at 5 GB/s (nccl-tests #307)."""
    link = hardware.get_link(hardware.get_gpu("rtx4090").intra_link)
    assert link.id == "pcie4-host" and abs(link.effective_gbps - 5.0) < 1e-9
    assert "nccl-tests issue #307" in link.source
    assert link.effective_gbps < hardware.get_link("pcie4").effective_gbps / 4


def test_h800_and_a800_nvlink_is_400_both_ways():
    for gid, lid in NVLINK_400.items():
        g, e = hardware.get_gpu(gid), _entry(gid)
        assert g.nvlink == g.intra_link == lid
        lk = hardware.get_link(lid)
        assert lk.gbps_per_direction == 200 and e["nvlink_GBps_bidir"] == 400
        assert e["nvlink_links"] == 8
    # the full-width parts keep their own links, untouched
    assert hardware.get_gpu("h100").intra_link == "nvlink4"
    assert hardware.get_link("nvlink4").gbps_per_direction == 450
    assert hardware.get_gpu("h20").intra_link == "nvlink4"
    assert hardware.get_link("nvlink3").gbps_per_direction == 300


def test_existing_gpus_keep_their_numbers():
    want = {"a100-80gb-sxm": (312, 80, "nvlink3"), "h100-sxm": (989, 80, "nvlink4"),
            "h200-sxm": (989, 141, "nvlink4"), "b200": (2250, 180, "nvlink5")}
    for gid, (tflops, hbm, link) in want.items():
        g = hardware.get_gpu(gid)
        assert (g.bf16_tflops, g.hbm_gb, g.nvlink, g.intra_link) == (tflops, hbm, link, link)
    eff = facts()["calculator_defaults"]["attention_efficiency"]
    assert (eff["hopper_fa3"], eff["hopper_fa2"], eff["a100_fa2"], eff["b200"]) == (
        0.7, 0.35, 0.6, 0.6)


def test_rtx4090_peak_is_the_fp32_accumulate_rate():
    g = hardware.get_gpu("4090")
    assert g.id == "rtx4090" and g.bf16_tflops == 165.2
    # half the FP16-accumulate figure (330.3): FlashAttention accumulates in FP32
    fp16acc = _entry("rtx4090")["measured"]["bf16_fp16acc_dense_tflops_spec"]
    assert fp16acc / g.bf16_tflops == pytest.approx(2, rel=1e-3)
    assert any("FP32 Accumulate" in s for s in g.sources)


def test_kernel_table_by_architecture():
    kernels = facts()["calculator_defaults"]["attention_kernels"]["efficiency"]
    assert set(kernels) == set(hardware.KERNELS) == {"fa2", "fa3", "sdpa", "fa4", "cudnn"}
    for arch in ("ampere", "ada"):
        assert kernels["fa3"][arch] is None and kernels["fa4"][arch] is None
    for gid in hardware.gpus():
        for k in ("fa2", "sdpa"):
            value, source = hardware.kernel_efficiency(gid, k)
            assert 0 < value <= 1 and source
    value, why = hardware.kernel_efficiency("l20", "fa3")
    assert value is None and "Hopper" in why
    assert hardware.kernel_efficiency("h100", "fa3")[0] == 0.7
    assert hardware.kernel_efficiency("a100", "fa2")[0] == 0.6
    # H20's own measurement wins over the Hopper row
    assert hardware.kernel_efficiency("h20", "fa3")[0] == 0.85
    assert hardware.kernel_efficiency("h20", "fa2")[0] == 0.57
    with pytest.raises(InputError, match="unknown attention kernel"):
        hardware.kernel_efficiency("h100", "fa9")


def test_every_published_run_resolves():
    runs = published_runs()["runs"]
    assert runs and {r["gpu"] for r in runs} >= {"h100", "h20", "h800", "a800", "l20", "rtx4090"}
    for r in runs:
        g = hardware.get_gpu(r["gpu"])
        assert get_model(r["model"]).id == r["model"]
        if r["gpus"] > 1:  # a multi-GPU run's ring and Ulysses traffic crosses its intra link
            assert hardware.get_link(g.intra_link).effective_gbps > 0


def _undo_corrections(runs: dict) -> dict:
    """The course copy with each of its listed corrections put back to what the facts said."""
    out = copy.deepcopy({k: v for k, v in runs.items() if k != "corrections"})
    for c in runs.get("corrections", []):
        assert c["source"], c  # a correction names where the right value is written
        if c["table"] is None:
            out[c["field"]] = c["was"]
            continue
        (row,) = [r for r in out["runs"] if r["table"] == c["table"] and r["gpus"] == c["gpus"]]
        row[c["field"]] = c["was"]
    return out


@pytest.mark.skipif(not SHARED_RUNS.exists(), reason="no shared/ facts beside the checkout")
def test_published_runs_is_an_unchanged_copy_but_for_its_sourced_corrections():
    assert _undo_corrections(published_runs()) == json.loads(SHARED_RUNS.read_text())


def test_each_correction_changes_what_it_names():
    runs = published_runs()
    for c in runs["corrections"]:
        now = runs[c["field"]] if c["table"] is None else next(
            r[c["field"]] for r in runs["runs"] if r["table"] == c["table"]
            and r["gpus"] == c["gpus"])
        assert now != c["was"], c


@pytest.mark.parametrize("gpu", ["h20", "h800", "a800", "l40s", "l20", "rtx4090"])
def test_planner_and_costs_run_on_every_new_gpu(gpu):
    g = hardware.get_gpu(gpu)
    p = plan("wan2.1-t2v-1.3b", gpus=4, gpu=gpu)
    assert p["gpu"] == g.id and p["seconds_per_step"] > 0
    assert p["links"]["ring"] in (None, g.intra_link)
    c = costs.comm(32_760, 4, 12, 128, link=g.intra_link, gpu=gpu)
    assert c["compute_seconds_per_step"] > 0
    assert tp_across_nodes(gpu=gpu)["intra"] == g.intra_link


def test_no_link_is_a_clear_error():
    with pytest.raises(InputError, match="no link given"):
        hardware.get_link(None)
