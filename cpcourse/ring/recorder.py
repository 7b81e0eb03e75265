"""Per-step records of a sequence-parallel loop: compute and communication seconds, bytes moved.

    python -m cpcourse.cli demo --nproc 2       # prints the ring's per-step records

`recorder(stats)` gives the ring (and anything built like it) one object to call at the same points
whether or not anyone listens: with `stats` None it is a no-op that costs nothing and never
synchronises the GPU; with a list it appends one dict per step, with the keys `cpcourse demo`,
`cpcourse bench ring` and the notebooks read: step, rank, kv_block, q_tokens, kv_tokens,
compute_s, comm_s, bytes_sent, bytes_recv.
"""

from __future__ import annotations

import time

import torch


class NoRecorder:
    """Records nothing: the loop pays neither a clock read nor a device sync."""

    enabled = False

    def start(self) -> None:
        pass

    def comm_done(self, t: torch.Tensor | None = None) -> None:
        pass

    def compute_done(self, t: torch.Tensor) -> None:
        pass

    def step(self, t: torch.Tensor, **fields) -> None:
        pass


class StepRecorder(NoRecorder):
    """Appends one record per step to `stats`.

    A step is timed as [start .. comm_done) communication it started, [comm_done ..
    compute_done) compute, [compute_done .. step) communication it waited on; `comm_s` is the
    sum of both communication parts (only the exposed part, when the transfer overlapped the
    compute). On CUDA each mark syncs, so the times include the kernels queued before it.
    """

    enabled = True

    def __init__(self, stats: list, rank: int):
        self.stats, self.rank = stats, rank
        self.start()

    def start(self) -> None:
        self.t0 = self.t1 = self.t2 = time.perf_counter()

    def comm_done(self, t: torch.Tensor | None = None) -> None:
        if t is not None:  # a blocking collective: count its queued kernels as communication
            _sync(t)
        self.t1 = self.t2 = time.perf_counter()

    def compute_done(self, t: torch.Tensor) -> None:
        _sync(t)
        self.t2 = time.perf_counter()

    def step(self, t: torch.Tensor, **fields) -> None:
        """Close the step: `fields` are step, kv_block, q_tokens, kv_tokens, bytes_sent/recv
        (and comm_s, to override the measured one: a single rank communicates nothing)."""
        _sync(t)
        comm = (self.t1 - self.t0) + (time.perf_counter() - self.t2)
        self.stats.append({"step": fields.pop("step"), "rank": self.rank,
                           "kv_block": fields.pop("kv_block"), "q_tokens": fields.pop("q_tokens"),
                           "kv_tokens": fields.pop("kv_tokens"),
                           "compute_s": self.t2 - self.t1, "comm_s": comm, **fields})


NO_RECORDER = NoRecorder()  # stateless: one instance serves every loop


def recorder(stats: list | None, rank: int) -> NoRecorder:
    """A StepRecorder appending to `stats`, or the no-op when `stats` is None."""
    return NO_RECORDER if stats is None else StepRecorder(stats, rank)


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:  # timings must include the queued kernels
        torch.cuda.synchronize(t.device)
