"""The planner: layouts that respect heads, nodes and memory, with the facts sheet's lessons."""

import pytest

from cpcourse.planner.plan import plan
from cpcourse.support.errors import InputError


def test_cosmos_on_two_nodes_spans_them_with_cfg_not_tp():
    p = plan("cosmos-1.0-diffusion-7b", gpus=16, nodes=2)
    assert p.layout.cfg == 2 and p.layout.tp == 1 and p.layout.cp == 8
    assert p["links"]["ring"] in (None, "nvlink4") and p["fits"]


def test_guidance_distilled_model_gets_no_cfg_parallel():
    p = plan("hunyuanvideo-13b", gpus=8)
    assert p.layout.cfg == 1 and p.layout.cp * p.layout.tp == 8


def test_every_alternative_respects_head_divisibility():
    p = plan("wan2.1-t2v-1.3b", gpus=8)
    for alt in p.alternatives:
        lay = alt["layout"]
        assert 12 % (lay["ulysses"] * lay["tp"]) == 0
        assert lay["cfg"] * lay["tp"] * lay["ring"] * lay["ulysses"] == 8


def test_more_gpus_shrink_the_loop_not_the_replicated_pipeline():
    one = plan("wan2.1-t2v-14b", gpus=1)
    eight = plan("wan2.1-t2v-14b", layout="cfg=2,ulysses=4", gpus=8)
    ph1, ph8 = one["breakdown"]["memory_phases"], eight["breakdown"]["memory_phases"]
    assert ph8["denoise"] < ph1["denoise"]  # the sequence is split: activations shrink
    # whole weights, the text encoder and the VAE on every GPU, and rank 0 decodes the same video
    assert ph8["decode"] == ph1["decode"] == one["per_gpu_bytes"] == eight["per_gpu_bytes"]
    sharded = plan("wan2.1-t2v-14b", layout="cfg=2,ulysses=4", gpus=8, fsdp=True)
    assert sharded["per_gpu_bytes"] < eight["per_gpu_bytes"]  # FSDP shards what replicates
    assert eight["seconds_per_step"] < one["seconds_per_step"]


def test_bad_input():
    with pytest.raises(InputError, match="do not split evenly"):
        plan("wan2.1-t2v-14b", gpus=6, nodes=4)
    with pytest.raises(InputError, match="unknown model"):
        plan("sora-2", gpus=8)


@pytest.mark.parametrize("kwargs,words", [
    ({"height": float("nan")}, "height must be a whole number, got nan"),
    ({"gpus": float("inf")}, "gpus must be a whole number, got inf"),
    ({"layout": 8}, "layout must be a Layout or a string"),
    ({"gpu": 100}, "gpu must be an id"),
])
def test_wrong_types_and_non_finite_sizes_are_named(kwargs, words):
    with pytest.raises(InputError, match=words):
        plan("wan2.1-t2v-1.3b", **kwargs)
    with pytest.raises(InputError, match="model must be a preset id"):
        plan(8)
