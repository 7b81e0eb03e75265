"""assert_close: passes what is close, and a failure says where, by how much, and what to check.

    python -m pytest tests/unit/test_testing.py
"""

from __future__ import annotations

import math

import pytest
import torch

from cpcourse.course.testing import assert_close, sequence_coords, shard_bounds


def report(actual, expected, **kw) -> str:
    with pytest.raises(AssertionError) as info:
        assert_close(actual, expected, **kw)
    return str(info.value)


def test_close_values_pass():
    x = torch.randn(2, 3, 5, 4)
    assert_close(x, x.clone())
    assert_close(x, x.double() + 1e-7)
    assert_close(x.to(torch.bfloat16), x, atol=1e-2, rtol=1e-2)
    assert_close(3, 3)
    assert_close(0.1 + 0.2, 0.3)
    assert_close(torch.tensor([math.nan, math.inf, -math.inf]),
                 torch.tensor([math.nan, math.inf, -math.inf]))


def test_worst_element_is_named_and_mapped():
    expected = torch.zeros(2, 4, 12, 8)
    actual = expected.clone()
    actual[1, 2, 7, 5] = 0.5   # the worst
    actual[1, 2, 6, 5] = 0.01
    text = report(actual, expected, dims=("B", "H", "L", "D"), name="out",
                  coords={"L": sequence_coords(12, world_size=4, grid=(3, 2, 2))},
                  hint="check the merge")
    lines = text.splitlines()
    assert lines[0] == "out: 2 of 768 elements differ (0.26%) beyond atol=1e-05, rtol=1.3e-06"
    # L=7 of 12 over 4 ranks: rank 2 holds 6..8, offset 1; (t, h, w) = (3, 2, 2) -> frame 1.
    assert lines[1] == ("  worst at index [1, 2, 7, 5] (B=1, H=2, L=7, D=5 -> rank 2, offset 1,"
                        " frame 1, row 1, col 1)")
    assert lines[2] == "    expected 0, got 0.5"
    assert "max abs err 0.5" in lines[3]
    assert lines[4] == "  failures span: B 1 (1 of 2); H 2 (1 of 4); L 6..7 (2 of 12); D 5 (1 of 8)"
    assert lines[-1] == "  hint: check the merge"


def test_coords_callable_gets_the_whole_index():
    seen = []

    def where(index):
        seen.append(index)
        return {"ring_step": index[0] % 3}

    text = report(torch.ones(5, 2), torch.zeros(5, 2) + torch.eye(5, 2), coords=where)
    assert "ring_step" in text and seen and len(seen[0]) == 2


def test_numbers_and_ints_compare_exactly():
    text = report(432_001, 432_000, name="count_video_tokens(720, 1280, 120)", hint="T first")
    assert text.splitlines() == [
        "count_video_tokens(720, 1280, 120): expected 432,000, got 432,001",
        "  abs err 1", "  hint: T first"]
    assert "beyond" in report(torch.tensor([1, 2]), torch.tensor([1, 3]))


def test_shape_mismatch_names_the_dims():
    text = report(torch.zeros(2, 8, 10, 4), torch.zeros(2, 8, 12, 4), dims=("B", "H", "L", "D"))
    assert text == "value: shape [B=2, H=8, L=10, D=4], expected [B=2, H=8, L=12, D=4]"


def test_nan_is_a_failure_and_named():
    expected = torch.ones(3, 3)
    actual = expected.clone()
    actual[2, 1] = math.nan
    text = report(actual, expected, dims=("row", "col"))
    assert "worst at index [2, 1] (row=2, col=1)" in text and "got nan" in text
    assert "1 NaN where a number was expected" in text


def test_default_tolerance_follows_the_least_precise_dtype():
    want = torch.full((4,), 1.0, dtype=torch.float64)
    assert_close(torch.full((4,), 1.01, dtype=torch.bfloat16), want)  # bf16: rtol 1.6e-2
    assert "rtol=1.3e-06" in report(torch.full((4,), 1.0001), want)   # float32
    assert_close(torch.full((4,), 1.0001), want, rtol=1e-3)


def test_any_dtype_and_device_compares_in_float64():
    a = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert_close(a, torch.tensor([1, 2]))
    big = torch.tensor([2.0**40 + 1], dtype=torch.float64)  # equal once rounded to float32
    assert "beyond" in report(big, torch.tensor([2**40]), rtol=0, atol=0)


def test_not_a_number_is_reported():
    assert "not a number or tensor" in report(object(), 1.0)


@pytest.mark.parametrize("length, world", [(10, 3), (7, 7), (5, 8), (16, 4)])
def test_shard_bounds_match_tensor_split(length, world):
    want = [(int(c[0]), int(c[-1]) + 1) if len(c) else None
            for c in torch.arange(length).tensor_split(world)]
    got = shard_bounds(length, world)
    assert [b if b[0] < b[1] else None for b in got] == want


def test_sequence_coords_without_world_or_grid():
    assert sequence_coords(24, grid=(2, 3, 4))(13) == {"frame": 1, "row": 0, "col": 1}
    assert sequence_coords(10, world_size=3)(4) == {"rank": 1, "offset": 0}
