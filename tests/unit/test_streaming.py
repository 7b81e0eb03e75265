"""When SP stops paying for a streaming chunk (cpcourse.planner.streaming): the mechanics of the
comparison, each against what the cost model and the layer count say it must be."""

from __future__ import annotations

import math

import pytest

from cpcourse.planner.costs import hide_threshold
from cpcourse.planner.hardware import get_gpu
from cpcourse.planner.streaming import (
    chunk_tokens,
    collective_latency_examples,
    latency_range,
    sp_floor,
    stream_cost,
)
from cpcourse.planner.tokens import get_model
from cpcourse.support.errors import InputError

WAN = "wan2.1-t2v-1.3b"


def test_one_gpu_is_its_own_baseline():
    c = stream_cost(WAN, "h100", 1, 1, alpha=1e-4)
    assert c["collectives_per_forward"] == 0
    assert c["cp_speedup"] == pytest.approx(1.0)
    assert c["pp_throughput_speedup"] == pytest.approx(1.0)


@pytest.mark.parametrize("method,per_layer", [("ulysses", 4), ("ring", 3)])
def test_latency_adds_once_per_collective(method, per_layer):
    a, b = (stream_cost(WAN, "h100", 4, 2, method=method, alpha=x) for x in (0.0, 1e-4))
    assert b["collectives_per_forward"] == per_layer * get_model(WAN).layers
    assert b["cp_seconds"] - a["cp_seconds"] == pytest.approx(b["collectives_per_forward"] * 1e-4)
    assert b["one_gpu_seconds"] == a["one_gpu_seconds"]


@pytest.mark.parametrize("world,method", [(2, "ulysses"), (4, "ulysses"), (8, "ring")])
def test_cp_pays_more_the_longer_the_chunk(world, method):
    eff = [stream_cost(WAN, "h100", world, f, method=method, alpha=2e-5)["cp_efficiency"]
           for f in (1, 2, 4, 8)]
    assert eff == sorted(eff) and eff[-1] > eff[0]


@pytest.mark.parametrize("world", [2, 4, 7])
def test_pipeline_is_bound_by_its_busiest_stage(world):
    layers = get_model(WAN).layers
    c = stream_cost(WAN, "h100", world, 1, method="ring", in_flight=8 * world)
    assert c["pp_throughput_speedup"] == pytest.approx(layers / math.ceil(layers / world))
    assert c["weights_bytes_per_gpu"]["pipeline"] * world == pytest.approx(
        c["weights_bytes_per_gpu"]["cp"])
    assert c["pp_latency_seconds"] > c["one_gpu_seconds"]


def test_the_floor_rises_with_latency_and_matches_its_scan():
    ex = collective_latency_examples()
    floors = [sp_floor(WAN, "h100", 4, alpha=a)["tokens"]
              for a in sorted(e["seconds"] for e in ex.values())]
    assert floors == sorted(floors) and floors[0] < floors[-1]
    f = sp_floor(WAN, "h100", 4, alpha=5e-5)
    below = stream_cost(WAN, "h100", 4, f["latent_frames"] - 1, alpha=5e-5) \
        if f["latent_frames"] > 1 else None
    assert stream_cost(WAN, "h100", 4, f["latent_frames"], alpha=5e-5)["cp_efficiency"] >= 0.8
    assert below is None or below["cp_efficiency"] < 0.8


def test_ring_hide_floor_is_the_per_gpu_threshold_times_the_ranks():
    g = get_gpu("h100")
    f = sp_floor(WAN, "h100", 4)
    assert f["ring_hide_tokens"] == 4 * hide_threshold(g.id, g.intra_link)["tokens"]


def test_chunks_in_latent_frames():
    assert chunk_tokens(WAN, 1).sequence_length == 1560  # 480p: 30 x 52 tokens a latent frame
    assert chunk_tokens(WAN, 3).latent_frames == 3


def test_refusals():
    with pytest.raises(InputError, match="heads"):
        stream_cost(WAN, "h100", 5, 1, method="ulysses")
    with pytest.raises(InputError, match="method"):
        stream_cost(WAN, "h100", 2, 1, method="zigzag")
    with pytest.raises(InputError, match="alpha"):
        stream_cost(WAN, "h100", 2, 1, alpha=-1)
    with pytest.raises(InputError, match="cached_frames"):
        stream_cost(WAN, "h100", 2, 1, cached_frames=-1)
    with pytest.raises(InputError, match="in_flight"):
        stream_cost(WAN, "h100", 2, 1, in_flight=0)
    with pytest.raises(InputError, match="efficiency"):
        sp_floor(WAN, "h100", 2, efficiency=0)


@pytest.mark.parametrize("world", [2, 4])
def test_one_clean_context_stream_gains_nothing_from_a_pipeline(world):
    # chunk k + 1 needs chunk k's final K/V: one forward in flight, so a chunk takes the whole
    # pipeline's latency, longer than one GPU's forward by the P - 1 sends
    c = stream_cost(WAN, "h100", world, 1, alpha=3e-5)
    assert c["pp_seconds_per_chunk"] == pytest.approx(c["pp_latency_seconds"])
    assert c["pp_throughput_speedup"] == c["pp_latency_speedup"] < 1
    more = [stream_cost(WAN, "h100", world, 1, alpha=3e-5, in_flight=k)["pp_throughput_speedup"]
            for k in (1, 2, world, 8 * world, 16 * world)]
    assert more == sorted(more) and more[-1] == more[-2]  # bound by the busiest stage


@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_cached_keys_add_attention_that_cp_divides(method):
    plain = stream_cost(WAN, "h100", 4, 1, method=method, alpha=3e-5)
    cached = stream_cost(WAN, "h100", 4, 1, method=method, alpha=3e-5, cached_frames=20)
    assert cached["cached_tokens"] == 20 * plain["tokens"]
    assert cached["one_gpu_seconds"] - plain["one_gpu_seconds"] == pytest.approx(
        cached["cache_attention_seconds"])
    # 4 n c hidden per layer: linear in the cached tokens
    half = stream_cost(WAN, "h100", 4, 1, method=method, cached_frames=10)
    assert half["cache_attention_seconds"] * 2 == pytest.approx(
        cached["cache_attention_seconds"])
    if method == "ulysses":  # the cache is head-sharded and never moves: CP only gains
        assert cached["cp_speedup"] > plain["cp_speedup"]
    else:  # pass-kv: each hop carries the cache too, and what it does not hide grows with it
        latency = cached["collectives_per_forward"] * 3e-5
        assert cached["cp_comm_seconds"] - latency == pytest.approx(
            (plain["cp_comm_seconds"] - latency) * (1 + cached["cached_tokens"] / plain["tokens"]))


def test_the_latency_range_is_sorted_and_sourced():
    rng = latency_range()
    assert [e["seconds"] for e in rng] == sorted(e["seconds"] for e in rng)
    assert len(rng) >= 4 and all(e["source"] for e in rng)
    speedups = [stream_cost(WAN, "h100", 4, 1, alpha=e["seconds"])["cp_speedup"] for e in rng]
    assert speedups == sorted(speedups, reverse=True)
