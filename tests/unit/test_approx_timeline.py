"""Notebook 13's timeline of one step: only exact CP waits on the link, and every method's link
time follows its bytes; `approx_sweep` refuses requests on different numbers of ranks.

    python -m pytest tests/unit/test_approx_timeline.py -q
"""

from __future__ import annotations

import pytest

from cpcourse.approx import METHODS
from cpcourse.approx.costs import bytes_per_step
from cpcourse.support.errors import InputError
from cpcourse.tinydit.training import shapes_config
from cpcourse.viz.approx_timeline import step_segments

SHAPE = (1, 3, 8, 32, 32)


def _link(method, comm, world=2):
    segs = step_segments(method, shapes_config(), SHAPE, world, comm)
    return segs, sum(length for lane, _, length, _ in segs if lane == 1)


@pytest.mark.parametrize("world", [2, 4])
def test_only_exact_cp_waits_and_link_time_follows_the_bytes(world):
    cfg, comm = shapes_config(), 0.4
    exact = bytes_per_step("exact", cfg, SHAPE, world, 0, 0)
    for method in ("exact", *METHODS):
        segs, link = _link(method, comm, world)
        kinds = {kind for _, _, _, kind in segs}
        assert ("exposed" in kinds) == (method == "exact"), (method, kinds)
        sent = bytes_per_step(method, cfg, SHAPE, world, 0, step=cfg.depth + 1)
        assert link == pytest.approx(comm * cfg.depth * sent / exact), method


def test_exact_cp_step_is_compute_plus_its_exposed_gathers():
    segs, link = _link("exact", 0.4)
    end = max(start + length for lane, start, length, _ in segs if lane == 0)
    assert end + segs[-1][2] == pytest.approx(shapes_config().depth + link)


def test_a_sweep_refuses_requests_on_different_numbers_of_ranks():
    from cpcourse.runs.approx import approx_sweep, check_approx

    reqs = [check_approx(n, approx="naive", prompt="circle-right", steps=2) for n in (2, 4)]
    with pytest.raises(InputError, match="same nproc"):
        approx_sweep(reqs, [])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_method_computes_the_same_per_step(world):
    """Every method does 1/P of the model's work per step (PipeFusion: L/P layers on every
    frame; the patch methods: L layers on 1/P of the frames): equal compute bars."""
    cfg = shapes_config()
    for method in ("exact", *METHODS):
        segs = step_segments(method, cfg, SHAPE, world, 0.4)
        compute = sum(length for lane, _, length, _ in segs if lane == 0)
        assert compute == pytest.approx(cfg.depth), method
