"""`cpcourse demo` and `cpcourse bench ring` end to end, small: one launch each.

    python -m pytest tests/dist/test_demo_bench.py -q
"""

import json

import pytest

from cpcourse.bench import ring as bench_ring
from cpcourse.cli import demo
from cpcourse.sim import bytes_sent, simulate_ring
from cpcourse.support.errors import InputError

pytestmark = pytest.mark.dist


def test_demo_checks_the_ring_and_reports_every_step(capsys):
    argv = ["--nproc", "3", "--seq-len", "50", "--heads", "2", "--head-dim", "8", "--json"]
    assert demo.main(argv) == 0
    report = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert report["ok"] and report["max_abs_err"] <= 1e-5
    assert sorted((s["step"], s["rank"]) for s in report["steps"]) == [
        (s, r) for s in range(3) for r in range(3)]
    from cpcourse.runs.demo import DemoRequest, inputs

    q, k, v = inputs(DemoRequest(nproc=3, seq_len=50, heads=2, head_dim=8))
    expected = bytes_sent(simulate_ring(q, k, v, 3).events, 3)
    measured = [sum(s["bytes_sent"] for s in report["steps"] if s["rank"] == r)
                for r in range(3)]
    assert measured == expected


@pytest.mark.parametrize("argv, what", [
    (["--nproc", "0"], "nproc must be > 0"),  # the library's word; `cpcourse` says the flag
    (["--seq-len", "-3"], "seq_len must be > 0"),
    (["--dtype", "fp8"], "invalid choice"),
])
def test_demo_bad_input(argv, what):
    with pytest.raises(InputError, match=what):
        demo.main(argv)


def test_bench_ring_quick_reports_every_method(capsys):
    methods = "ring_overlap,ring_blocking,allgather,ulysses,fused"  # torch CP: ~1 min first call
    assert bench_ring.main(["--quick", "--nproc", "2", "--json", "--methods", methods]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["methods"]["torch_cp"] == {"skipped": "not selected (--methods)"}
    for name in methods.split(","):
        m = report["methods"][name]
        assert m["seconds"] > 0 and m["max_abs_diff_vs_fused"] <= 1e-5, (name, m)
        # the memory accounting in predicted_peak_bytes describes what the code allocates
        assert 0.75 <= m["peak_bytes_per_rank"] / m["predicted_peak_bytes"] <= 1.25, (name, m)
    assert report["methods"]["fused"]["ratio_vs_fused"] == 1.0
    assert [s["step"] for s in report["steps"]] == [0, 1]
    per_hop = 2 * 8 * 512 * 64 * 4  # K and V of one 512-token shard, float32
    assert [s["bytes_sent_per_rank"] for s in report["steps"]] == [per_hop, 0]
    assert 0.0 <= report["comm_hidden_share"] <= 1.0
    assert set(report["targets"]) >= {"overlap_within_fused_x1.05", "overlap_faster_than_blocking"}


def test_bench_ring_bad_input():
    with pytest.raises(InputError, match="methods: unknown nope"):
        bench_ring.main(["--methods", "ring_overlap,nope"])
    with pytest.raises(InputError, match="must include ring_overlap"):
        bench_ring.main(["--methods", "allgather"])


def test_predicted_memory_of_one_rank_is_the_whole_problem():
    for method in ("ring_overlap", "allgather", "ulysses", "fused"):
        assert bench_ring.predicted_peak_bytes(method, 100, 1, 2, 8) == 100 * (2 * 8 * 4 + 2 * 4)
    assert bench_ring.predicted_peak_bytes("torch_cp", 100, 2, 2, 8) is None


def test_bench_mesh_reports_every_2_rank_layout_exactly(capsys):
    from cpcourse.bench import mesh as bench_mesh

    assert bench_mesh.main(["--steps", "1", "--repeats", "1", "--frames", "4", "--size", "8",
                            "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["layout"] for r in report["layouts"]] == list(bench_mesh.LAYOUTS)
    for row in report["layouts"]:
        assert row["max_abs_err"] < 1e-5 and row["bytes_match_prediction"], row
        dim = row["layout"].split("=")[0]
        assert row["bytes_per_step_by_dim"][dim] > 0  # the one busy dim sent something
        assert sum(v for k, v in row["bytes_per_step_by_dim"].items() if k != dim) == 0
    assert report["cfg_parallel_ratio"] == report["layouts"][0]["ratio_to_single"] > 0


def test_bench_ring_small_measures_the_parts_of_a_call(capsys):
    from cpcourse.bench import overhead

    assert overhead.main(3, True) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["tokens_per_rank"] for r in report["rows"]] == list(overhead.SIZES)
    for row in report["rows"]:
        assert row["ratio"] > 0 and row["agree_s"] > 0 and row["merge_s"] > 0
