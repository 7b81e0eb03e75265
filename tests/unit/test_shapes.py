"""Moving shapes: the data, the tracker, training, the shipped weights, the commands around them."""

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.cli import main as cli_main
from cpcourse.support.errors import InputError
from cpcourse.tinydit.model import DiTConfig
from cpcourse.tinydit.moving_shapes import (
    DIRECTIONS,
    PROMPTS,
    SHAPES,
    clip_for,
    matches,
    parse_prompt,
    prompt_name,
    random_clips,
    track,
)
from cpcourse.tinydit.training import (
    TrainConfig,
    evaluate,
    generate_clip,
    load_shapes_model,
    load_weights,
    shipped_path,
    train,
)

TINY = DiTConfig(in_channels=3, patch=8, hidden=32, heads=2, depth=1, num_classes=2,
                 num_motions=4, attention="full", prediction="sample")


def test_clips_have_the_promised_shapes_labels_and_ranges():
    clips, s, d = random_clips(64, torch.Generator().manual_seed(1))
    assert clips.shape == (64, 8, 3, 32, 32) and clips.dtype == torch.float32
    assert 0 <= float(clips.min()) and float(clips.max()) <= 1
    assert set(s.tolist()) == {0, 1} and set(d.tolist()) == set(range(4))
    bright = clips.amax(dim=2)                        # [n, T, H, W]
    # a bright object on a dark background in every frame, and it moves
    assert float(bright.amin(dim=(2, 3)).max()) <= 0.12 + 1e-6
    assert float(bright.amax(dim=(2, 3)).min()) >= 0.7
    assert float((clips[:, 0] - clips[:, -1]).abs().amax(dim=(1, 2, 3)).min()) > 0.5
    # colours, sizes and positions vary: no two clips alike
    assert len({tuple(c[0].flatten()[:64].tolist()) for c in clips}) == 64


def test_same_generator_state_same_clips_and_labels_can_be_fixed():
    a = random_clips(4, torch.Generator().manual_seed(3))
    b = random_clips(4, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    clips, s, d = random_clips(3, torch.Generator(), shape_ids=torch.tensor([1, 1, 0]),
                               direction_ids=torch.tensor([2, 0, 3]))
    assert s.tolist() == [1, 1, 0] and d.tolist() == [2, 0, 3]
    assert clip_for("square-down", seed=4).shape == (8, 3, 32, 32)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), frames=st.integers(2, 16), size=st.integers(24, 48))
def test_tracker_reads_the_label_of_every_training_clip(seed, frames, size):
    """The data's promise, any size: the shape stays whole inside the frame and moves in its
    direction fast enough to see, so the tracker recovers both labels from the pixels."""
    clips, s, d = random_clips(4, torch.Generator().manual_seed(seed), frames, size)
    for clip, a, b in zip(clips, s, d, strict=True):
        got = matches(prompt_name(int(a), int(b)), track(clip))
        assert got == {"direction": True, "shape": True, "present_fraction": 1.0}, (a, b)


def test_tracker_says_no_object_and_no_motion_when_there_is_none():
    blank = track(torch.zeros(8, 3, 32, 32))
    noise = track(torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0)))
    for rep in (blank, noise):
        assert not any(rep["present"]) and rep["direction"] == "none" and rep["shape"] == "none"
    still = clip_for("circle-left").clone()
    still[:] = still[0]
    assert track(still)["direction"] == "none" and all(track(still)["present"])
    two = torch.maximum(clip_for("circle-left", 0), clip_for("square-right", 5))
    assert sum(track(two)["present"]) < 8          # two objects are not "one object"
    with pytest.raises(InputError, match=r"\[T, 3, H, W\]"):
        track(torch.zeros(8, 32, 32))


def test_prompts_are_shape_direction_pairs():
    assert len(PROMPTS) == len(SHAPES) * len(DIRECTIONS) and "circle-right" in PROMPTS
    assert all(prompt_name(*parse_prompt(p)) == p for p in PROMPTS)
    with pytest.raises(InputError, match="circle-left, circle-right"):
        parse_prompt("triangle-left")


def test_training_lowers_the_loss_and_saves_what_loads(tmp_path):
    out = tmp_path / "w.safetensors"
    res = train(str(out), steps=40, cfg=TINY, seed=2, threads=2,
                tc=TrainConfig(warmup=5, batch=16))
    first, last = sum(res["losses"][:5]) / 5, sum(res["losses"][-5:]) / 5
    assert res["steps"] == 40 and last < 0.6 * first, (first, last)
    model, meta = load_weights(str(out))
    assert model.cfg == TINY and meta["run"]["steps"] == 40 and meta["train"]["batch"] == 16
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 res["model"].state_dict().values(),
                                                 strict=True))
    # the model samples a clip (shape and range) though it has not learnt much yet
    clip = generate_clip(model, "circle-up", seed=0, steps=2)
    assert clip.shape == (8, 3, 32, 32) and 0 <= float(clip.min()) <= float(clip.max()) <= 1


def test_foreign_weight_files_are_refused(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_text("not weights")
    for path in (str(bad), str(tmp_path / "missing.safetensors")):
        with pytest.raises(InputError, match="weights"):
            load_weights(path)


def test_shipped_weights_are_small_trained_and_draw_what_is_asked():
    """The weights the course ships: at most 10 MB, trained for at most 30 minutes, and for
    seeds 0..3 of every prompt the tracker sees the asked direction and one object."""
    path = shipped_path()
    assert os.path.getsize(path) <= 10 * 2**20
    model, meta = load_weights(path)
    assert meta["run"]["seconds"] <= 30 * 60 and meta["run"]["threads"] <= 2
    res = evaluate(model, seeds=range(4))
    assert res["all"]["direction"] >= 0.9 and res["all"]["present"] >= 0.9, res
    assert res["all"]["shape"] >= 0.9, res


def test_cfg_guidance_matters_for_the_trained_model():
    model = load_shapes_model()
    a = generate_clip(model, "square-left", seed=0, steps=8, cfg_scale=1.0)
    b = generate_clip(model, "square-left", seed=0, steps=8, cfg_scale=4.0)
    assert float((a - b).abs().max()) > 0.05


def _run(capsys, *argv):
    code = cli_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_prompts_and_bad_prompts(capsys):
    code, out, _ = _run(capsys, "generate", "--list-prompts", "--json")
    assert code == 0 and json.loads(out)["prompts"] == list(PROMPTS)
    code, out, _ = _run(capsys, "generate", "--list-prompts")
    assert code == 0 and out.split() == list(PROMPTS)
    for argv, words in ((["--prompt", "cat-left"], "use one of circle-left"),
                        (["--height", "30"], "multiple of the patch size 8"),
                        (["--height", "100000"], "too large"),
                        (["--frames", "1000"], "trained on 8 frames"),
                        (["--label", "2"], "the trained model takes --prompt"),
                        (["--attention", "factored"], "--attention has no effect here"),
                        (["--weights", "random", "--prompt", "circle-up"], "needs trained"),
                        (["--weights", "random", "--gif", "/tmp/x.gif"], "not pixels"),
                        (["--weights", "/nonexistent.safetensors"], "no such file"),
                        (["--weights", "/"], "is a directory"),
                        (["--steps", "100000"], "at most 1000")):
        code, out, err = _run(capsys, "generate", "--nproc", "1", *argv)
        assert code == 2 and out == "" and words in err and err.count("\n") == 1, (argv, err)


def test_train_and_bench_shapes_refuse_bad_input(capsys, tmp_path):
    for argv, words in ((["train", "--out", str(tmp_path / "x")], "--minutes M or --steps"),
                        (["train", "--out", str(tmp_path / "no" / "x"), "--steps", "1"],
                         "does not exist"),
                        (["train", "--out", str(tmp_path), "--steps", "1"], "is a directory"),
                        (["train", "--out", str(tmp_path / "x"), "--minutes", "nan"],
                         "--minutes must be"),
                        (["train", "--out", str(tmp_path / "x"), "--steps", "0"], "--steps"),
                        (["train", "--out", str(tmp_path / "x"), "--steps", "1", "--threads",
                          "100000"], "--threads must be"),
                        (["bench", "shapes", "--seeds", "0"], "--seeds"),
                        (["bench", "shapes", "--weights", str(tmp_path / "none")],
                         "no such file")):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and words in err and err.count("\n") == 1, (argv, err)
    assert list(tmp_path.iterdir()) == []


def test_evaluate_refuses_more_seeds_than_one_batch_holds():
    """Every seed's noise goes into one batch: 100000 seeds was a 10 GB allocation."""
    from cpcourse.tinydit.training import MAX_EVAL_SEEDS

    with pytest.raises(InputError, match=f"at most {MAX_EVAL_SEEDS} seeds"):
        evaluate(load_shapes_model(), seeds=range(MAX_EVAL_SEEDS + 1))


def test_train_command_prints_progress_and_json(capsys, tmp_path):
    out = tmp_path / "w.safetensors"
    code, stdout, err = _run(capsys, "train", "--out", str(out), "--steps", "3", "--json")
    report = json.loads(stdout)
    assert code == 0 and report["steps"] == 3 and out.exists() and "loss" in err


def test_gif_and_html_show_every_frame(tmp_path):
    from PIL import Image

    from cpcourse.viz.clips import clips_html, save_gif

    clip = clip_for("circle-up", seed=2)
    save_gif(clip, str(tmp_path / "c.gif"), scale=3)
    with Image.open(tmp_path / "c.gif") as im:
        assert im.n_frames == 8 and im.size == (96, 96)
        im.seek(3)
        frame = torch.from_numpy(np.asarray(im.convert("RGB"), dtype=np.float32))
    want = (clip[3] * 255).round().repeat_interleave(3, 1).repeat_interleave(3, 2)
    # a GIF frame has a 256-colour palette: close to the clip's frame, not equal
    assert float((frame.permute(2, 0, 1) - want).abs().mean()) < 4
    html = clips_html({"a": clip, "b": clip})
    assert html.count("data:image/gif;base64,") == 2 and ">a<" in html


def test_bench_shapes_reports_every_prompt(capsys):
    code, out, err = _run(capsys, "bench", "shapes", "--seeds", "1", "--steps", "6", "--json")
    report = json.loads(out)
    lines = [line for line in err.splitlines() if line.strip().startswith("[")]
    assert [line.split()[1] for line in lines] == list(PROMPTS)  # progress, on stderr
    assert code == 0 and set(report["per_prompt"]) == set(PROMPTS)
    assert report["training_data"]["direction"] == 1.0 and report["all"]["clips"] == 8
    assert report["trained"]["steps"] > 0
