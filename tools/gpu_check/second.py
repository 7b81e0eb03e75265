"""The second GPU run's bookkeeping: its parts, each section's provenance, the summary lines.

    cpcourse bench gpu --json          # `tools/gpu_check/check.py` runs the parts this module lists

Each part (`tools/gpu_check/attention.py`, `gpu_pipeline`, `gpu_serial`) is a function
`fn(device, dry, repeat, gpu_id, deadline) -> dict`, its section of the results; `stamp` is the
provenance every section carries, so a section copied elsewhere still says where it was made.
"""

from __future__ import annotations

import datetime
import subprocess

import torch


def driver() -> str | None:
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return res.stdout.strip().splitlines()[0] if res.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None


def stamp(device: torch.device, gid: str | None) -> dict:
    """Each section's provenance: the card, its kind, the software under it, the date."""
    out = {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "gpu_id": gid, "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
           "driver": driver() if device.type == "cuda" else None,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return out


def parts() -> dict:
    from tools.gpu_check import attention as gpu_attention
    from tools.gpu_check import pipeline as gpu_pipeline
    from tools.gpu_check import serial as gpu_serial

    # each: fn(device, dry, repeat, gpu_id, deadline) -> its section
    return {"attention": gpu_attention.attention_part, "ring": gpu_attention.ring_part,
            "warm": gpu_pipeline.warm_part, "vae": gpu_serial.vae_part,
            "step": gpu_pipeline.step_part, "encoder": gpu_serial.encoder_part,
            "fp8": gpu_pipeline.fp8_part}


def summary_lines(res: dict) -> list[str]:
    """One or a few lines per part of the second run (issue 49)."""
    lines = []
    for sh in (res.get("attention") or {}).get("shapes", []):
        rows = sh.get("rows", []) + sh.get("masked", {}).get("rows", [])
        lines.append(f"attention {sh['model']} {sh.get('tokens', '')}: " + "; ".join(
            f"{r['kernel']} {r['seconds']:.3g} s ({100 * r['share_of_peak']:.0f}%)"
            if "seconds" in r else f"{r['kernel']} -" for r in rows))
    for r in (res.get("ring") or {}).get("rows", []):
        if "ratio" in r:
            lines.append(f"ring P={r['blocks']} {r['kernel']}: split/fused {r['ratio']:.3f}, "
                         f"folds {r['seconds_folds']:.3g} s vs planned "
                         f"{r['predicted_fold_seconds']:.3g} s")
    for part in ("warm", "vae"):
        for r in (res.get(part) or {}).get("rows", []):
            secs = r.get("seconds_per_forward", r.get("seconds"))
            lines.append(f"{part} {r['model']}: " + (f"{secs:.3g} s" if secs is not None else
                                                      str(r.get("error") or r.get("skipped"))))
    st = res.get("step") or {}
    if "bf16_weights" in st:
        fp32 = st.get("fp32_autocast", {})
        bf16 = st["bf16_weights"]["seconds_per_step"]
        f32 = (f"{fp32['seconds_per_step']:.3g} s" if "seconds_per_step" in fp32 else str(fp32))
        lines.append(f"step {st['model']}: bf16 weights {bf16:.3g} s; fp32 under autocast {f32}")
    if "encode_seconds" in (res.get("encoder") or {}):
        e = res["encoder"]
        lines.append(f"encoder: encode {e['encode_seconds']:.3g} s, load {e['load_seconds']:.3g} s")
    for r in (res.get("fp8") or {}).get("rows", []):
        lines.append(f"fp8 {r['m']}x{r['k']}x{r['n']}: {r['speedup']:.2f}x bf16")
    lines += [f"skipped {k}: {v}" for k, v in res.get("skipped", {}).items()]
    return lines
