"""The prepared GPU check's CPU side (tools/gpu_check): the dry run walks every part at tiny
sizes, a machine without CUDA is told so in one line (also through `cpcourse bench gpu`), and
the real-size configs are the released models'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cpcourse.attention import triton_kernel

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tools/ is the checkout's, not the package's
    sys.path.insert(0, str(ROOT))

from cpcourse.planner.hardware import KERNELS  # noqa: E402
from tools.gpu_check import attention as gpu_attention  # noqa: E402
from tools.gpu_check import check as gpu  # noqa: E402
from tools.gpu_check import kernels as gpu_kernels  # noqa: E402
from tools.gpu_check import models as gpu_models  # noqa: E402
from tools.gpu_check import serial as gpu_serial  # noqa: E402


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """One dry run of every part (the first run's and the second's), shared by the tests."""
    out = tmp_path_factory.mktemp("gpu") / "gpu.json"
    argv = ["--dry-run", "--json", "--out", str(out), "--repeat", "1", "--parts",
            ",".join(gpu.PARTS)]
    res = gpu.collect(gpu._args(argv), argv)
    gpu.write_text(str(out), json.dumps(res) + "\n", "--out")
    return json.loads(out.read_text())


def test_dry_run_records_every_part(dry, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu.main(["--dry-run", "--json", "--out", str(out), "--repeat", "1",
                     "--parts", "fp8,encoder"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())
    saved = dry
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


@pytest.mark.parametrize("part", [p for p in gpu.PARTS if p not in ("tests", "models")])
def test_every_section_carries_its_provenance(dry, part):
    sec = dry[part]
    assert "error" not in sec and "skipped" not in sec, sec
    assert set(sec["provenance"]) >= {"gpu", "gpu_id", "torch", "cuda", "cudnn", "driver",
                                      "date"}
    assert sec["provenance"]["gpu"] == "cpu" and sec["seconds"] >= 0


def test_attention_part_covers_the_released_shapes_beside_the_planner(dry):
    a = dry["attention"]
    assert [s["model"] for s in a["shapes"]] == [s[1] for s in gpu_attention.REAL_SHAPES]
    assert "FlashAttention-2" in a["flash_attn_wheels"] and "64 MiB" in a["flash_attn_wheels"]
    assert a["triton"] == (triton_kernel.why_not() or "compiled and timed")
    for s in a["shapes"]:
        assert {r["kernel"] for r in s["rows"]} >= {"cpu-flash", "torch", "sdpa-math"}
        assert all(r["seconds"] > 0 for r in s["rows"]), s["rows"]
        assert set(s["predicted"]) == set(KERNELS)  # fa2 fa3 sdpa fa4 cudnn
        for name, d in s["agreement"].items():  # float32 on the CPU: the kernels agree
            assert d["max_out_diff"] < 1e-4 and d["max_lse_diff"] < 1e-4, (name, d)
    masked = {s["model"]: s.get("masked") for s in a["shapes"]}
    assert masked["wan2.1-t2v-14b"] is None and masked["hunyuanvideo-13b"]["padded_text_tokens"]
    assert any(r["kernel"].endswith("+mask") for r in masked["hunyuanvideo-13b"]["rows"])


def test_ring_part_is_one_ranks_blocks_and_folds(dry):
    rows = dry["ring"]["rows"]
    assert sorted({r["blocks"] for r in rows}) == [2, 4, 8]
    for r in rows:
        assert r["keys"] == r["blocks"] * r["queries"]  # n queries against P blocks of n
        assert r["ratio"] > 0 and r["predicted_fold_seconds"] > 0
        assert r["max_abs_diff"] < 1e-5 and r["max_lse_diff"] < 1e-5  # folds = one call
    # the CPU kernels have no planner rate; the GPU's flash and cuDNN rows carry one
    assert gpu_attention.PLANNER_KERNEL["sdpa-cudnn"] == "sdpa"


def test_serial_and_step_parts_record_measured_beside_predicted(dry):
    assert [r["model"] for r in dry["warm"]["rows"]] == [c[0] for c in gpu_models.CASES]
    for r in dry["warm"]["rows"]:
        assert len(r["seconds_all"]) == 3 and r["seconds_min"] <= r["seconds_per_forward"]
        assert r["predicted_seconds"]["sdpa"] > 0
    vae = {r["model"]: r for r in dry["vae"]["rows"]}
    assert list(vae) == [v[0] for v in gpu_serial.VAES]
    assert all(r["seconds"] > 0 for r in vae.values()), vae
    assert vae["wan2.1-t2v-14b"]["predicted"]["serial_seconds"] > 0
    assert vae["wan2.1-t2v-14b"]["rank_share"]["ranks"] == gpu_serial.SPLIT_RANKS
    assert "tiles" in vae["hunyuanvideo-13b"]
    step = dry["step"]
    assert step["bf16_weights"]["seconds_per_step"] > 0
    assert step["fp32_autocast"]["seconds_per_step"] > 0 and step["predicted_seconds"]["sdpa"]
    enc = dry["encoder"]
    assert enc["encode_seconds"] > 0 and enc["load_bytes"] > 0
    assert enc["predicted"]["encode_seconds"] > 0 and enc["predicted"]["reload_seconds"] > 0
    assert "unsupported on CPU" in dry["fp8"]["unsupported"]


def test_umt5_xxl_sized_stack_has_its_parameter_count():
    """google/umt5-xxl's encoder: 5.7 B parameters (the planner's text encoder size)."""
    with torch.device("meta"):
        enc = gpu_serial.t5_encoder(gpu_serial.UMT5_XXL)
    assert abs(sum(p.numel() for p in enc.parameters()) / 1e9 - 5.7) < 0.1


def test_a_part_that_would_not_fit_is_skipped_and_says_why(tmp_path):
    argv = ["--dry-run", "--out", str(tmp_path / "x.json"), "--budget", "1", "--parts", "warm"]
    res = gpu.collect(gpu._args(argv), argv)
    assert "needs about 2 s" in res["warm"]["skipped"]  # 200 GPU seconds, the dry run's 2
    assert res["skipped"] == {"warm": res["warm"]["skipped"]}


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


def test_importing_the_triton_kernel_never_needs_triton():
    """Where Triton or CUDA is missing the kernel says why and refuses, in one line."""
    reason = triton_kernel.why_not()
    if reason is None:
        pytest.skip("Triton and CUDA are here: tests/gpu/test_triton_attention.py runs it")
    assert reason.startswith("triton: ")
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(gpu.InputError, match="cannot run here"):
        triton_kernel.attention_with_lse_triton(q, q, q)


def test_a_part_that_breaks_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    """Whatever a part raises is its section; the file is written after every part."""
    real = gpu.gpu_second.parts()

    def broken(*args):
        raise TypeError("a bug in this part")

    monkeypatch.setattr(gpu.gpu_second, "parts", lambda: real | {"encoder": broken})
    out = tmp_path / "x.json"
    argv = ["--dry-run", "--out", str(out), "--parts", "encoder,fp8"]
    res = gpu.collect(gpu._args(argv), argv)
    assert res["encoder"]["error"] == "TypeError: a bug in this part"
    assert "provenance" in res["encoder"] and "unsupported" in res["fp8"]
    saved = json.loads(out.read_text())
    assert saved["encoder"] == res["encoder"] and saved["fp8"] == res["fp8"]


def test_ring_rows_carry_the_planners_rank_where_it_has_a_rate(monkeypatch):
    """On a GPU SDPA's flash and cuDNN rows are priced (fa2, sdpa); on the CPU, lend cpu-flash
    the 'sdpa' rate to walk the same code."""
    monkeypatch.setitem(gpu_attention.PLANNER_KERNEL, "cpu-flash", "sdpa")
    sec = gpu_attention.ring_part(torch.device("cpu"), True, 1, "h100-sxm", float("inf"))
    rows = [r for r in sec["rows"] if r["kernel"] == "cpu-flash"]
    assert [r["blocks"] for r in rows] == [2, 4, 8]
    for r in rows:
        assert r["planner_kernel"] == "sdpa"
        assert r["predicted_split_seconds"] > r["predicted_fold_seconds"] > 0


def test_attention_rows_carry_the_planners_seconds_where_it_has_a_rate(monkeypatch):
    monkeypatch.setitem(gpu_attention.PLANNER_KERNEL, "cpu-flash", "fa2")
    sec = gpu_attention.attention_part(torch.device("cpu"), True, 1, "h100-sxm", float("inf"))
    for shape in sec["shapes"]:
        row = next(r for r in shape["rows"] if r["kernel"] == "cpu-flash")
        assert row["predicted_seconds"] == shape["predicted"]["fa2"]["seconds"] > 0
        assert row["measured_over_predicted"] > 0
