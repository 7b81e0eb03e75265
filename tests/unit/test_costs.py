"""The cost model against the seed article's correct figures and the facts sheet's audit."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cpcourse.planner import costs, hardware
from cpcourse.support.errors import InputError


def seed_comm(**kw):
    return costs.comm(432_000, 8, 32, 128, dtype="fp16", bandwidth_gbps=450, **kw)


def test_seed_memory_figures():
    m = costs.memory(432_000, 4096, 32, dtype="fp16", cp=8)
    assert m["attention_matrix_bytes_per_head"] == 373_248_000_000  # ~373 GB: right
    assert m["qkv_bytes"] == 10_616_832_000  # 10.6 GB, not the article's 32 GB
    assert m["tokens_per_rank"] == 54_000
    assert m["hidden_state_bytes"] == 3_538_944_000
    assert costs.memory(432_000, 4096, 32, cfg_batch=2)["qkv_bytes"] == 2 * 10_616_832_000


def test_seed_ring_traffic_is_per_layer_per_forward():
    c = seed_comm()
    assert c["kv_bytes_per_hop_per_head"] == 27_648_000
    assert c["kv_bytes_per_hop"] == 884_736_000
    assert c["ring_hops"] == 7 and c["kv_bytes_total"] == 6_193_152_000
    assert c["comm_seconds_total"] == pytest.approx(13.76e-3, rel=1e-3)
    assert c["comm_seconds_per_hop"] == pytest.approx(1.966e-3, rel=1e-3)
    per_forward = seed_comm(layers=28, cfg_forwards=2)["kv_bytes_per_forward"]
    assert per_forward == 6_193_152_000 * 28 * 2


def test_seed_step_compute_at_fa3_rate():
    # 47.8 TFLOP per ring step; 64 ms at 740 TFLOP/s (the facts sheet's FA3-class H100 rate).
    c = seed_comm(attention_efficiency=740 / 989)
    assert c["flops_per_step"] == 47_775_744_000_000
    assert c["compute_seconds_per_step"] == pytest.approx(64.6e-3, rel=1e-2)
    assert c["hidden"] and c["compute_to_comm_ratio"] > 25


def test_hide_threshold_matches_closed_form():
    # bf16: compute/comm = Lq * B / F, so the threshold is F / B tokens per rank.
    c = costs.comm(100_000, 8, 32, 128, link="nvlink4", gpu="h100")
    f = hardware.get_gpu("h100").attention_flops()
    b = hardware.get_link("nvlink4").effective_gbps * 1e9
    assert c["min_tokens_per_rank_to_hide"] == math.ceil(f / b)
    at = costs.comm(8 * c["min_tokens_per_rank_to_hide"], 8, 32, 128, link="nvlink4")
    below = costs.comm(8 * (c["min_tokens_per_rank_to_hide"] - 50), 8, 32, 128, link="nvlink4")
    assert at["hidden"] and not below["hidden"]


def test_links_and_gpus_keep_sources():
    for link in hardware.links().values():
        assert link.source and 0 < link.efficiency <= 1
    for gpu in hardware.gpus().values():
        assert gpu.sources and 0 < gpu.attention_efficiency <= 1
    assert hardware.get_link("nvlink4").gbps_per_direction == 450
    assert hardware.get_link("ib-ndr").effective_gbps == pytest.approx(46.5)
    assert hardware.get_gpu("h200").hbm_gb == 141


def test_ulysses_moves_p_over_2_less_than_the_ring():
    c = costs.comm(64_000, 8, 32, 128, link="nvlink4")
    assert c["kv_bytes_total"] / c["ulysses_bytes_per_rank"] == pytest.approx(8 / 2)


@pytest.mark.parametrize("call, words", [
    (lambda: costs.comm(4, 8, 2, 64, link="nvlink4"),
     "^cp 8 is larger than the 4 tokens to split: use cp=4"),
    (lambda: costs.comm(100, 2, 2, 64), "exactly one of `link`"),
    (lambda: costs.comm(100, 2, 2, 64, link="carrier-pigeon"), "unknown link"),
    (lambda: costs.comm(100, 2, 2, 64, link="pcie5", gpu="tpu"), "unknown GPU"),
    (lambda: costs.memory(100, 100, 3), "not divisible by heads=3"),
    (lambda: costs.memory(100, 96, 3, dtype="fp8"), "dtype must be one of"),
    (lambda: costs.memory(-5, 96, 3), "^tokens must be > 0"),
])
def test_bad_input(call, words):
    with pytest.raises(InputError, match=words):
        call()


@given(st.integers(1, 10_000), st.integers(1, 64))
def test_shards_like_tensor_split(n, p):
    if p > n:
        return
    sizes = costs.planned_shard_sizes(n, p)
    assert sizes == [len(s) for s in torch.arange(n).tensor_split(p)]
