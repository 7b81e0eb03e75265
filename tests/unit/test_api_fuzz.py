"""Hostile arguments to the Python API: a correct result or an InputError, nothing else.

    python -m pytest tests/unit/test_api_fuzz.py -q

Hypothesis draws valid, boundary and hostile values (0, negatives, floats where whole numbers
belong, NaN, bools, huge numbers, wrong types) for the windows helpers, the mesh layouts and the
planner's fits. Each call either returns what its docstring promises (checked here) or raises
`InputError`; a raw TypeError, ZeroDivisionError, NaN or silently wrong answer fails the test.
Derandomized, so CI sees the same examples every run.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.planner.throughput import rates
from cpcourse.planner.validation import amdahl_fit
from cpcourse.support.errors import InputError
from cpcourse.support.layout import Layout, check_layout, layouts
from cpcourse.tinydit.windows import blend_weights, frame_weights, reschedule_noise, window_starts

EXAMPLES = int(os.environ.get("CPCOURSE_FUZZ_EXAMPLES", "200"))
HOSTILE = [0, -1, -4, 2.5, float("nan"), float("inf"), True, None, "3", 10**12, 2**63]
SIZE = st.one_of(st.integers(1, 24), st.sampled_from(HOSTILE))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _result_or_input_error(call):
    try:
        return call()
    except InputError:
        return None


@FUZZ
@given(frames=SIZE, window=SIZE, stride=SIZE)
def test_window_starts_cover_every_frame_or_refuse(frames, window, stride):
    starts = _result_or_input_error(lambda: window_starts(frames, window, stride))
    if starts is not None:
        covered = {f for s in starts for f in range(s, s + window)}
        assert covered == set(range(frames)) and starts == sorted(starts), starts


@FUZZ
@given(frames=st.integers(1, 16), window=SIZE, blend=st.sampled_from(["pyramid", "flat", "x"]),
       starts=st.lists(st.one_of(st.integers(-3, 18), st.sampled_from(HOSTILE)), max_size=5))
def test_frame_weights_are_a_partition_of_unity_or_refuse(frames, window, blend, starts):
    w = _result_or_input_error(lambda: frame_weights(frames, starts, window, blend))
    if w is not None:
        assert w.shape == (len(starts), frames) and torch.isfinite(w).all()
        assert torch.allclose(w.sum(0), torch.ones(frames, dtype=w.dtype)), w


@FUZZ
@given(window=SIZE, blend=st.sampled_from(["pyramid", "flat", "x"]))
def test_blend_weights_are_positive_or_refuse(window, blend):
    w = _result_or_input_error(lambda: blend_weights(window, blend))
    if w is not None:
        assert w.shape == (window,) and (w > 0).all()


@FUZZ
@given(window=SIZE, stride=SIZE, seed=st.one_of(st.integers(0, 10), st.sampled_from(HOSTILE)))
def test_rescheduled_noise_is_a_permutation_of_the_frames_or_refuse(window, stride, seed):
    noise = torch.randn(1, 2, 8, 2, 2)
    out = _result_or_input_error(lambda: reschedule_noise(noise, window, stride, seed))
    if out is not None:
        assert out.shape == noise.shape
        assert all(any(torch.equal(out[:, :, f], noise[:, :, g]) for g in range(8))
                   for f in range(8))


@FUZZ
@given(world=SIZE, heads=st.one_of(st.none(), SIZE), cfg=st.booleans())
def test_layouts_multiply_to_the_world_and_divide_the_heads_or_refuse(world, heads, cfg):
    found = _result_or_input_error(lambda: layouts(world, heads, cfg))
    if found is not None:
        assert found, "a valid world has at least the ring layout"
        for lay in found:
            assert lay.world == world and (heads is None or heads % (lay.ulysses * lay.tp) == 0)
            assert check_layout(lay, world, heads) == lay


@FUZZ
@given(dims=st.dictionaries(st.sampled_from(["cfg", "ring", "ulysses", "tp"]), SIZE))
def test_a_layout_is_whole_positive_degrees_or_refused(dims):
    lay = _result_or_input_error(lambda: Layout(**dims))
    if lay is not None:
        assert math.prod(getattr(lay, d) for d in ("cfg", "ring", "ulysses", "tp")) == lay.world


NUMBER = st.one_of(st.floats(0.5, 1e4), st.sampled_from([0, -1.0, float("nan"), float("inf")]))


@FUZZ
@given(points=st.lists(st.tuples(SIZE, NUMBER), max_size=5))
def test_amdahl_fit_returns_finite_parts_or_refuses(points):
    fit = _result_or_input_error(lambda: amdahl_fit(points))
    if fit is not None:
        assert all(math.isfinite(x) for x in fit), fit


@FUZZ
@given(gpus=st.one_of(SIZE, st.sampled_from([4096, 4097])), group=SIZE,
       seconds=st.one_of(NUMBER, st.sampled_from([1e-320, 1e-300, 1e300])))
def test_throughput_rates_are_finite_and_consistent_or_refuse(gpus, group, seconds):
    r = _result_or_input_error(lambda: rates(gpus, group, seconds))
    if r is not None:
        assert all(math.isfinite(v) for v in r.values()), r
        assert r["replicas"] * r["group_gpus"] == gpus


# --- issue 51: the tolerance rule, the causal chunk helpers, the planner's typed flags ---------

FLAG = st.one_of(st.booleans(), st.sampled_from(["no", "false", 0, 1, None, "True"]))


@FUZZ
@given(err=NUMBER, scale=st.one_of(NUMBER, st.sampled_from(HOSTILE)),
       dtype=st.sampled_from(["float32", "fp32", "bf16", "float64", "float8", "", None]))
def test_a_verdict_is_a_finite_limit_or_refused(err, scale, dtype):
    from cpcourse.support.tolerance import verdict

    v = _result_or_input_error(lambda: verdict(err, scale, "ring", dtype))
    if v is not None:
        assert math.isfinite(v["tolerance"]) and v["tolerance"] > 0, v
        assert v["within_tolerance"] == (err <= v["tolerance"])


@FUZZ
@given(per_rank=st.lists(st.one_of(st.integers(-2, 50), st.sampled_from(HOSTILE)), max_size=5),
       sizes=st.lists(SIZE, max_size=5), rank=SIZE)
def test_causal_chunk_helpers_answer_or_refuse(per_rank, sizes, rank):
    from cpcourse.causal.chunks import (
        assign_chunks,
        chunk_of_frames,
        chunk_work,
        imbalance,
        rank_tokens,
        ring_traffic,
    )

    r = _result_or_input_error(lambda: imbalance(per_rank))
    if r is not None:
        assert math.isfinite(r) and r >= 1.0 - 1e-12, (per_rank, r)
    w = _result_or_input_error(lambda: chunk_work(sizes))
    if w is not None:
        assert all(x > 0 for x in w) and len(w) == len(sizes)
    a = assign_chunks(4, 2, "zigzag")
    t = _result_or_input_error(lambda: ring_traffic(a, sizes))
    if t is not None:
        assert all(x["useful"] >= 0 and x["wasted"] >= 0 for x in t)
    c = chunk_of_frames(8, 2, 3)
    tok = _result_or_input_error(lambda: rank_tokens(c, a, rank))
    if tok is not None:
        assert rank in (0, 1) and len(tok) == 12


@settings(max_examples=max(30, EXAMPLES // 5), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fsdp=FLAG, offload=FLAG, parallel_vae=FLAG,
       max_seconds=st.one_of(st.none(), NUMBER, st.sampled_from([True, "100", 1e300])),
       model=st.sampled_from(["wan2.1-t2v-14b", "mochi-1", "hunyuanvideo-13b"]),
       gpus=st.one_of(st.sampled_from([1, 2, 8]), st.sampled_from(HOSTILE)),
       nodes=st.one_of(st.sampled_from([1, 2]), st.sampled_from(HOSTILE)))
def test_the_planner_takes_typed_flags_or_refuses(fsdp, offload, parallel_vae, max_seconds,
                                                  model, gpus, nodes):
    from cpcourse.planner.throughput import group_sizes, throughput

    g = _result_or_input_error(lambda: group_sizes(gpus, nodes))
    if g is not None:
        assert g and all(gpus % x == 0 for x in g)
    d = _result_or_input_error(lambda: throughput(model, gpus=8, fsdp=fsdp, offload=offload,
                                                  parallel_vae=parallel_vae,
                                                  max_seconds=max_seconds))
    if d is not None:
        assert all(isinstance(f, bool) for f in (fsdp, offload, parallel_vae))
        assert d["fsdp"] is fsdp and d["offload"] is offload and d["vae_parallel"] is parallel_vae
        assert max_seconds is None or (isinstance(max_seconds, float)
                                       and math.isfinite(max_seconds) and max_seconds > 0)


@pytest.mark.parametrize("call", [lambda: window_starts(8, 4, 0),
                                  lambda: frame_weights(8, [0], 4),
                                  lambda: layouts(12, heads=0)])
def test_the_fuzz_can_fail(call):
    """Each of these once returned a silent wrong answer or a raw error: they must refuse."""
    with pytest.raises(InputError):
        call()
