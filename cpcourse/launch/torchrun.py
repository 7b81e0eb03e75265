"""`launch()` inside a rank of someone else's torchrun: run the target here, as that rank.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:PORT \
        -m cpcourse demo --nproc 4 --json

A process that torchrun started (RANK, WORLD_SIZE and MASTER_ADDR set) and that is not one of
cpcourse's own ranks (those have CPCOURSE_RUN_DIR) must not start a torchrun of its own: that
would put P ranks on every rank of the user's world, on one node. `launch()` asks
`torchrun_rank()` first and, inside a foreign torchrun, calls `run_here()`: nproc must equal
WORLD_SIZE, the process group comes from the environment (`cpcourse.support.groups.init`, a timeout
of seconds), the target runs in this process with the same args, and every rank's return value
is all-gathered, so every rank gets the same per-rank list `launch()` returns anywhere else.

Failures: the target's exception becomes a `RankError` naming this rank (an InputError's words
stay the message), raised at once without joining the gather, so its peers fail in their next
collective (connection closed, or the process-group timeout), never hang. The group is left as
it is then: tearing it down could block on a peer. After success the group is destroyed (unless
it existed before the call).

The command line (`cpcourse.cli.main`) turns on `rank_zero_reports`: then on every rank but
global rank 0, `launch()` ends the command with `RankDone` once the results are gathered, and
the CLI exits 0 there, so only rank 0 checks, saves and prints the report. The program then
ends with `end_process` (os._exit after flushing), not the interpreter's teardown of torch.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import time
from typing import NamedTuple

from cpcourse.launch.call import RankCall
from cpcourse.support.errors import require

ENV_RUN_DIR = "CPCOURSE_RUN_DIR"  # set in the ranks cpcourse.launch starts (support.groups too)
_STATE = {"rank_zero_reports": False, "joined": False}


class TorchrunRank(NamedTuple):
    """Where this process sits in a torchrun world: global rank, world size, rank on its node,
    and its node (torchrun's GROUP_RANK)."""

    rank: int
    world: int
    local_rank: int
    node: int


class RankDone(BaseException):  # noqa: N818  (not an error: control flow, like SystemExit)
    """This rank's part of a command is over: only global rank 0 reports (see the module)."""


def _env_int(name: str, default: str | None = None) -> int:
    text = os.environ.get(name, default)
    require(text is not None and text.strip().isdigit(),
            f"{name}={text!r} is not a whole number: this process looks like a torchrun rank "
            "(RANK, WORLD_SIZE and MASTER_ADDR are set); fix or unset them")
    return int(text)


def torchrun_rank() -> TorchrunRank | None:
    """This process's place in a torchrun world that cpcourse did not start, else None.

    A torchrun rank has RANK, WORLD_SIZE and MASTER_ADDR in its environment; the ranks
    `cpcourse.launch` starts also have CPCOURSE_RUN_DIR and are not counted (a target they run
    may call launch() again and then starts its own torchrun, as before).
    """
    env = os.environ
    if not all(env.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR")) or env.get(ENV_RUN_DIR):
        return None
    where = TorchrunRank(_env_int("RANK"), _env_int("WORLD_SIZE"),
                         _env_int("LOCAL_RANK", "0"), _env_int("GROUP_RANK", "0"))
    require(where.world >= 1 and where.rank < where.world,
            f"RANK={where.rank} is not a rank of WORLD_SIZE={where.world}: fix or unset them")
    return where


def check_world(nproc: int, where: TorchrunRank) -> None:
    """InputError unless `nproc` is the torchrun world's size (every rank says the same)."""
    require(nproc == where.world,
            f"running as rank {where.rank} of a torchrun world of {where.world}: pass nproc="
            f"{where.world} (got {nproc}) or leave `nproc` out, or start without torchrun")


@contextlib.contextmanager
def rank_zero_reports(on: bool = True):
    """While on, launch() inside a foreign torchrun raises `RankDone` on ranks other than 0
    after gathering the results (what the CLI wants: one report, from rank 0)."""
    before, _STATE["rank_zero_reports"] = _STATE["rank_zero_reports"], on
    try:
        yield
    finally:
        _STATE["rank_zero_reports"] = before


def end_process(code: int) -> None:
    """End a program that ran as a torchrun rank, if it joined a process group here: flush,
    run the atexit hooks (after success only: a failed rank's peers may still be inside the
    group), then os._exit, as cpcourse's own ranks do. The interpreter's teardown of torch
    with gloo threads still about can abort ("terminate called without an active exception")
    or block on a peer, and turn a finished command into a failed rank."""
    if not _STATE["joined"]:
        return
    import atexit

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if code == 0:
        atexit._run_exitfuncs()
    os._exit(code)


class _Lines(io.TextIOBase):
    """A file-like object handing whole lines, `[rank k] `-prefixed, to `sink(name, line)`."""

    def __init__(self, name: str, prefix: str, sink, keep: list[str]):
        self.name, self._prefix, self._sink, self._keep = name, prefix, sink, keep
        self._pending = ""

    def writable(self):
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def _emit(self, line: str) -> None:
        line = f"{self._prefix}{line}"
        self._keep.append(line)
        if self._sink:
            self._sink(self.name, line + "\n")

    def close_line(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending = ""


def _sink(stream, rank: int):
    """launch()'s `stream` for this rank: True prints (stdout lines go to stderr except on rank
    0, whose stdout carries a command's report), False keeps quiet, a callable gets each line."""
    if stream is True:
        def show(name, line):
            out = sys.stdout if name == "out" and rank == 0 else sys.stderr
            print(line, end="", flush=True, file=out)
        return show
    return (lambda name, line: stream(line)) if callable(stream) else None


@contextlib.contextmanager
def _environ(extra: dict):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update({k: str(v) for k, v in extra.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rank_error(exc: BaseException, rank: int, world: int, what: str | None = None):
    from cpcourse.launch.entry import current_op, user_traceback
    from cpcourse.launch.errors import RankError

    text = str(exc).strip()
    record = {"rank": rank, "time": time.time(), "type": type(exc).__name__,
              "message": (what + ": " if what else "") + (text.splitlines()[0] if text else ""),
              "traceback": user_traceback(exc, skip=(__file__,)), "op": current_op()}
    error = RankError(record, [], [])
    error.args = (f"{error.args[0]}\n(rank {rank} of a torchrun world of {world}, running "
                  "in this process)",)
    return error


def run_here(target: str, nproc: int, where: TorchrunRank, call: RankCall):
    """What `launch()` does inside a foreign torchrun rank (see the module docstring).

    Returns (values, seconds, output lines) on every rank, values indexed by global rank
    (launch() makes them its `RankResults`); raises `RankError` for this
    rank's own failure or a peer's (the peer's shows as a closed connection or a timeout), and
    `RankDone` on ranks other than 0 while `rank_zero_reports` is on. launch()'s wall-clock
    `timeout` is not enforced here (the processes are torchrun's): `pg_timeout` bounds every
    collective instead, so a lost peer fails the others within seconds.
    """
    import torch.distributed as dist

    backend, pg_timeout = call.backend, call.pg_timeout
    check_world(nproc, where)
    start = time.monotonic()
    ours = not dist.is_initialized()
    output: list[str] = []
    prefix = f"[rank {where.rank}] "
    sink = _sink(call.stream, where.rank)
    out, err = _Lines("out", prefix, sink, output), _Lines("err", prefix, sink, output)
    with _environ(dict(call.env or {})):
        if call.init or not ours:
            _join(where, nproc, backend, pg_timeout)
        value = _call_as_rank(target, call.args, call.kwargs, call.threads, where, out, err)
        # after an init=False target too: the gather needs a group
        _join(where, nproc, backend, pg_timeout)
        gathered = _gather(value, output, nproc, where, prefix)
    if ours:
        dist.destroy_process_group()
    if _STATE["rank_zero_reports"] and where.rank != 0:
        raise RankDone
    return ([value for value, _ in gathered], time.monotonic() - start,
            [line for _, lines in gathered for line in lines])


def _join(where: TorchrunRank, nproc: int, backend: str | None, pg_timeout: float) -> None:
    """Join the torchrun world's process group (a no-op once joined), as a `RankError`
    naming this rank when that fails."""
    import torch.distributed as dist

    from cpcourse.support import groups as cpdist

    _STATE["joined"] = True
    try:
        cpdist.init(backend, timeout_s=pg_timeout)
    except Exception as exc:  # noqa: BLE001  (a peer that never came, a bad address)
        raise _rank_error(exc, where.rank, where.world, "joining the process group "
                          f"(timeout {pg_timeout:g} s)") from None
    require(dist.get_world_size() == nproc, f"the process group this rank is in has "
            f"{dist.get_world_size()} ranks, not {nproc}")


def _call_as_rank(target: str, args: tuple, kwargs: dict | None, threads: int | None,
                  where: TorchrunRank, out: _Lines, err: _Lines):
    """The target's return value, called with this rank's output prefixed and `threads` torch
    threads; any failure but Ctrl-C as a `RankError` naming this rank."""
    import torch

    from cpcourse.launch.entry import call_target

    saved_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                return call_target(target, tuple(args), dict(kwargs or {}))
            finally:
                out.close_line()
                err.close_line()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001  (every failure names this rank)
        raise _rank_error(exc, where.rank, where.world) from None
    finally:
        torch.set_num_threads(saved_threads)


def _gather(value, output: list[str], nproc: int, where: TorchrunRank, prefix: str) -> list:
    """Every rank's (value, output lines), all-gathered; a value that does not pickle is
    sent as None, as launch() does."""
    import torch.distributed as dist

    from cpcourse.launch.entry import to_cpu
    from cpcourse.support import groups as cpdist

    try:
        value = to_cpu(value)
        pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001  (as launch() does: the run itself worked)
        print(f"{prefix}return value could not be pickled ({exc}); the caller gets None",
              file=sys.stderr)
        value = None
    gathered = [None] * nproc
    try:
        with cpdist.tracked("all_gather_object (the ranks' results)"):
            dist.all_gather_object(gathered, (value, output))
    except Exception as exc:  # noqa: BLE001  (a peer failed, or never got here)
        raise _rank_error(exc, where.rank, where.world,
                          "collecting every rank's result") from None
    return gathered
