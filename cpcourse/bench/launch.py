"""Benchmark of `cpcourse.launch` itself: start-up, error latency, processes left after a kill.

    python -m cpcourse.bench.launch --json
    python -m cpcourse.bench.launch --nproc 4 --repeats 3

- start_return_s: wall time of `launch(trivial target, P)` from the call to its return (torchrun,
  P Python processes importing torch, the rendezvous, the process group, the results).
- error_latency_s: from the moment a rank raised (the time it recorded) to the moment the caller
  caught the RankError. The other ranks were waiting in a collective for it.
- left_after_kill: processes of a launch still alive 3 s after its caller was killed (SIGINT, as
  a notebook interrupt does, and SIGKILL, as a kernel restart does). Found by a marker in their
  environment, so only this benchmark's processes are counted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from cpcourse.support.errors import ArgumentParser, positive_int, require


def raise_after_barrier() -> None:
    """Rank 1 raises while the others wait for it in an all-reduce."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(1))


def sleep_forever() -> None:
    print("started", flush=True)
    time.sleep(3600)


def _left_after_kill(nproc: int, sig: int) -> int:
    from cpcourse.launch.proctree import marked

    mark = f"bench-launch-{uuid.uuid4().hex}"
    code = (f"from cpcourse.launch import launch\n"
            f"launch('cpcourse.bench.launch:sleep_forever', {nproc}, timeout=600, "
            f"env={{'BENCH_MARK': {mark!r}}})\n")
    # The killed caller's run folder goes in a temp dir of the benchmark's own: a SIGKILLed
    # caller cannot remove it, and it must not be left behind in the user's.
    tmp = tempfile.mkdtemp(prefix="cpcourse-bench-launch-")
    try:
        caller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True, stderr=subprocess.DEVNULL, start_new_session=True,
                                  env={**os.environ, "TMPDIR": tmp})
        for _ in range(nproc):
            caller.stdout.readline()
        caller.send_signal(sig)
        caller.wait(timeout=60)
        time.sleep(3.0)
        left = marked(mark)
        for pid, _ in left:  # do not leave them to the next benchmark
            os.kill(pid, signal.SIGKILL)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(left)


def main(argv: list[str]) -> int:
    from cpcourse.launch import RankError, check_nproc, launch

    p = ArgumentParser(prog="cpcourse bench launch", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    nproc, repeats = check_nproc(args.nproc, "--nproc"), positive_int("--repeats", args.repeats)
    require(repeats <= 20, f"--repeats {repeats}: use at most 20 (each is two launches)")
    quiet = dict(stream=False, timeout=60)
    starts, latencies = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        launch("cpcourse.launch.entry:rank_info", nproc, **quiet)
        starts.append(time.perf_counter() - t0)
        try:
            launch("cpcourse.bench.launch:raise_after_barrier", max(2, nproc), **quiet)
        except RankError as err:
            latencies.append(time.time() - err.raised_at)
    left = {"SIGINT": _left_after_kill(nproc, signal.SIGINT),
            "SIGKILL": _left_after_kill(nproc, signal.SIGKILL)}
    report = {"nproc": nproc, "repeats": repeats, "cpu_count": os.cpu_count(),
              "start_return_s": statistics.median(starts), "start_return_all_s": starts,
              "error_latency_s": statistics.median(latencies), "error_latency_all_s": latencies,
              "left_after_kill": left,
              "targets": {"start_return_s_max": 10.0, "error_latency_s_max": 10.0,
                          "left_after_kill": 0}}
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(f"launch of {nproc} ranks, start to return: median {report['start_return_s']:.2f} s "
              f"({', '.join(f'{s:.2f}' for s in starts)})")
        print(f"rank exception to caller's RankError: median {report['error_latency_s']:.2f} s "
              f"({', '.join(f'{s:.2f}' for s in latencies)})")
        print(f"processes left 3 s after the caller was killed: {left}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
