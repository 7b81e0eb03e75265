"""`cpcourse plan`: a pipeline flag that cannot change the answer is refused saying why, a part
the planner does not cost reads "not counted", never 0.0 GB or 0 s, and the Python entry points
take only typed flags (issue 51; probe C3, C6, C8, C9 and the earlier #16).

    python -m pytest tests/unit/test_plan_no_effect.py -q
"""

from __future__ import annotations

import json

import pytest

from cpcourse.cli import main
from cpcourse.planner.plan import NOT_COUNTED, plan
from cpcourse.planner.throughput import group_sizes, throughput
from cpcourse.support.errors import InputError


def _run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, words", [
    (["--model", "step-video-t2v-30b", "--text-encoder", "cpu"],
     "step-video-t2v-30b has no text-encoder size"),
    (["--model", "cosmos-1.0-diffusion-7b", "--text-encoder", "freed"], "--text-encoder"),
    (["--model", "cosmos-predict2-2b", "--text-encoder-cpu"], "no text-encoder size"),
    (["--model", "open-sora-1.2-stdit3", "--offload"],
     "--offload: open-sora-1.2-stdit3 has no text-encoder size"),
    (["--model", "latte-xl-2", "--objective", "throughput", "--offload"], "offloading has no"),
    (["--model", "hunyuanvideo-13b", "--released"], "runs in bf16 throughout"),
])
def test_flags_that_change_nothing_are_refused(capsys, argv, words):
    code, out, err = _run(capsys, *argv, "--gpus", "8", "--json")
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err, err


def test_the_flags_still_act_where_they_change_the_answer():
    wan = "wan2.1-t2v-14b"
    base = plan(wan, gpus=8)
    for kw in ({"text_encoder": "cpu"}, {"offload": True}, {"released": True}):
        assert plan(wan, gpus=8, **kw)["per_gpu_bytes"] != base["per_gpu_bytes"], kw


@pytest.mark.parametrize("model", ["mochi-1", "cosmos-1.0-diffusion-7b", "wan2.2-ti2v-5b"])
def test_parts_not_counted_are_null_and_say_so(capsys, model):
    d = plan(model, gpus=8)
    te = d["text_encoder"]
    if not d["breakdown"]["memory_counted"]["text_encoder"]:
        assert te["bytes_per_gpu"] is None and te["seconds"] is None
    if not d["breakdown"]["memory_counted"]["vae_decode"]:
        assert d["vae_decode_working_bytes"] is None
    code, out, _ = _run(capsys, "--model", model, "--gpus", "8")
    assert code == 0 and NOT_COUNTED in out
    assert "0.0 GB per GPU while encoding" not in out and "working set 0.0 GB" not in out
    code, out, _ = _run(capsys, "--model", model, "--gpus", "8", "--json")
    assert code == 0 and json.loads(out)["model"] == model  # null is valid JSON; NaN is not


def test_throughput_json_says_which_pipeline_it_assumed(capsys):
    code, out, _ = _run(capsys, "--model", "wan2.1-t2v-14b", "--gpus", "8", "--objective",
                        "throughput", "--fsdp", "--offload", "--text-encoder", "cpu",
                        "--parallel-vae", "--json")
    d = json.loads(out)
    assert code == 0 and d["fsdp"] is True and d["offload"] is True and not d["released"]
    assert d["text_encoder"] == {"place": "cpu"} and d["vae_parallel"] is True


@pytest.mark.parametrize("call, words", [
    (lambda: plan("wan2.1-t2v-14b", gpus=8, fsdp="no"), "fsdp must be True or False"),
    (lambda: plan("wan2.1-t2v-14b", gpus=8, released="no"), "released must be True or"),
    (lambda: plan("wan2.1-t2v-14b", gpus=8, offload="false"), "offload must be True or"),
    (lambda: plan("wan2.1-t2v-14b", gpus=8, parallel_vae="no"), "parallel_vae must be"),
    (lambda: plan("wan2.1-t2v-14b", gpus=8, text_encoder_cpu=1), "text_encoder_cpu must"),
    (lambda: throughput("wan2.1-t2v-14b", gpus=8, max_seconds=True), "max_seconds must be a"),
    (lambda: throughput("wan2.1-t2v-14b", gpus=8, max_seconds="100"), "max_seconds must be a"),
    (lambda: group_sizes(8, 0), "nodes must be > 0"),
    (lambda: group_sizes(-8, 1), "gpus must be > 0"),
    (lambda: group_sizes(8, 3), "do not split evenly"),
])
def test_the_python_entry_points_take_typed_flags(call, words):
    with pytest.raises(InputError, match=words):
        call()
