"""The link measured alone: a ping-pong between two ranks, with nothing else to wait for.

    python -c "from cpcourse.runs.link_probe import LinkProbeRequest as R, run; print(run(R()))"

Reading a link's bandwidth off a ring as bytes over the seconds spent inside the communication
call measures mostly waiting: a rank that reaches `wait()` before its peer has finished its own
compute counts the peer's lateness as "communication". A benchmark times the link alone: both
ranks synchronise, then rank 0 sends a block to rank 1, which sends it straight back, `inner`
times in a row, each timed; half a round trip is one message's time. Repeated for several sizes, the
fastest samples fit the alpha-beta model of `cpcourse.planner.collectives` (`fit_alpha_beta`):
a message of n bytes takes alpha + n / B. (The median adds what the scheduler of a busy
machine adds; both are returned.)

`ring_prediction` then prices a measured ring's hops with that alpha and B, step by step, and
says what the ring's communication would have cost had it only moved bytes: in blocking mode
every hop, in overlap mode only the part of a hop longer than the compute beside it. What the
ring measured beyond that is waiting (ranks out of step) and sharing (the copy and the compute
on the same cores).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cpcourse.launch import launch
from cpcourse.planner.collectives import collective_seconds, fit_alpha_beta
from cpcourse.support.errors import positive_int, require

# 4 kB to 4 MB: the small end shows alpha, the large end the bandwidth; 2.1 MB (notebook 05's
# hop) sits inside the range, so the fit interpolates rather than extrapolates there.
DEFAULT_SIZES = (4096, 65536, 524288, 4194304)


@dataclass(frozen=True)
class LinkProbeRequest:
    """One ping-pong measurement between rank 0 and rank 1 (other ranks only synchronise).

    sizes: message sizes in bytes (multiples of 4, at least two different); repeats: barriers
    per size; inner: round trips timed after each barrier, one by one (of all of them, the
    fastest is the link's, the median what a busy machine adds)."""

    nproc: int = 2
    sizes: tuple[int, ...] = DEFAULT_SIZES
    repeats: int = 7
    inner: int = 8
    timeout: float = 60.0

    def __post_init__(self):
        positive_int("nproc", self.nproc)
        require(2 <= self.nproc <= 4, f"nproc {self.nproc}: a ping-pong needs 2 ranks (at most "
                "4 here; ranks past 1 only wait at the barriers)")
        require(len(self.sizes) >= 2 and len(set(self.sizes)) >= 2,
                f"sizes {self.sizes}: give at least two different message sizes in bytes, so "
                "alpha and the bandwidth can be told apart")
        for n in self.sizes:
            require(positive_int("size", n) % 4 == 0 and n <= 256 * 2**20,
                    f"size {n}: each message size must be a multiple of 4 bytes (float32), at "
                    "most 256 MiB")
        require(1 <= positive_int("repeats", self.repeats) <= 100, "repeats: use 1 to 100")
        require(1 <= positive_int("inner", self.inner) <= 100, "inner: use 1 to 100")
        require(0 < self.timeout <= 600, f"timeout {self.timeout}: use 1 to 600 seconds")


def rank(req: LinkProbeRequest) -> dict:
    """One rank of the probe (call it on every rank of a process group, e.g. inside a
    `%%torchrun` cell): one-way seconds of every timed round trip, per size, aligned with
    `sizes` (rank 0's are the measurement; rank 1 echoes; other ranks only join the barriers).
    `summary` turns rank 0's into the fit."""
    me = dist.get_rank()
    samples: list[list[float]] = []
    for n in req.sizes:
        buf = torch.zeros(n // 4, dtype=torch.float32)
        _pingpong(buf, me, 1)  # warm-up: connection set-up and first-touch pages are not the link
        samples.append([])
        for _ in range(req.repeats):
            dist.barrier()
            _pingpong(buf, me, 1)  # one exchange after the barrier: both ranks now in step
            for _ in range(req.inner):  # each round trip timed alone: a preempted one stands out
                t0 = time.perf_counter()
                _pingpong(buf, me, 1)
                samples[-1].append((time.perf_counter() - t0) / 2)
    return {"rank": me, "sizes": list(req.sizes), "one_way_s": samples}


def _pingpong(buf: torch.Tensor, me: int, times: int) -> None:
    for _ in range(times):
        if me == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif me == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)


def run(req: LinkProbeRequest) -> dict:
    """Launch the probe on `req.nproc` ranks; `summary` of rank 0's timings."""
    per_rank = launch(rank, req.nproc, timeout=req.timeout, args=(req,), stream=False,
                      threads=1)
    return summary(per_rank[0]) | {"nproc": req.nproc}


def summary(rank0: dict) -> dict:
    """Rank 0's `rank` result as sizes (bytes), median_s and min_s (one-way seconds per size),
    alpha_s and gbps (decimal GB/s) fitted to the fastest samples, apparent_gbps (each size's
    bytes over its fastest time), backend."""
    sizes, times = rank0["sizes"], rank0["one_way_s"]
    median, fastest = ([f(t) for t in times] for f in (statistics.median, min))
    # the fastest sample is the link; the median adds what a busy machine's scheduler adds
    alpha, gbps = fit_alpha_beta(sizes, fastest)
    return {"sizes": sizes, "median_s": median, "min_s": fastest, "alpha_s": alpha, "gbps": gbps,
            "apparent_gbps": [n / t / 1e9 for n, t in zip(sizes, fastest, strict=True)],
            "backend": "gloo"}


def hop_seconds(nbytes: float, alpha_s: float, gbps: float) -> float:
    """One ring hop of `nbytes` on a link measured alone: alpha + bytes / B (send_recv)."""
    return collective_seconds("send_recv", nbytes, 2, alpha=alpha_s, gbps=gbps)["seconds"]


def ring_prediction(steps: list[dict], alpha_s: float, gbps: float, overlap: bool) -> dict:
    """What one rank's measured ring steps (`ring_attention(..., stats=)` records: compute_s,
    comm_s, bytes_sent) would have spent communicating on the probed link alone.

    Blocking: every hop's alpha + bytes / B. Overlap: only the part of each hop longer than the
    compute beside it, max(0, hop - compute). Keys: predicted_s, measured_s, hops, hop_s (the
    largest hop's predicted seconds), compute_s (the run's compute), extra_s (measured minus
    predicted: waiting for the peer and sharing the cores, not moving bytes)."""
    require(bool(steps), "ring_prediction needs the per-step records of at least one ring")
    predicted, hops, largest = 0.0, 0, 0.0
    for s in steps:
        if not s["bytes_sent"]:
            continue
        hop = hop_seconds(s["bytes_sent"], alpha_s, gbps)
        hops, largest = hops + 1, max(largest, hop)
        predicted += max(0.0, hop - s["compute_s"]) if overlap else hop
    measured = sum(s["comm_s"] for s in steps)
    return {"predicted_s": predicted, "measured_s": measured, "hops": hops, "hop_s": largest,
            "compute_s": sum(s["compute_s"] for s in steps), "extra_s": measured - predicted}
