"""Watching a launch's ranks until they finish, fail or run out of time, then collecting them.

    python -c "import cpcourse; print(cpcourse.launch('cpcourse.launch.entry:rank_info', 2))"

`cpcourse.launch.launcher` starts torchrun and hands over a `Run`: its run folder, torchrun's
process and the queue its two pipe readers fill. `watch` passes the ranks' output on and reads
the run folder (`rank{k}.started`, `.pkl`, `.err`) until every rank has returned and exited, one
has failed, torchrun is gone or time runs out; Ctrl-C or SIGTERM there ends the process tree and
removes the folder. `collect` ends the process tree and returns every rank's result or raises
what went wrong (a rank's exception or death, the timeout, a rank with no result).
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import sys
import time

from cpcourse.launch import proctree
from cpcourse.launch.errors import (
    LaunchError,
    LaunchTimeout,
    rank_death,
    rank_error,
    rank_procs,
    stuck_report,
)

# After the first failing rank, time for the others to report theirs and for torchrun to stop
# its workers and print its failure summary: the only place a rank that died without raising
# (os._exit, a signal) has its exit code. torchrun normally exits well within it.
_ERROR_WAIT_S = 3.5


class Run:
    """One launch in flight: its run folder, torchrun's process, the two pipe readers and what
    they have read (rank lines in `output`, torchrun's own in `launcher_log`), and the workers
    noted while torchrun still knew them."""

    def __init__(self, nproc: int, run_dir: str, marker: str, stream):
        self.nproc, self.run_dir, self.marker = nproc, run_dir, marker
        self.sink = (lambda name, line: print(
            line, end="", flush=True, file=sys.stdout if name == "out" else sys.stderr)
        ) if stream is True else (lambda name, line: stream(line)) if callable(stream) else None
        self.lines: queue.Queue = queue.Queue()
        self.output, self.launcher_log, self.noted = [], [], set()
        self.open_pipes = 2
        self.first_error_at = None
        self.proc, self.readers, self.start = None, [], 0.0

    def take(self, name, line) -> None:
        if line is None:
            self.open_pipes -= 1
        elif line.startswith("[rank "):
            self.output.append(line.rstrip("\n"))
            if self.sink:
                self.sink(name, line)
        else:
            self.launcher_log.append(line.rstrip("\n"))

    def drain(self) -> None:
        while True:
            try:
                self.take(*self.lines.get_nowait())
            except queue.Empty:
                break



def watch(run: Run, timeout: float, start_timeout: float) -> LaunchTimeout | None:
    """Pass the ranks' output on until every rank has returned and exited, one has failed (and
    the others had `_ERROR_WAIT_S` to report), torchrun is gone, or time runs out: then the
    `LaunchTimeout` naming where each rank was stuck is returned. Ctrl-C or SIGTERM here ends
    the process tree and removes the run folder before it propagates."""
    nproc, run_dir, proc = run.nproc, run.run_dir, run.proc
    running_since, next_scan = None, 0.0
    restore = proctree.raise_on_sigterm()
    try:
        while run.open_pipes:
            try:
                run.take(*run.lines.get(timeout=0.05))
                for _ in range(1000):
                    run.take(*run.lines.get_nowait())
            except queue.Empty:
                pass
            now = time.monotonic()
            if now >= next_scan:  # note the workers while torchrun still knows them
                run.noted |= proctree.descendants(proc.pid)
                next_scan = now + 0.5
            names = os.listdir(run_dir)
            if run.first_error_at is None and any(f.endswith(".err") for f in names):
                run.first_error_at = now
            if sum(f.endswith(".pkl") and f.startswith("rank") for f in names) == nproc and (
                    not any(proctree.alive(p) for p in rank_procs(run_dir, nproc))):
                break  # every rank returned and exited: torchrun's own teardown is not needed
            if run.first_error_at is not None and now - run.first_error_at > _ERROR_WAIT_S:
                break  # torchrun did not end its failed workers by itself: end them
            if proc.poll() is not None and not any(proctree.alive(p) for p in run.noted):
                break  # only an unnoted process still holds the pipe: end_tree finds it
            if running_since is None and sum(f.endswith(".started") for f in names) == nproc:
                running_since = now
            if (now - running_since > timeout) if running_since else (
                    now - run.start > start_timeout):
                stuck, finished = stuck_report(run_dir, nproc)
                return LaunchTimeout(timeout if running_since else start_timeout, stuck,
                                     finished, starting=running_since is None)
    except (KeyboardInterrupt, proctree.Terminated):
        proctree.end_tree(proc, run.noted, run.marker)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        restore()
    return None


def collect(run: Run, failure: LaunchTimeout | None) -> tuple[list, float, list[str]]:
    """End the process tree, read the last lines, and return every rank's result (with the
    seconds since the start and the rank lines), or raise what went wrong: a rank's exception
    or death, the timeout, or a rank with no result."""
    nproc, run_dir = run.nproc, run.run_dir
    # Success: the workers are gone and torchrun has nothing left to do, so no grace for it.
    # Otherwise SIGTERM first: torchrun then stops its workers itself.
    done = failure is None and run.first_error_at is None and not rank_procs(run_dir, nproc)
    proctree.end_tree(run.proc, run.noted, run.marker, grace_s=0.0 if done else 3.0)
    for reader in run.readers:  # every writer is gone now: the pipes reach end-of-file
        reader.join(timeout=2.0)
    run.drain()
    try:
        failure = _failure(run, failure)
        if failure is not None:
            raise failure
        values = []
        for r in range(nproc):
            with open(os.path.join(run_dir, f"rank{r}.pkl"), "rb") as fh:
                values.append(pickle.load(fh))
        return values, time.monotonic() - run.start, run.output
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _failure(run: Run, failure: LaunchTimeout | None) -> LaunchError | None:
    """What the caller should see: a rank that crashed outright, else a rank's exception, else
    the timeout, else a rank that left no result; None when every rank returned."""
    nproc, run_dir = run.nproc, run.run_dir
    raised = rank_error(run_dir, nproc)
    # After a timeout the launcher itself ended the ranks: none of them "died".
    died = (None if isinstance(failure, LaunchTimeout)
            else rank_death(run_dir, nproc, "\n".join(run.launcher_log)))
    # A rank that crashed outright comes first: its peers' "connection reset" is an echo.
    failure = (died if died and (raised is None or raised.peer_failure) else raised) or failure
    if failure is None:
        missing = [r for r in range(nproc)
                   if not os.path.exists(os.path.join(run_dir, f"rank{r}.pkl"))]
        if missing:
            tail = "\n".join(run.launcher_log[-15:])
            failure = LaunchError(
                f"rank {', '.join(map(str, missing))} ended without a result or a Python "
                f"exception (killed by a signal?); torchrun exit code {run.proc.returncode}; "
                f"its last lines:\n{tail}")
    return failure
