"""cpcourse.fp8_comm: messages of exactly the counted bytes, their rounding, the planted clip.

    python -m pytest tests/unit/test_fp8_comm.py -q
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.fp8_comm import COMM_DTYPES, Codec, calibrated_scale, planted_clipping, roundtrip
from cpcourse.support.errors import InputError


def codecs(x):
    return [Codec("fp32"), Codec("bf16"), Codec("fp8"),
            Codec("fp8-tensor", calibrated_scale(float(x.abs().max()) or 1.0))]


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4), seed=st.integers(0, 999),
       big=st.floats(1e-3, 1e3))
def test_messages_hold_exactly_the_counted_bytes_and_round_as_promised(shape, seed, big):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * big
    for c in codecs(x):
        msg = c.encode(x)
        assert msg.dtype == torch.uint8 and msg.numel() == c.nbytes(x.shape)
        back = roundtrip(x, c)
        assert back.shape == x.shape and back.dtype == x.dtype
        # bf16 keeps 8 significant bits; e4m3 4 (relative 2^-4 of each row's amax at worst,
        # plus the bf16 rounding of the per-row scale); a calibrated scale with headroom: 2^-3
        rel = {"fp32": 0.0, "bf16": 2**-8, "fp8": 2**-4 * 1.01, "fp8-tensor": 2**-3}[c.kind]
        rows = x.abs().amax(-1, keepdim=True) if c.kind == "fp8" else x.abs().max()
        assert ((back - x).abs() <= rel * rows.expand_as(x) + 1e-30).all(), c.kind


def test_fp8_halves_bf16_bytes_with_scales_counted():
    shape = (2, 4, 1024, 128)  # [2 (k, v), heads, tokens, head_dim]: the real head size
    ratio = Codec("fp8").nbytes(shape) / Codec("bf16").nbytes(shape)
    assert ratio == pytest.approx(0.5, rel=0.02) and ratio > 0.5   # 130 / 256
    assert Codec("fp8-tensor", 1.0).nbytes(shape) / Codec("bf16").nbytes(shape) == \
        pytest.approx(0.5, rel=1e-5)


def test_a_once_calibrated_scale_clips_later_and_per_token_does_not():
    got = planted_clipping(growth=4.0)
    assert got["clipped_fraction"] > 0.01
    assert got["rel_err_calibrated_tensor"] > 0.3
    assert got["rel_err_per_token"] < 0.07
    calm = planted_clipping(growth=1.0)
    assert calm["clipped_fraction"] == 0.0 and calm["rel_err_calibrated_tensor"] < 0.13


def test_bad_codecs_are_refused():
    assert set(COMM_DTYPES) == {"fp32", "bf16", "fp8", "fp8-tensor"}
    with pytest.raises(InputError, match="comm_dtype must be one of"):
        Codec("fp4")
    with pytest.raises(InputError, match="needs a calibrated scale"):
        Codec("fp8-tensor")
    with pytest.raises(InputError, match="scale must be"):
        Codec("fp8-tensor", -1.0)


def test_the_planners_scale_matches_the_messages():
    from cpcourse.planner.costs import comm_dtype_scale

    for d in (16, 32, 128):
        shape = (2, 4, 64, d)
        for kind in ("fp32", "bf16", "fp8"):
            c = Codec(kind)
            assert comm_dtype_scale(kind, d) == pytest.approx(
                c.nbytes(shape) / Codec("bf16").nbytes(shape))
        assert comm_dtype_scale("fp8-tensor", d) == pytest.approx(
            Codec("fp8-tensor", 1.0).nbytes(shape) / Codec("bf16").nbytes(shape), rel=1e-3)
    assert comm_dtype_scale("fp8", 128, dtype="fp32") == pytest.approx(130 / 512)
    with pytest.raises(InputError, match="comm_dtype"):
        comm_dtype_scale("fp4", 128)
