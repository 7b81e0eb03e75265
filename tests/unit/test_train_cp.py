"""`cpcourse train --nproc P`: its request checks, refusals before any process starts, and the
arithmetic it reports (training tolerance, predicted activations, traffic).

    python -m pytest tests/unit/test_train_cp.py -q
"""

from __future__ import annotations

from unittest import mock

import pytest

from cpcourse.runs.train_cp import TrainCPRequest, cp_traffic, predicted_activations
from cpcourse.support.errors import InputError
from cpcourse.support.tolerance import tolerance, training_tolerance


@pytest.mark.parametrize("kwargs, words", [
    ({"cp": "usp"}, "--cp must be one of ring, ulysses"),
    ({"nproc": 4, "dp": 3}, "--dp 3 must divide --nproc 4"),
    ({"nproc": 3, "cp": "ulysses"}, "splits the 4 heads over 3 ranks"),
    ({"steps": 0}, "--steps must be > 0"),
    ({"nproc": 4, "dp": 4, "batch": 2}, "more replicas than the batch's 2 clips"),
    ({"nproc": 4, "frames": 3}, "use at most 3 ranks per replica"),
    ({"seed": -1}, "--seed must be"),
])
def test_a_bad_request_is_refused_naming_its_flag(kwargs, words):
    with pytest.raises(InputError) as info:
        TrainCPRequest(**kwargs)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("argv, words", [
    (["--nproc", "2", "--out", "w.safetensors"], "--out has no effect here"),
    (["--nproc", "2", "--minutes", "1"], "--minutes has no effect here"),
    (["--dp", "2", "--out", "w.safetensors", "--steps", "1"], "--dp has no effect here"),
    (["--compare", "--out", "w.safetensors", "--steps", "1"], "--compare has no effect here"),
    (["--checkpoint", "--out", "w.safetensors", "--steps", "1"], "--checkpoint has no effect"),
    (["--nproc", "2", "--cp", "ulysses", "--dp", "3"], "--dp 3 must divide --nproc 2"),
    (["--steps", "1"], "give --out FILE"),
])
def test_the_command_refuses_in_one_line_before_any_process(capsys, argv, words):
    from cpcourse.cli import main

    def no_work(*args, **kwargs):
        raise AssertionError("a process started before the flags were checked")

    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", no_work), \
            mock.patch("cpcourse.tinydit.training.train", no_work):
        code = main(["train", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err, err


def test_training_tolerance_is_the_step_rule_times_the_sgd_sum():
    one = tolerance("ring", "float32", scale=0.5)
    assert training_tolerance(3, 0.05, 0.9, grad_scale=0.5) == pytest.approx(one * 0.05 * 30)
    assert training_tolerance(1, 1.0) == tolerance("ring")  # one plain step: the forward rule
    with pytest.raises(InputError):
        training_tolerance(2, 0.1, momentum=1.0)


def test_predicted_activations_follow_the_tokens_a_rank_holds():
    assert predicted_activations(1000, TrainCPRequest(nproc=2)) == 500
    assert predicted_activations(1000, TrainCPRequest(nproc=4, dp=2)) == 250
    # 8 frames on 3 ranks: the largest shard holds 3 of them
    assert predicted_activations(800, TrainCPRequest(nproc=3)) == 300


def test_the_rings_backward_moves_more_than_its_forward_and_ulysses_the_same():
    rows = {(r["method"], r["pass"]): r for r in cp_traffic(1, 8, 100, 16, world=4)}
    fwd, bwd = rows["ring", "forward"], rows["ring", "backward"]
    assert (fwd["hops"], bwd["hops"]) == (3, 4)
    assert bwd["bytes_sent"] == fwd["bytes_sent"] * 4 * 4 // 3  # 2x tensors, fp32 vs bf16, P hops
    assert rows["ulysses", "forward"]["bytes_sent"] == rows["ulysses", "backward"]["bytes_sent"]
