"""cpcourse doctor [--json]: is this machine ready for the course? Says what is wrong and the fix.

    cpcourse doctor

Checks versions (python, torch, numpy, jupyterlab, ipywidgets, diffusers), CPU threads, CUDA
and GPU count, whether flash-attn is importable, and runs a two-process gloo all-reduce on
loopback with a short timeout (the same transport the course's multi-process cells use).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
import time

from cpcourse.support.errors import ArgumentParser

GLOO_TIMEOUT_S = 10

_WORKER = r"""
import datetime, os, sys, torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=float(sys.argv[3])))
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
assert t.item() == 3.0, t
dist.destroy_process_group()
print("ok")
"""


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_allreduce(timeout: float = GLOO_TIMEOUT_S) -> dict:
    """Two processes all-reduce one number over gloo on 127.0.0.1; never waits past `timeout`."""
    port, start = free_port(), time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME=os.environ.get(
        "GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo"))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(r), str(port), str(timeout)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for r in range(2)]
    errors = []
    try:
        for r, p in enumerate(procs):
            left = max(1.0, timeout + 20 - (time.perf_counter() - start))
            out, err = p.communicate(timeout=left)
            if p.returncode != 0 or "ok" not in out:
                last = (err.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
                errors.append(f"rank {r}: {last}")
    except subprocess.TimeoutExpired:
        errors.append(f"timed out after {timeout + 20:.0f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {"ok": not errors, "seconds": round(time.perf_counter() - start, 2),
            "error": "; ".join(errors) or None}


def _launch_env_problems() -> list[str]:
    """launch()'s own checks of CPCOURSE_BACKEND and CPCOURSE_RANK_START: values every launch
    would refuse."""
    from cpcourse.launch.forkserver import start_method
    from cpcourse.launch.launcher import check_backend
    from cpcourse.support.errors import InputError

    problems = []
    for check in (lambda: check_backend(None, None, 1), start_method):
        try:
            check()
        except InputError as exc:
            problems.append(f"{exc} (every launch refuses it)")
    return problems


def diagnose(run_gloo: bool = True) -> dict:
    report: dict = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("torch", "numpy", "jupyterlab", "ipywidgets", "matplotlib", "diffusers"):
        report[pkg] = _version(pkg)
    report["cpu_threads"] = os.cpu_count()
    report["omp_num_threads"] = omp = os.environ.get("OMP_NUM_THREADS")
    problems = []
    if omp is not None and not (omp.strip().isdigit() and int(omp) > 0):
        problems.append(f"OMP_NUM_THREADS={omp!r} is not a positive whole number: every launch "
                        "refuses it; unset it or set it to the threads per rank (e.g. 1)")
    for pkg in ("torch", "numpy", "jupyterlab", "ipywidgets", "matplotlib", "diffusers"):
        if report[pkg] is None:
            problems.append(f"{pkg} is not installed: run `make setup` (or `pip install -e .`)")
    report["cuda_available"], report["gpu_count"], report["gpus"] = False, 0, []
    if report["torch"]:
        import torch

        report["torch_threads"] = torch.get_num_threads()
        # Query without initialising a CUDA context in this process.
        report["cuda_build"] = torch.version.cuda
        if torch.cuda.is_available():
            report["cuda_available"], report["gpu_count"] = True, torch.cuda.device_count()
            report["gpus"] = [torch.cuda.get_device_name(i) for i in range(report["gpu_count"])]
        report["gloo_available"] = torch.distributed.is_gloo_available()
        report["nccl_available"] = torch.distributed.is_available() and \
            torch.distributed.is_nccl_available()
    report["backend_env"] = os.environ.get("CPCOURSE_BACKEND")
    report["rank_start_env"] = os.environ.get("CPCOURSE_RANK_START")
    if report["torch"]:
        problems += _launch_env_problems()
    report["flash_attn"] = importlib.util.find_spec("flash_attn") is not None
    if report["cuda_available"] and not report["flash_attn"]:
        problems.append("flash-attn is not installed: the course uses torch's fused attention "
                        "instead (fine); `pip install -e '.[gpu]'` adds it on a CUDA machine")
    if run_gloo and report["torch"]:
        report["gloo_allreduce"] = gloo_allreduce()
        if not report["gloo_allreduce"]["ok"]:
            problems.append("two local processes could not all-reduce over gloo ("
                            f"{report['gloo_allreduce']['error']}): check that 127.0.0.1 is "
                            "reachable, set GLOO_SOCKET_IFNAME to your loopback interface "
                            "(lo on Linux, lo0 on macOS), and that no firewall blocks local ports")
    report["problems"] = problems
    report["ok"] = not [p for p in problems if "flash-attn" not in p]
    return report


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="cpcourse doctor", description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-gloo", action="store_true", help="skip the two-process check")
    args = ap.parse_args(argv)
    if not args.no_gloo:  # starting two processes takes seconds: say so (stderr, as progress)
        print("doctor: versions, then two local processes all-reduce over gloo ...",
              file=sys.stderr, flush=True)
    r = diagnose(run_gloo=not args.no_gloo)
    if args.json:
        print(json.dumps(r, indent=1, allow_nan=False))
        return 0 if r["ok"] else 1
    for key in ("python", "torch", "numpy", "jupyterlab", "ipywidgets", "matplotlib",
                "cpu_threads", "cuda_available", "gpu_count", "flash_attn"):
        print(f"{key:16s} {r.get(key)}")
    if "gloo_allreduce" in r:
        g = r["gloo_allreduce"]
        print(f"{'gloo all-reduce':16s} {'ok' if g['ok'] else 'FAILED'} in {g['seconds']} s")
    for p in r["problems"]:
        print(f"! {p}")
    print("ready for the course" if r["ok"] else "not ready: fix the lines marked ! above")
    return 0 if r["ok"] else 1
