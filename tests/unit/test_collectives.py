"""The alpha-beta cost of every collective (`cpcourse.planner.collectives`)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.planner.collectives import (
    KINDS,
    attention_collectives,
    attention_comm_seconds,
    bytes_sent,
    collective_seconds,
    fit_alpha_beta,
    latency_rounds,
)
from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.support.errors import InputError


@settings(max_examples=60, deadline=None)
@given(method=st.sampled_from(["ring", "allgather", "ulysses"]), world=st.integers(1, 8),
       per=st.integers(1, 50), hd=st.sampled_from([8, 64, 128]), b=st.sampled_from([2, 4]))
def test_bytes_agree_with_the_tiling_formula(method, world, per, hd, b):
    """Equal shards: the collectives' bytes are what `tiling_bytes_per_rank` counts."""
    heads = 2 * world
    total = sum(count * bytes_sent(kind, n, world) for kind, n, count in
                attention_collectives(method, per, heads, hd, world, b))
    expected = tiling_bytes_per_rank(method, per * world, heads, hd, world, dtype_bytes=b)
    assert total == pytest.approx(expected, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(0, 1e-3), gbps=st.floats(0.01, 900),
       sizes=st.lists(st.integers(1, 10**9), min_size=2, max_size=6, unique=True))
def test_fit_recovers_alpha_and_bandwidth(alpha, gbps, sizes):
    seconds = [alpha + s / (gbps * 1e9) for s in sizes]
    a, g = fit_alpha_beta(sizes, seconds)
    assert a == pytest.approx(alpha, rel=1e-6, abs=1e-12)
    assert g == pytest.approx(gbps, rel=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_one_rank_costs_nothing_and_alpha_counts_rounds(kind):
    assert collective_seconds(kind, 1e6, 1, alpha=1e-5, gbps=10)["seconds"] == 0
    c = collective_seconds(kind, 0, 4, alpha=1e-5, gbps=10)
    assert c["seconds"] == pytest.approx(latency_rounds(kind, 4) * 1e-5)


def test_ulysses_is_exposed_and_the_ring_can_hide():
    ring = attention_comm_seconds("ring", 4096, 16, 128, 8, alpha=5e-6, gbps=100)
    uly = attention_comm_seconds("ulysses", 4096, 16, 128, 8, alpha=5e-6, gbps=100)
    assert ring["exposed_s"] == 0 and ring["overlappable_s"] > 0
    assert uly["overlappable_s"] == 0 and uly["exposed_s"] > 0
    assert uly["bytes_sent"] < ring["bytes_sent"]  # 4 (P-1)/P L E against 2 (P-1) L E


def test_bad_inputs_say_what_to_change():
    with pytest.raises(InputError, match="kind must be one of"):
        collective_seconds("broadcast", 1, 2, alpha=0, gbps=1)
    with pytest.raises(InputError, match="two different message sizes"):
        fit_alpha_beta([1, 1], [1e-3, 1e-3])
    with pytest.raises(InputError, match="do not divide the 6 heads"):
        attention_collectives("ulysses", 10, 6, 8, 4)


def test_layer_seconds_ring_hides_ulysses_does_not():
    from cpcourse.planner.collectives import Layer, layer_seconds
    kw = dict(flops=3.5e14, alpha=3.5e-6, gbps=360.0)
    wan = Layer(75600, 40, 128)
    ring = layer_seconds("ring", wan, 8, **kw)
    uly = layer_seconds("ulysses", wan, 8, **kw)
    assert ring["exposed_s"] == 0.0 and ring["comm_s"] > 0  # NVLink: the ring hides
    assert uly["exposed_s"] == pytest.approx(uly["comm_s"]) and uly["comm_s"] > 0  # exposed
    assert uly["compute_s"] == pytest.approx(ring["compute_s"])
    slow = layer_seconds("ring", wan, 8, flops=3.5e14, alpha=0.0, gbps=0.5)
    hop = 2 * 9450 * 40 * 128 * 2 / 0.5e9
    assert slow["exposed_s"] == pytest.approx(7 * (hop - slow["compute_s"] / 8))
    one = layer_seconds("ring", Layer(1000, 2, 64), 1, **kw)
    assert one["comm_s"] == 0 and one["seconds"] == pytest.approx(one["compute_s"])


def test_usp_divides_the_nic_bytes_by_the_ulysses_degree():
    from cpcourse.planner.collectives import Layer, layer_seconds, usp_layer_seconds
    kw = dict(flops=3.5e14, alpha=0.0)
    usp = usp_layer_seconds(Layer(75600, 40, 128), 8, 2, intra_gbps=360.0, inter_gbps=46.5, **kw)
    ring = layer_seconds("ring", Layer(75600, 40, 128), 16, gbps=46.5, **kw)
    assert usp["compute_s"] == pytest.approx(ring["compute_s"])  # same work on 16 GPUs
    # bytes a GPU sends across nodes: 2 N (H/U) D b (R - 1) / R
    assert usp["ring_bytes_per_gpu"] == pytest.approx(2 * 75600 * 5 * 128 * 2 * 1 / 2)
    assert usp["seconds"] < ring["seconds"]
    with pytest.raises(InputError):
        usp_layer_seconds(Layer(75600, 40, 128), 3, 2, intra_gbps=360.0, inter_gbps=46.5, **kw)
