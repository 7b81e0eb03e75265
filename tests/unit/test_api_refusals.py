"""The Python APIs refuse what the command line refuses, with a ValueError (InputError) in the
CLI's words, never a raw ZeroDivisionError, IndexError or torch RuntimeError, and never a silent
answer to nonsense (issue 51; probe #3, #10, #11, C10).

    python -m pytest tests/unit/test_api_refusals.py -q
"""

from __future__ import annotations

import pytest
import torch

from cpcourse.support.errors import InputError


def _refuses(call, words: str) -> None:
    with pytest.raises(InputError) as info:
        call()
    assert isinstance(info.value, ValueError) and words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_quality_measures_refuse_mismatched_empty_and_non_finite_clips():
    from cpcourse.approx.quality import compare, psnr

    a = torch.rand(8, 3, 4, 4)
    b = a.clone()
    b[0, 0, 0, 0] = float("nan")
    for call, words in ((lambda: psnr(a, a[:1].clone()), "differ in shape"),
                        (lambda: compare(a, a[:, :1]), "differ in shape"),
                        (lambda: psnr(a, b), "not finite"),
                        (lambda: psnr(torch.zeros(0, 3, 4, 4), torch.zeros(0, 3, 4, 4)),
                         "is empty")):
        _refuses(call, words)
    assert psnr(a, a) is None and compare(a, a)["max_abs_diff_vs_exact"] == 0


def test_causal_chunk_helpers_refuse_nonsense():
    from cpcourse.causal.chunks import (
        assign_chunks,
        chunk_of_frames,
        chunk_work,
        imbalance,
        rank_tokens,
        ring_traffic,
    )
    from cpcourse.causal.kvcache import check_design

    c = chunk_of_frames(8, 2, 3)
    a = assign_chunks(4, 2, "zigzag")
    for call, words in ((lambda: imbalance([0, 0]), "not all 0"),
                        (lambda: imbalance([]), "per_rank"),
                        (lambda: ring_traffic([[0], [1, 2]], [1, 1]), "only 2 chunks"),
                        (lambda: rank_tokens(c, a, 5), "rank must be in [0, 2)"),
                        (lambda: rank_tokens(c, a, -1), "rank must be in [0, 2)"),
                        (lambda: chunk_work([-1, 2]), "positive whole token counts"),
                        (lambda: check_design("pass-q", 4, 0), "world must be > 0"),
                        (lambda: check_design("ulysses", 0, 2), "heads must be > 0")):
        _refuses(call, words)
    assert imbalance([1, 3]) == 1.5 and chunk_work([1, 2]) == [1, 6]


def test_approx_costs_and_cache_refuse_nonsense():
    from cpcourse.approx.costs import bytes_per_step, cache_bytes_per_step
    from cpcourse.approx.fbcache import FirstBlockCache
    from cpcourse.tinydit.training import shapes_config

    cfg = shapes_config()
    shape = (1, 3, 8, 32, 32)
    for call, words in ((lambda: bytes_per_step("naive", cfg, shape, world=2, rank=5, step=0),
                         "rank must be in [0, 2)"),
                        (lambda: bytes_per_step("bogus", cfg, shape, 1, 0, 0), "method must be"),
                        (lambda: cache_bytes_per_step(0, 0), "world must be > 0"),
                        (lambda: FirstBlockCache(torch.nn.Module(), None, float("nan")),
                         "threshold must be finite")):
        _refuses(call, words)


def test_vae_api_refuses_what_the_vae_command_refuses():
    from cpcourse.models.vae import (
        build_vae,
        check_video_size,
        example_latents,
        predicted_peak_per_rank,
        split_rows,
    )
    from cpcourse.models.vae.decode import decode_rows

    for call, words in ((lambda: check_video_size("wan", "5", 16, 16), "--frames must be a whole"),
                        (lambda: check_video_size("wan", True, 8, 8), "--frames must be a whole"),
                        (lambda: check_video_size("wan", 5.0, 16.0, 16), "must be a whole"),
                        (lambda: build_vae("wan", dtype="float16"), "--dtype must be a torch"),
                        (lambda: build_vae("wan", seed=-1), "--seed"),
                        (lambda: example_latents("wan", batch=0), "batch must be > 0"),
                        (lambda: example_latents("wan", batch=-1), "batch must be > 0"),
                        (lambda: split_rows(2, 3), "use at most 2 ranks"),
                        (lambda: predicted_peak_per_rank(-5, [1, 1]), "peak_single"),
                        (lambda: predicted_peak_per_rank(5, [1, 0]), "sizes")):
        _refuses(call, words)
    vae = build_vae("wan")
    z = example_latents("wan", 1, 16, 8)
    for latents, words in ((z[:, :3], "3 channels, the VAE takes 4"),
                           (z.double(), "latents are torch.float64"),
                           (z[0], "must be [B, C, F_lat, H_lat, W_lat]")):
        _refuses(lambda latents=latents: decode_rows(vae, latents), words)
