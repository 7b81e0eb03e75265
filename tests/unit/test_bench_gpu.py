"""The prepared GPU check's CPU side: the dry run walks every part at tiny sizes, a machine
without CUDA is told so in one line, and the real-size configs are the released models'."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from cpcourse.bench import gpu, gpu_kernels, gpu_models


def test_dry_run_records_every_part(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--dry-run", "--json", "--out", str(out), "--repeat", "1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed == saved
    prov = saved["provenance"]
    assert prov["dry_run"] and prov["device"] == "cpu" and prov["torch"] == torch.__version__
    assert saved["tests"]["collected"] >= 20, saved["tests"]  # every gpu test is found
    k = saved["kernels"]
    assert {r["backend"] for r in k["rates"]} == {"cpu-flash", "torch"}
    assert all(r["tflops"] > 0 for r in k["rates"])
    assert [s["blocks"] for s in k["split"]] == list(gpu_kernels.TINY["split"])
    assert [m["model"] for m in saved["models"]] == [c[0] for c in gpu_models.CASES]
    for m in saved["models"]:
        assert m["seconds_per_forward"] > 0 and m["output_finite"]
        pred = m["predicted"]
        # the planner is asked about the real size, whatever size the dry run ran
        assert pred["sdpa"]["forward_seconds"] > pred["fa3"]["forward_seconds"] > 0
        assert set(m["measured_over_predicted"]) >= {"sdpa", "fa3", "measured_rates"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "cpcourse", "bench", "gpu", "--json",
                          "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "--dry-run" in res.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, flag", [(["--parts", "tests,bogus"], "--parts"),
                                        (["--repeat", "0"], "--repeat"),
                                        (["--budget", "-1"], "--budget"),
                                        (["--out", "/proc/no/such/x.json"], "--out")])
def test_bad_flags_are_named(argv, flag):
    with pytest.raises(gpu.InputError, match=flag):
        gpu._args(["--dry-run", *argv])


@pytest.mark.parametrize("model_id, arch", gpu_models.CASES)
def test_real_configs_have_the_released_sizes(model_id, arch):
    """Built on the meta device (no memory): the parameter count of the released checkpoint
    (Wan2.1 1.3B: 1.42 B, 14B: 14.29 B, HunyuanVideo: 12.82 B) within 10% of the facts sheet's
    count of the blocks, and the layer count of the preset."""
    from cpcourse.planner.tokens import get_model

    model = gpu_models.build_real(model_id, arch, torch.device("meta"))
    params = sum(p.numel() for p in model.parameters())
    preset = get_model(model_id)
    assert abs(params / 1e9 - preset.params_b) <= 0.1 * preset.params_b
    blocks = (len(getattr(model, "transformer_blocks", None) or model.blocks)
              + len(getattr(model, "single_transformer_blocks", [])))
    assert blocks == preset.layers
    inputs = gpu_models.real_inputs(model_id, arch, preset.default_frames, "meta",
                                    torch.bfloat16)
    assert inputs["hidden_states"].shape[2:] == (21 if arch == "wan" else 33,
                                                 preset.default_height // 8,
                                                 preset.default_width // 8)


def test_gpu_ids_from_device_names():
    assert gpu.gpu_id("NVIDIA H200") == "h200-sxm"
    assert gpu.gpu_id("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert gpu.gpu_id("Some Other Card") is None
