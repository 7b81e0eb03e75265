"""The link measured alone (`cpcourse.runs.link_probe`): a gloo ping-pong on 2 ranks, its alpha-beta
fit, and the ring's communication predicted from it.

    python -m pytest -q tests/unit/test_link_probe.py
"""

import pytest

from cpcourse.runs.link_probe import LinkProbeRequest, hop_seconds, ring_prediction, run
from cpcourse.support.errors import InputError


def test_probe_on_two_gloo_ranks_fits_a_positive_bandwidth():
    res = run(LinkProbeRequest(sizes=(4096, 262144, 1048576), repeats=3, inner=2))
    assert res["sizes"] == [4096, 262144, 1048576]
    assert all(t > 0 for t in res["median_s"]) and all(
        m <= t for m, t in zip(res["min_s"], res["median_s"], strict=True))
    assert res["gbps"] > 0 and res["alpha_s"] >= 0
    # the fit (of the fastest samples) reproduces the largest message's fastest time within the
    # noise of a busy machine
    big = hop_seconds(1048576, res["alpha_s"], res["gbps"])
    assert 0.2 < big / res["min_s"][-1] < 5


@pytest.mark.parametrize("bad", [dict(nproc=1), dict(nproc=5), dict(sizes=(4096,)),
                                 dict(sizes=(4096, 4096)), dict(sizes=(4096, 1001)),
                                 dict(repeats=0), dict(inner=0), dict(timeout=0)])
def test_bad_requests_are_refused_before_any_process_starts(bad):
    with pytest.raises(InputError):
        LinkProbeRequest(**bad)


def test_ring_prediction_prices_hops_blocking_and_overlapped():
    # a 1 MB hop on a 1 GB/s link with alpha 1 ms: 2 ms per hop
    steps = [{"compute_s": 0.005, "comm_s": 0.004, "bytes_sent": 1e6},
             {"compute_s": 0.001, "comm_s": 0.0015, "bytes_sent": 1e6},
             {"compute_s": 0.005, "comm_s": 0.0, "bytes_sent": 0}]  # the last step sends nothing
    assert hop_seconds(1e6, 1e-3, 1.0) == pytest.approx(2e-3)
    blocking = ring_prediction(steps, 1e-3, 1.0, overlap=False)
    assert blocking["hops"] == 2 and blocking["predicted_s"] == pytest.approx(4e-3)
    assert blocking["measured_s"] == pytest.approx(5.5e-3)
    assert blocking["extra_s"] == pytest.approx(1.5e-3)
    over = ring_prediction(steps, 1e-3, 1.0, overlap=True)  # only step 1's hop outlasts compute
    assert over["predicted_s"] == pytest.approx(1e-3) and over["compute_s"] == pytest.approx(0.011)
    with pytest.raises(InputError):
        ring_prediction([], 1e-3, 1.0, overlap=True)
