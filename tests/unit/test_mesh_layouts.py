"""Mesh layouts without processes: parsing, coordinates, the valid factorisations, refusals,
and the traffic model's limits (one rank sends nothing; the ring's share falls with U)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.support.errors import InputError
from cpcourse.support.layout import DIMS, Layout, check_layout, layouts
from cpcourse.tinydit.costs import predicted_bytes_per_step
from cpcourse.tinydit.model import DiTConfig


def test_parse_and_text():
    lay = Layout.parse("cfg=2, ulysses=2,ring=1,tp=1")
    assert lay == Layout(cfg=2, ulysses=2) and lay.world == 4 and lay.cp == 2
    assert str(lay) == "cfg2 x ulysses2" and str(Layout()) == "one rank"
    for bad in ("", "cfg=2,cfg=1", "pp=2", "cfg=x", "ring=0", "cfg=3", "ring=99999"):
        with pytest.raises(InputError):
            Layout.parse(bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_coords_are_a_bijection_with_tp_innermost(c, r, u, t):
    lay = Layout(cfg=c, ring=r, ulysses=u, tp=t)
    seen = set()
    for rank in range(lay.world):
        co = lay.coords(rank)
        assert ((co["cfg"] * r + co["ring"]) * u + co["ulysses"]) * t + co["tp"] == rank
        seen.add(tuple(co[d] for d in DIMS))
    assert len(seen) == lay.world
    if t > 1:  # neighbouring ranks differ in tp first
        assert lay.coords(1)["tp"] == 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.sampled_from([None, 4, 12, 24, 40]), st.booleans())
def test_layouts_are_exactly_the_valid_ones(world, heads, cfg):
    found = layouts(world, heads, cfg)
    assert len(set(found)) == len(found)
    for lay in found:
        assert lay.world == world and (cfg or lay.cfg == 1)
        assert heads is None or heads % (lay.ulysses * lay.tp) == 0
        check_layout(lay, world, heads)
    # a pure ring always works: it has no head limit
    assert Layout(ring=world) in found


def test_refusals_name_what_works():
    with pytest.raises(InputError, match="needs 4 ranks but the world has 8"):
        check_layout(Layout(cfg=2, ring=2), 8)
    with pytest.raises(InputError, match=r"does not divide the 12 heads.*ring8"):
        check_layout(Layout(ulysses=8), 8, 12)


@pytest.mark.parametrize("heads,words", [(0, "heads must be > 0"), (-4, "heads must be > 0"),
                                         (2.5, "heads must be a whole number")])
def test_head_counts_that_divide_nothing_are_refused(heads, words):
    # heads=0 is divisible by every degree: 27 layouts of 12 ranks passed, -4 gave 9
    with pytest.raises(InputError, match=words):
        layouts(12, heads=heads)
    with pytest.raises(InputError, match=words):
        check_layout(Layout(ulysses=2), heads=heads)


def test_one_rank_sends_nothing_and_ulysses_shrinks_the_ring():
    cfg = DiTConfig(attention="full", hidden=32, heads=4)
    shape = [1, 4, 8, 8, 8]
    assert predicted_bytes_per_step(cfg, shape, Layout(), 0) == dict.fromkeys(DIMS, 0)
    ring4 = predicted_bytes_per_step(cfg, shape, Layout(ring=4), 0)
    usp = predicted_bytes_per_step(cfg, shape, Layout(ring=2, ulysses=2), 0)
    # the ring hops once instead of three times, with blocks twice as long and half the heads
    assert usp["ring"] * 3 == ring4["ring"]
    tp = predicted_bytes_per_step(cfg, shape, Layout(tp=2), 0)
    assert tp["tp"] > 0 and tp["ring"] == tp["ulysses"] == tp["cfg"] == 0
