"""The prepared GPU check: the CUDA tests, the kernel's real rate, real-size models' forwards.

    python -m tools.gpu_check --json             # from a checkout, on a CUDA machine, ~9 minutes
    python -m tools.gpu_check --dry-run --json   # the same code on the CPU at tiny sizes (CI)
    make gpu                                     # the same, results in artifacts/gpu.json
    cpcourse bench gpu [--dry-run]               # the same, run from the checkout it sits in

Parts, in order of value, each recorded even when another fails, in one JSON file with its
provenance (GPU, driver, CUDA, cuDNN, torch and diffusers versions, date, command) and each
section with its own; a part that would not fit in what is left of --budget is skipped, saying
so (expected GPU seconds in EXPECTED_SECONDS):
  attention  every kernel at the released shapes (Wan 14B, HunyuanVideo masked and not,
             CogVideoX-5B), the course's Triton kernel among them (`tools/gpu_check/attention.py`)
  ring       one ring rank's blocks + in-place folds at the true ring shape, P = 2, 4, 8
  warm       three warm forwards per model after a warm-up at the same shape
  vae        the released VAEs' decode and one rank's share of the split decode
  step       one Wan 14B CFG sampler step, bf16 weights and fp32 under autocast
  encoder    an umT5-XXL-sized encoder's encode and load from host (`tools/gpu_check/serial.py`)
  fp8        float8 `_scaled_mm` against bf16 at Wan 14B's linears (`tools/gpu_check/pipeline.py`)
  tests      `pytest -m gpu`: attention and merge on every CUDA backend against float64, ring and
             Ulysses on a one-rank NCCL group, the Triton kernel, the tiny DiT on CUDA against the
             CPU, diffusers' models parallelized under NCCL (the dry run only collects them)
The first run's parts: `kernels` (by default, after `ring`: the planner reads a committed run's
copy rate and kernel shares from it) and `models` (on request, `--parts models`):
  kernels  matmul and copy ceilings, attention TFLOP/s per backend at Wan 14B's head shape
           (`tools/gpu_check/kernels.py`)
  models   one forward per model beside the planner (`tools/gpu_check/models.py`)
Without CUDA (and without --dry-run) it says so in one line and exits 2. The first run's results
(an H200) live in `cpcourse/data/gpu_measured_h200.json`; a later run writes
`cpcourse/data/gpu_measured_<kind>.json` (`--out`), one per GPU kind.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from cpcourse.support.errors import ArgumentParser, InputError, positive_float, positive_int
from cpcourse.support.out_files import check_output, write_text
from tools.gpu_check import kernels as gpu_kernels
from tools.gpu_check import models as gpu_models
from tools.gpu_check import second as gpu_second

# In order of value (issue 49, planner audit section 5): a part that would not fit in what is
# left of --budget is recorded as skipped, with the seconds it would need. Expected seconds on
# one H100/H200 (the GPU's; the CPU dry run takes seconds for all). kernels and models are the
# first run's parts (cpcourse/data/gpu_measured_h200.json): kernels runs by default (the
# planner reads its copy rate and kernel shares from a committed run), models on request.
EXPECTED_SECONDS = {"attention": 60, "ring": 30, "kernels": 40, "warm": 200, "vae": 110,
                    "step": 90, "encoder": 30, "fp8": 15, "tests": 60, "models": 200}
PARTS = tuple(EXPECTED_SECONDS)
DRY_SPEEDUP = 100
DEFAULT_PARTS = tuple(p for p in PARTS if p != "models")
DEFAULT_DIR = "artifacts"  # --out's default folder, made when missing (ignored by git)
_GPU_IDS = {"H200": "h200-sxm", "H100": "h100-sxm", "A100": "a100-80gb-sxm", "B200": "b200",
            "H800": "h800", "H20": "h20", "L40S": "l40s", "L20": "l20", "4090": "rtx4090"}


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="cpcourse bench gpu", description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--dry-run", action="store_true", help="the same code on the CPU, tiny sizes")
    p.add_argument("--out", default=f"{DEFAULT_DIR}/gpu.json", help="the results file to write")
    p.add_argument("--force", action="store_true", help="--out may replace an existing file")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"some of {','.join(PARTS)} (run in that order)")
    p.add_argument("--budget", default="540", help="seconds; a part that would not fit in what "
                   "is left of it is recorded as skipped")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per kernel measurement")
    return p


def _args(argv) -> argparse.Namespace:
    a = _parser().parse_args(argv)
    a.budget = positive_float("--budget", a.budget, high=3600)
    a.repeat = positive_int("--repeat", a.repeat)
    if a.repeat > 20:
        raise InputError(f"--repeat must be 20 or fewer, got {a.repeat}")
    a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = sorted(set(a.parts) - set(PARTS))
    if bad or not a.parts:
        raise InputError(f"--parts takes some of {','.join(PARTS)}, got {bad or 'nothing'}")
    if not a.dry_run and not torch.cuda.is_available():
        raise InputError("no CUDA GPU here: run this on a GPU machine, or add --dry-run to run "
                         "the same code on the CPU at tiny sizes")
    _check_out(a.out, a.force)  # fail before minutes of work, not after
    return a


def _check_out(out: str, force: bool) -> None:
    """--out checked (`support.out_files.check_output`). Only the default folder, artifacts/,
    is made when missing, and removed again when the path is refused: any other folder must
    exist (a typo would otherwise leave folders behind)."""
    made = None
    if os.path.dirname(out) == DEFAULT_DIR and not os.path.lexists(DEFAULT_DIR):
        try:
            os.mkdir(DEFAULT_DIR)
        except OSError as exc:
            raise InputError(f"--out {out}: cannot make its folder ({exc.strerror})") from None
        made = DEFAULT_DIR
    try:
        check_output(out, force, "--out")
    except InputError:
        if made:
            os.rmdir(made)
        raise


def gpu_id(name: str) -> str | None:
    """The facts sheet's id for a CUDA device name ('NVIDIA H200' -> 'h200-sxm')."""
    return next((v for k, v in _GPU_IDS.items() if k in name.upper()), None)


def provenance(device: torch.device, argv: list[str]) -> dict:
    """What ran where: enough to tell this run's numbers from another card's or version's."""
    import diffusers

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "cpcourse bench gpu " + " ".join(argv), "python": platform.python_version(),
            "torch": torch.__version__, "diffusers": diffusers.__version__,
            "cuda": torch.version.cuda, "device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                    gpu_memory_bytes=props.total_memory,
                    multiprocessors=props.multi_processor_count,
                    cudnn=torch.backends.cudnn.version(), driver=gpu_second.driver())
    try:
        import flash_attn
        info["flash_attn"] = flash_attn.__version__
    except ImportError:
        info["flash_attn"] = None
    return info


def run_tests(dry: bool, timeout_s: float) -> dict:
    """`pytest -m gpu` in a child process; counts and each failure's first line, from JUnit XML."""
    root = Path(__file__).resolve().parents[2]  # tools/gpu_check/check.py -> the checkout
    if not (root / "tests").is_dir():
        return {"skipped": "no tests/ folder in this checkout"}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        # Only the files that hold gpu tests: the others may import what a GPU image lacks
        # (JupyterLab, Playwright), and collecting them would fail before any test ran.
        # Every file under tests/gpu is a gpu test (tests/gpu/conftest.py marks them).
        files = sorted(str(f.relative_to(root)) for f in (root / "tests").rglob("test_*.py")
                       if f.parent.name == "gpu" or "mark.gpu" in f.read_text(encoding="utf-8"))
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
               f"--junitxml={xml}", *files] + (["--collect-only"] if dry else [])
        start = time.perf_counter()
        try:
            res = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"error": f"pytest -m gpu ran past {timeout_s:.0f} s"}
        out = {"command": " ".join(cmd[2:]), "returncode": res.returncode,
               "seconds": time.perf_counter() - start,
               "summary": (res.stdout.strip().splitlines() or [""])[-1]}
        if dry:
            out["collected"] = sum(1 for line in res.stdout.splitlines() if "::" in line)
            return out
        if not xml.exists():
            out["error"] = (res.stderr or res.stdout).strip()[-2000:]
            return out
        return out | _junit(xml)


def _junit(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append({"test": f"{case.get('classname')}::{case.get('name')}",
                             "message": (msg[0] if msg else "")[:300]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts | {"failures": failures}


def run_kernels(device, peak: float, repeat: int) -> dict:
    sizes = gpu_kernels.REAL if device.type == "cuda" else gpu_kernels.TINY
    mm = gpu_kernels.matmul_rate(device, sizes["matmul"], sizes["dtype"])
    mm["share_of_peak"] = mm["tflops"] / peak
    copy = gpu_kernels.copy_rate(device, sizes["copy_bytes"])
    rates = gpu_kernels.kernel_rates(device, peak, sizes, repeat)
    fastest = max((r for r in rates if "tflops" in r and r["shape"] == "full"),
                  key=lambda r: r["tflops"], default=None)
    split = gpu_kernels.split_cost(device, sizes, fastest["backend"], repeat) if fastest else []
    return {"peak_tflops": peak, "matmul": mm, "copy": copy, "rates": rates, "split": split,
            "fastest_full": fastest and {k: fastest[k] for k in ("backend", "tflops",
                                                                 "share_of_peak")}}


def run_models(device, dry: bool, kernels: dict | None, deadline: float) -> list:
    from cpcourse.planner.facts import facts

    assumed = float(facts()["calculator_defaults"]["matmul_efficiency"])
    full = {r["backend"]: r["share_of_peak"] for r in (kernels or {}).get("rates", [])
            if r["shape"] == "full" and "share_of_peak" in r}
    mm_share = (kernels or {}).get("matmul", {}).get("share_of_peak")
    rows = []
    for model_id, arch in gpu_models.CASES:
        if time.monotonic() > deadline:
            rows.append({"model": model_id, "skipped": "past the --budget"})
            continue
        try:
            # one timed forward where the planner expects over 10 s: the budget is minutes
            slow = gpu_models.predict(model_id, "h200-sxm")["sdpa"]["forward_seconds"] > 10
            row = gpu_models.run_model(model_id, arch, device, dry,
                                       repeat=1 if dry or slow else 2)
            # priced at the rate this run measured for the kernel SDPA picks for this model
            row["measured_over_predicted"] = gpu_models.compare(
                row, full.get(row["sdpa_backend"]), mm_share, assumed)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            row = {"model": model_id, "error": f"{type(exc).__name__}: "
                                               f"{str(exc).splitlines()[0][:300]}"}
            torch.cuda.empty_cache() if device.type == "cuda" else None
        rows.append(row)
    return rows


def collect(a: argparse.Namespace, argv: list[str]) -> dict:
    """Every part the arguments ask for, in PARTS order, each recorded even if another failed;
    a part whose expected seconds do not fit in what is left of --budget is skipped, saying so."""
    start = time.monotonic()
    device = torch.device("cuda" if not a.dry_run else "cpu")
    gid = gpu_id(torch.cuda.get_device_name(device)) if device.type == "cuda" else "h200-sxm"
    from cpcourse.planner.hardware import get_gpu

    peak = get_gpu(gid).bf16_tflops if gid else float("nan")
    res = {"provenance": provenance(device, argv) | {"gpu_id": gid, "dry_run": a.dry_run},
           "budget_seconds": a.budget, "expected_gpu_seconds": EXPECTED_SECONDS, "skipped": {}}
    new = gpu_second.parts()
    for part in (p for p in PARTS if p in a.parts):
        left = a.budget - (time.monotonic() - start)
        # the dry run is about 100 times faster: the same rule, exercised on the CPU
        need = EXPECTED_SECONDS[part] / (DRY_SPEEDUP if a.dry_run else 1)
        if need > left:
            res[part] = {"skipped": f"needs about {need:.3g} s, {left:.3g} s of --budget left"}
            res["skipped"][part] = res[part]["skipped"]
            continue
        t0 = time.monotonic()
        if part == "tests":
            res["tests"] = run_tests(a.dry_run, timeout_s=max(60.0, left))
        elif part == "kernels":
            res["kernels"] = _guarded(lambda: run_kernels(device, peak, a.repeat))
        elif part == "models":
            res["models"] = run_models(device, a.dry_run, res.get("kernels"),
                                       deadline=start + a.budget)
        else:
            res[part] = _any_error(lambda part=part: new[part](
                device, a.dry_run, a.repeat, gid or "h200-sxm", start + a.budget), device)
        if isinstance(res[part], dict):
            res[part] |= {"provenance": gpu_second.stamp(device, gid),
                          "seconds": time.monotonic() - t0}
        # after every part: a run cut off by its machine's time limit keeps what it measured
        res["seconds"] = time.monotonic() - start
        write_text(a.out, json.dumps(res, indent=1) + "\n", "--out")
    res["seconds"] = time.monotonic() - start
    return res


def _any_error(fn, device):
    """A part of the second run, whatever it raises recorded as its section: on a borrowed GPU
    with minutes to spend, a bug in one part must not lose the others' numbers."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"}


def _guarded(fn):
    try:
        return fn()
    except (RuntimeError, InputError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def table(res: dict) -> str:
    """The results as a few short tables: what a person reads at the end of the run."""
    p = res["provenance"]
    lines = [f"{p.get('gpu', 'CPU (dry run)')} | torch {p['torch']} | CUDA {p['cuda']} | "
             f"diffusers {p['diffusers']} | {p['date']}"]
    t = res.get("tests") or {}
    if t:
        lines.append(f"tests: {t.get('summary') or t.get('error') or t.get('skipped')}")
        lines += [f"  FAILED {f['test']}: {f['message']}" for f in t.get("failures", [])]
    k = res.get("kernels") or {}
    if "rates" in k:
        lines.append(f"matmul {k['matmul']['n']}^3: {k['matmul']['tflops']:.0f} TFLOP/s "
                     f"({100 * k['matmul']['share_of_peak']:.0f}% of {k['peak_tflops']:.0f})")
        lines.append(f"copy: {k['copy']['tbps']:.2f} TB/s read + written")
        lines.append(f"{'backend':15s} {'shape':6s} {'L':>7s} {'TFLOP/s':>8s} {'of peak':>8s}")
        for r in k["rates"]:
            rate = (f"{r['tflops']:8.1f} {100 * r['share_of_peak']:7.1f}%" if "tflops" in r
                    else r.get("error", ""))
            lines.append(f"{r['backend']:15s} {r['shape']:6s} {r['tokens']:7d} {rate}")
        for s in k["split"]:
            lines.append(f"split into {s['blocks']} blocks + merges ({s['backend']}, L "
                         f"{s['tokens']}): {s['ratio']:.3f} x one fused call")
    elif k:
        lines.append(f"kernels: {k.get('error')}")
    for m in res.get("models", []):
        if "seconds_per_forward" not in m:
            lines.append(f"{m['model']}: {m.get('error') or m.get('skipped')}")
            continue
        pr, ratio = m["predicted"], m["measured_over_predicted"]
        gb = (f", peak {m['peak_bytes'] / 1e9:.1f} GB vs predicted "
              f"{(pr['weights_bytes'] + pr['activation_bytes']) / 1e9:.1f}"
              if m.get("peak_bytes") else "")
        lines.append(f"{m['model']} {m['height']}x{m['width']}x{m['frames']}: "
                     f"{m['seconds_per_forward']:.3f} s/forward; predicted "
                     f"{pr['sdpa']['forward_seconds']:.3f} (sdpa), "
                     f"{pr['fa3']['forward_seconds']:.3f} (fa3)" +
                     (f", {pr['measured_rates']['forward_seconds']:.3f} (measured rates)"
                      if "measured_rates" in pr else "") + gb)
        prof = m["profile"]["seconds"]
        lines.append("  profiled: " + ", ".join(f"{k} {v:.3f} s" for k, v in prof.items()) +
                     f"; SDPA held to flash: "
                     f"{m['flash_attention_2'].get('seconds_per_forward', float('nan')):.3f} s "
                     f"(measured/predicted {', '.join(f'{k} {v:.2f}' for k, v in ratio.items())})")
    lines += gpu_second.summary_lines(res)
    lines.append(f"total {res['seconds']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _args(argv)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    res = collect(a, argv)
    out = Path(a.out)
    write_text(a.out, json.dumps(res, indent=1) + "\n", "--out")
    text = table(res)
    if a.json:
        print(text, file=sys.stderr)
        print(json.dumps(res))
    else:
        print(text)
        print(f"wrote {out}")
    return 0
