"""The tiny DiT samples wherever its weights are: every tensor the sampler and the model make
follows the model's device. Checked on the meta device, which refuses to mix with CPU tensors
exactly as CUDA does, so a CPU-only machine catches what would break on a GPU."""

from __future__ import annotations

from cpcourse.tinydit.training import generate_clip, load_shapes_model


def test_generate_clip_follows_the_models_device():
    model = load_shapes_model().to("meta")
    clip = generate_clip(model, "square-up", seed=1, steps=2)
    assert clip.device.type == "meta" and clip.shape[1] == 3
