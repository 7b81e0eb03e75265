"""`cpcourse bench kernel` in quick mode: the JSON has the promised keys and sane values (no times
are asserted: the machine is shared and noisy).

    python -m pytest tests/unit/test_bench_kernel.py -q
"""

from __future__ import annotations

import json

import pytest

from cpcourse import cli
from cpcourse.bench import kernel as bench_kernel
from cpcourse.support.errors import InputError

IMPLS = ("attention_with_lse", "sdpa", "naive")


def run_json(capsys, argv):
    assert bench_kernel.main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # exactly one JSON object on stdout


def test_quick_json_keys_and_sanity(capsys):
    res = run_json(capsys, ["--quick", "--json", "--lengths", "33,64"])
    for key in ("device", "dtype", "batch", "heads", "head_dim", "threads", "repeats", "backend",
                "rows", "target_ratio_vs_sdpa", "min_ratio_vs_sdpa", "target_met", "gpu",
                "load_average"):
        assert key in res, key
    assert res["device"] == "cpu" and res["dtype"] == "fp32" and res["backend"] == "cpu-flash"
    assert [r["length"] for r in res["rows"]] == [33, 64]
    for r in res["rows"]:
        n = r["length"]
        assert r["flops"] == 4 * res["batch"] * res["heads"] * n * n * res["head_dim"]
        assert r["max_abs_diff_vs_sdpa"] < 1e-5  # the same numbers as SDPA
        for name in IMPLS:
            m = r[name]
            assert 0 < m["min_seconds"] <= m["seconds"] and m["calls_per_sample"] >= 1
            assert m["gflops"] == pytest.approx(r["flops"] / m["seconds"] / 1e9)
        assert r["ratio_vs_sdpa"] == pytest.approx(
            r["attention_with_lse"]["gflops"] / r["sdpa"]["gflops"])
        assert r["best_ratio_vs_sdpa"] == pytest.approx(
            r["sdpa"]["min_seconds"] / r["attention_with_lse"]["min_seconds"])
        assert r["naive_skipped"] is None and r["naive_ratio_vs_sdpa"] > 0
    assert res["min_ratio_vs_sdpa"] == min(r["ratio_vs_sdpa"] for r in res["rows"])
    assert res["target_met"] == (res["min_ratio_vs_sdpa"] >= 0.95)


def test_naive_is_skipped_with_a_reason_and_text_table(capsys):
    res = run_json(capsys, ["--quick", "--json", "--lengths", "48", "--naive-max-gb", "1e-6"])
    row = res["rows"][0]
    assert row["naive"] is None and row["naive_ratio_vs_sdpa"] is None
    assert "--naive-max-gb" in row["naive_skipped"]
    assert bench_kernel.main(["--quick", "--lengths", "48", "--naive-max-gb", "1e-6"]) == 0
    text = capsys.readouterr().out
    assert "skipped" in text and "attention_with_lse" in text and "GFLOP/s" in text


def test_through_the_cli_and_bad_input_exits_2(capsys):
    assert cli.main(["bench", "kernel", "--quick", "--json", "--lengths", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["length"] == 16
    for bad in (["--lengths", "12,x"], ["--dtype", "fp8"], ["--repeats", "0"],
                ["--lengths", "-5"], ["--device", "tpu"], ["--threads", "100000"],
                ["--lengths", "12345678901234567890"], ["--lengths", "16,1048577"]):
        with pytest.raises(InputError):
            bench_kernel.main(["--quick", *bad])
        assert cli.main(["bench", "kernel", "--quick", *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
