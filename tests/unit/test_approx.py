"""`cpcourse generate --approx` and `--cache` refuse bad input in one line before any process
starts, and the quality and byte formulas behave at their edges.

    python -m pytest tests/unit/test_approx.py -q
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.approx.costs import bytes_per_step
from cpcourse.approx.quality import compare, psnr
from cpcourse.cli import main
from cpcourse.tinydit.training import shapes_config


@pytest.mark.parametrize("argv, says", [
    (["--approx", "bogus"], "--approx: invalid choice"),
    (["--approx", "displaced", "--warmup", "-1"], "--warmup must be >= 0"),
    (["--approx", "pipefusion", "--patches", "9"], "--patches 9"),
    (["--approx", "naive", "--patches", "3"], "--patches has no effect here"),
    (["--approx", "asyncdiff", "--split", "space"], "asyncdiff splits the model, not the video"),
    (["--approx", "naive", "--split", "space", "--nproc", "3"], "the 4 rows of tokens"),
    (["--approx", "naive", "--layout", "cfg=2"], "--layout has no effect with --approx"),
    (["--approx", "naive", "--weights", "random"], "--approx has no effect here"),
    (["--cache-threshold", "0.1"], "--cache-threshold has no effect here"),
    (["--cache", "fbcache", "--approx", "asyncdiff"], "not of asyncdiff"),
    (["--approx", "naive", "--nproc", "3"], "--nproc 3 does not divide"),
    (["--approx", "asyncdiff", "--nproc", "7"], "--nproc 7: asyncdiff gives each rank"),
    (["--approx", "naive", "--steps", "2", "--warmup", "1000"],          # probe #8
     "--warmup 1000 is past the run's 2 steps"),
    (["--approx", "naive", "--steps", "2", "--warmup", "99999999999999999999"], "past the run"),
])
def test_refusals_are_one_line_before_any_process(argv, says, capsys):
    def no_launch(*args, **kwargs):
        raise AssertionError("started processes before refusing")

    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", no_launch):
        assert main(["generate", *argv, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


def test_psnr_is_none_for_identical_clips_and_falls_with_the_error(cases_rng):
    gen = torch.Generator().manual_seed(cases_rng.randrange(2**31))
    clip = torch.rand(8, 3, 32, 32, generator=gen)
    assert psnr(clip, clip) is None
    noise = 0.01 * torch.randn(clip.shape, generator=gen)
    near, far = compare(clip + noise, clip), compare(clip + 10 * noise, clip)
    assert near["psnr_vs_exact"] == pytest.approx(far["psnr_vs_exact"] + 20, abs=1e-6)
    assert far["max_abs_diff_vs_exact"] == pytest.approx(10 * near["max_abs_diff_vs_exact"])


def test_one_rank_sends_nothing_and_the_methods_send_less_than_exact_cp():
    cfg, shape = shapes_config(), (1, 3, 8, 32, 32)
    exact = bytes_per_step("exact", cfg, shape, 2, 0, 0)
    assert all(bytes_per_step(m, cfg, shape, 1, 0, 0) == 0 for m in ("exact", "pipefusion"))
    assert bytes_per_step("naive", cfg, shape, 2, 0, 5, warmup=5) == 0
    assert bytes_per_step("naive", cfg, shape, 2, 0, 4, warmup=5) == exact
    assert bytes_per_step("displaced", cfg, shape, 2, 1, 7) == exact
    for m in ("pipefusion", "asyncdiff"):
        assert max(bytes_per_step(m, cfg, shape, 2, r, 0) for r in (0, 1)) < exact / 3, m
    with pytest.raises(ValueError):
        bytes_per_step("bogus", cfg, shape, 2, 0, 0)


@pytest.mark.parametrize("gpu", ["h100", "rtx4090"])
def test_projection_hides_what_overlaps_and_exposes_what_blocks(gpu):
    from cpcourse.approx.projection import project

    r = project("wan2.1-t2v-14b", gpu, 8)
    meth, compute = r["methods"], r["compute_seconds"]
    assert meth["exact"]["bytes_per_step"] == meth["displaced"]["bytes_per_step"] \
        == meth["ring"]["bytes_per_step"]               # the same K/V, sent three ways
    assert meth["exact"]["exposed_seconds"] == meth["exact"]["comm_seconds"]
    for m in ("displaced", "asyncdiff", "pipefusion"):
        assert meth[m]["exposed_seconds"] == pytest.approx(
            max(0.0, meth[m]["comm_seconds"] - compute))
    assert meth["naive"]["bytes_per_step"] == 0
    assert meth["pipefusion"]["bytes_per_step"] < meth["asyncdiff"]["bytes_per_step"] \
        < meth["exact"]["bytes_per_step"]
    assert meth["displaced"]["exposed_seconds"] <= meth["ring"]["exposed_seconds"] \
        <= meth["exact"]["exposed_seconds"]


def test_projection_needs_two_gpus():
    from cpcourse.approx.projection import project
    from cpcourse.support.errors import InputError

    with pytest.raises(InputError, match="at least 2"):
        project("wan2.1-t2v-14b", "h100", 1)


@pytest.mark.parametrize("approx, warmup, cache, skipped, exact", [
    ("naive", 2, None, 0, True), ("pipefusion", 2, None, 0, True), ("naive", 1, None, 0, False),
    (None, 0, "fbcache", 0, True), (None, 0, "fbcache", 1, False)])
def test_every_compare_gives_a_verdict_or_says_why_not(approx, warmup, cache, skipped, exact):
    """Probe #6: a run that took every step synchronously and skipped none is exact CP and gets
    the tolerance rule's verdict; an approximate one says `exact: false` and why."""
    from cpcourse.runs.approx import check_approx, exactness

    req = check_approx(2, 0, prompt="circle-right", approx=approx, warmup=warmup, cache=cache,
                       steps=2)
    v = exactness(req, {"steps_skipped": skipped, "max_abs_diff_vs_exact": 0.0},
                  torch.ones(8, 3, 4, 4))
    assert v["exact"] is exact and (v["within_tolerance"] is True) is exact
    assert (v["tolerance"] is None) is not exact and (v["no_tolerance_because"] is None) is exact


@pytest.mark.parametrize("argv, says", [
    (["--steps", "1", "--warmups", "5", "--thresholds", "0"], "--warmups 5 is past the run's 1"),
    (["--steps", "1", "--warmups", "99999999999999999999"], "--warmups 99999999999999999999"),
])
def test_bench_approx_refuses_warmups_past_the_steps(argv, says, capsys):
    """Probe #8 extended: rows labelled with a warm-up the run never had."""
    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", AssertionError):
        assert main(["bench", "approx", "--seeds", "1", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


def test_memory_per_rank_prices_the_stale_buffers():
    """DistriFusion keeps every layer's K/V of the whole sequence: for Wan 2.1 14B at 720p,
    40 x 75,600 x 5,120 x 2 (K, V) x 2 B = 61.9 GB per forward, twice that with CFG batched,
    whatever P; PipeFusion keeps only its stage's layers, AsyncDiff two hidden states."""
    from cpcourse.approx.projection import memory_per_rank, project

    for world in (2, 8):
        mem = memory_per_rank("wan2.1-t2v-14b", world)
        assert mem["displaced"]["stale"] == 2 * 40 * 2 * 75600 * 5120 * 2
        assert mem["pipefusion"]["stale"] == mem["displaced"]["stale"] // world
        assert mem["asyncdiff"]["stale"] == 2 * 2 * 75600 * 5120 * 2
        assert mem["naive"]["stale"] == 0
        assert mem["pipefusion"]["weights"] == pytest.approx(mem["exact"]["weights"] / world,
                                                             abs=1)
        for row in mem.values():
            assert row["total"] == pytest.approx(row["weights"] + row["stale"]
                                                 + row["activations"], abs=2)
    p = project("wan2.1-t2v-14b", "h100", 8)
    assert not p["methods"]["displaced"]["fits"] and p["methods"]["ring"]["fits"]
    assert p["methods"]["pipefusion"]["fits"]


@pytest.mark.parametrize("rule", ["output", "residual"])
def test_first_block_cache_rules_on_one_process(rule):
    """Threshold 0 never skips (the uncached sample exactly); the residual rule (ParaAttention's)
    keeps its reference at the last full step, so a huge threshold skips every step after the
    first under both rules, and a skipped step never moves the residual rule's reference."""
    import torch

    from cpcourse.approx.fbcache import sample_cached
    from cpcourse.tinydit.model import DiTConfig, build_model
    from cpcourse.tinydit.sampling import initial_noise, sample

    cfg = DiTConfig(in_channels=3, patch=2, hidden=16, heads=2, depth=3, num_classes=4)
    model = build_model(cfg, 0, torch.float64)
    noise = initial_noise((1, 3, 3, 4, 6), 1, torch.float64)
    plain = sample(model, noise, 1, 4, 2.0)
    out, cache = sample_cached(model, noise, 1, 4, 2.0, 0.0, rule)
    assert cache.skipped == 0 and torch.equal(out, plain)
    out, cache = sample_cached(model, noise, 1, 4, 2.0, 1e9, rule)
    assert cache.skipped == 3 and cache.changes[0] is None


@settings(max_examples=20, deadline=None)
@given(model=st.sampled_from(["wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "hunyuanvideo-13b",
                              "cogvideox-5b"]),
       world=st.integers(2, 8))
def test_stale_buffers_order_and_scaling(model, world):
    """Whatever the model and P: displaced keeps L x 2 N h per forward whatever P, PipeFusion at
    most that over P (rounded up to whole layers), AsyncDiff two hidden states, naive nothing;
    the stage methods hold 1/P of the weights."""
    from cpcourse.approx.projection import memory_per_rank
    from cpcourse.planner.tokens import get_model, model_tokens

    m, n = get_model(model), model_tokens(model).sequence_length
    mem = memory_per_rank(model, world)
    per_layer = 2 * n * m.hidden * 2 * m.cfg_forwards
    assert mem["displaced"]["stale"] == m.layers * per_layer
    assert mem["pipefusion"]["stale"] == -(-m.layers // world) * per_layer
    assert mem["asyncdiff"]["stale"] == per_layer and mem["naive"]["stale"] == 0
    assert mem["pipefusion"]["weights"] <= mem["exact"]["weights"] / world + 1
    assert mem["displaced"]["total"] > mem["naive"]["total"]
