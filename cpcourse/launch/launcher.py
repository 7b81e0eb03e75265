"""Run a function on N local processes through torchrun, from a script or a notebook cell.

    python -c "import cpcourse; print(cpcourse.launch('cpcourse.launch.entry:rank_info', 2))"

`launch("pkg.module:function", nproc)` (or a file path, or `path/file.py:function`) starts
`torchrun --standalone --nproc-per-node N` in a subprocess: gloo on CPU, NCCL when every rank has
a GPU, a free port, one thread per rank unless OMP_NUM_THREADS says otherwise, and a process-group
timeout of seconds. Every rank's output is streamed with a `[rank k]` prefix; the call returns the
list of per-rank return values (a file target returns its global `RESULT`, else None).
A rank that raises makes the call raise `RankError` with that rank's traceback within about a
second; a run past `timeout` raises `LaunchTimeout` naming each rank and the call it was stuck in.
Whatever happens (error, timeout, Ctrl-C / kernel interrupt) the whole process tree is ended.
The calling process never imports CUDA or creates a process group.
Inside a rank of the user's own torchrun (RANK, WORLD_SIZE, MASTER_ADDR set; see
`cpcourse.launch.torchrun`) nothing is started: nproc must be WORLD_SIZE, the target runs in
this process as that rank, and every rank gets the list of all ranks' return values.
The `%%torchrun` cell magic (`cpcourse.launch.magic`) calls `launch` on a cell's code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import pickle
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from cpcourse.launch import proctree
from cpcourse.launch.errors import (  # noqa: F401
    LaunchError,
    LaunchTimeout,
    RankError,
    rank_death,
    rank_error,
    rank_procs,
    stuck_report,
)
from cpcourse.launch.torchrun import run_here, torchrun_rank
from cpcourse.support.errors import positive_float, positive_int, require

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 86_400.0  # a day: longer is no wall-clock limit at all
MAX_NPROC = 64  # local ranks; past this a launch only thrashes (and 1000 never finished starting)
# After the first failing rank, time for the others to report theirs and for torchrun to stop
# its workers and print its failure summary: the only place a rank that died without raising
# (os._exit, a signal) has its exit code. torchrun normally exits well within it.
_ERROR_WAIT_S = 3.5


def check_nproc(nproc, flag: str = "nproc") -> int:
    """`nproc` as a whole number of local ranks in 1 .. MAX_NPROC, or an InputError naming
    `flag` (the commands check it before anything else, with their own flag's name)."""
    nproc = positive_int(flag, nproc)
    require(nproc <= MAX_NPROC, f"{flag} {nproc} is more local processes than cpcourse starts: "
            f"use {MAX_NPROC} or fewer (more ranks than cores only oversubscribe the machine)")
    return nproc


class RankResults(list):
    """Per-rank return values (index = rank), plus `seconds` (wall time) and `output` (lines)."""

    seconds: float = 0.0
    output: list[str]


def _child_pythonpath() -> str:
    """The caller's cwd and extra sys.path entries (a notebook may add the repo root)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
    extra = [os.getcwd()] + [
        p for p in sys.path if p and os.path.isdir(p)
        and not any(os.path.realpath(p).startswith(pre) for pre in prefixes)]
    old = os.environ.get("PYTHONPATH")
    return os.pathsep.join(dict.fromkeys(extra + ([old] if old else [])))


def _check_target(target: str) -> None:
    require(isinstance(target, str) and target, "target must be 'module:function' or a file path")
    where = target.rsplit(":", 1)[0] if ":" in target else target
    if where.endswith(".py") or os.sep in where or ":" not in target:
        require(os.path.isfile(where), f"no such file {where!r}: give 'module:function' or the "
                "path of an existing .py file")
        return
    # Found here, not by every rank after start-up. Only the top-level package is looked up, on
    # the path the ranks get, and nothing is imported in this process.
    top = where.split(".")[0]
    search = _child_pythonpath().split(os.pathsep) + sys.path
    found = top in sys.modules or importlib.machinery.PathFinder.find_spec(top, search) is not None
    require(found or importlib.util.find_spec(top) is not None,
            f"no module {top!r} to import for target {target!r}: check the name, and that its "
            "folder is on sys.path or is this process's working directory")


def _absolute(target: str) -> str:
    """File targets as absolute paths (the workers' cwd is ours, but be explicit)."""
    where, _, fn = target.rpartition(":") if ":" in target else (target, "", "")
    if where.endswith(".py") or os.sep in where or not fn:
        where = os.path.abspath(where)
    return f"{where}:{fn}" if fn else where


class _Terminated(SystemExit):
    """SIGTERM reached the caller while its ranks ran: end them and clean up, then exit 143."""


def _raise_on_sigterm():
    """While ranks run, SIGTERM (a job scheduler's stop, `kill PID`) raises `_Terminated` so the
    launch ends its process tree and removes its run folder; without this the default action
    kills the caller at once and leaves the folder behind. Only from the main thread, and only
    over the default disposition (a handler the caller installed is left alone). Returns the
    function that restores the previous handler."""
    if threading.current_thread() is not threading.main_thread() or (
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return lambda: None

    def handler(signum, frame):
        raise _Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _pump(pipe, name: str, out: queue.Queue) -> None:
    for raw in iter(pipe.readline, b""):
        out.put((name, raw.decode("utf-8", "replace")))
    out.put((name, None))


def launch(target: str, nproc: int, timeout: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
           *, args: tuple = (), kwargs: dict | None = None, threads: int | None = None,
           pg_timeout: float | None = None, backend: str | None = None, init: bool = True,
           stream=True, start_timeout: float = 120.0) -> RankResults:
    """Run `target` on `nproc` local ranks; return its per-rank return values.

    target: "pkg.module:function", "path/file.py:function" (called with *args, **kwargs on every
    rank, after the process group is initialised) or "path/file.py" (run as a script).
    timeout: seconds the target may run, counted once every rank has started it (start-up,
    mostly importing torch, has its own `start_timeout`); pg_timeout: the process group's own
    timeout (default min(30, timeout)). threads: torch threads per rank (default
    OMP_NUM_THREADS, else 1).
    stream: True prints rank output here, False keeps it quiet, a callable receives each line.
    Inside a foreign torchrun rank (`torchrun_rank()` is not None) the target runs here instead.

    The steps: check every argument (nothing starts on a bad one), start torchrun on the ranks,
    watch them until they finish, fail or run out of time, then end the process tree and
    return the results or raise the failure.
    """
    nproc, timeout, start_timeout, threads, pg_timeout = _checked(
        target, nproc, timeout, start_timeout, backend, env, threads, pg_timeout)
    where = torchrun_rank()
    if where is not None:  # a rank of the user's own torchrun: run here, as that rank
        values, seconds, output = run_here(
            _absolute(target), nproc, where, args=args, kwargs=kwargs, env=env, threads=threads,
            pg_timeout=pg_timeout, backend=backend, init=init, stream=stream)
        results = RankResults(values)
        results.seconds, results.output = seconds, output
        return results
    run = _start(target, nproc, env=env, args=args, kwargs=kwargs, threads=threads,
                 pg_timeout=pg_timeout, backend=backend, init=init, stream=stream)
    failure = _watch(run, timeout, start_timeout)
    return _collect(run, failure)


def _checked(target, nproc, timeout, start_timeout, backend, env, threads, pg_timeout) -> tuple:
    """launch()'s numbers checked, in the order the errors name them: (nproc, timeout,
    start_timeout, threads, pg_timeout). Nothing has started yet."""
    nproc = check_nproc(nproc)
    timeout = positive_float("timeout", timeout, high=MAX_TIMEOUT_S)
    start_timeout = positive_float("start_timeout", start_timeout, high=MAX_TIMEOUT_S)
    _check_target(target)
    require(backend in (None, "gloo", "nccl"),
            f"backend must be 'gloo' or 'nccl' (or None to choose), got {backend!r}")
    omp = (env or {}).get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "1"
    if threads is None:
        require(str(omp).strip().isdigit(), f"OMP_NUM_THREADS={omp!r} is not a whole number: "
                "unset it, or set it to the threads each rank should use (e.g. 1)")
        threads = int(omp)
    threads = positive_int("threads", threads)
    pg_timeout = positive_float("pg_timeout", pg_timeout or min(30.0, timeout))
    return nproc, timeout, start_timeout, threads, pg_timeout


class _Run:
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


def _start(target: str, nproc: int, *, env, args, kwargs, threads, pg_timeout, backend, init,
           stream) -> _Run:
    """Write the run folder (the target, its arguments, a temp dir) and start torchrun on it,
    its stdout and stderr read into the run's queue by two threads."""
    run = _Run(nproc, tempfile.mkdtemp(prefix="cpcourse-launch-"), f"cpcourse-{uuid.uuid4().hex}",
               stream)
    with open(os.path.join(run.run_dir, "spec.json"), "w") as fh:
        json.dump({"target": _absolute(target),
                   "threads": threads, "init": init, "backend": backend}, fh)
    with open(os.path.join(run.run_dir, "args.pkl"), "wb") as fh:
        pickle.dump((tuple(args), dict(kwargs or {})), fh)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                 "CPCOURSE_PG_TIMEOUT": str(pg_timeout), "CPCOURSE_RUN_DIR": run.run_dir,
                 "CPCOURSE_LAUNCH_ID": run.marker, "PYTHONPATH": _child_pythonpath(),
                 "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env["OMP_NUM_THREADS"] = str(threads)  # torch.set_num_threads(threads) in each rank
    # torchrun leaves a torchelastic_* folder in the temp dir after every run: give it (and the
    # ranks' own temporary files) a temp dir inside run_dir, removed with it.
    child_env["TMPDIR"] = os.path.join(run.run_dir, "tmp")
    os.mkdir(child_env["TMPDIR"])
    if backend:
        child_env["CPCOURSE_BACKEND"] = backend
    cmd = [sys.executable, "-m", "cpcourse.launch.entry", "--torchrun", "--standalone",
           f"--nproc-per-node={nproc}", "--monitor-interval=0.1", "-m", "cpcourse.launch.entry",
           run.run_dir]
    run.start = time.monotonic()
    run.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=child_env, start_new_session=True)
    run.readers = [threading.Thread(target=_pump, args=(pipe, name, run.lines), daemon=True)
                   for name, pipe in (("out", run.proc.stdout), ("err", run.proc.stderr))]
    for reader in run.readers:
        reader.start()
    return run


def _watch(run: _Run, timeout: float, start_timeout: float) -> LaunchTimeout | None:
    """Pass the ranks' output on until every rank has returned and exited, one has failed (and
    the others had `_ERROR_WAIT_S` to report), torchrun is gone, or time runs out: then the
    `LaunchTimeout` naming where each rank was stuck is returned. Ctrl-C or SIGTERM here ends
    the process tree and removes the run folder before it propagates."""
    nproc, run_dir, proc = run.nproc, run.run_dir, run.proc
    running_since, next_scan = None, 0.0
    restore = _raise_on_sigterm()
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
    except (KeyboardInterrupt, _Terminated):
        proctree.end_tree(proc, run.noted, run.marker)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        restore()
    return None


def _collect(run: _Run, failure: LaunchTimeout | None) -> RankResults:
    """End the process tree, read the last lines, and return every rank's result, or raise
    what went wrong: a rank's exception or death, the timeout, or a rank with no result."""
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
        results = RankResults()
        for r in range(nproc):
            with open(os.path.join(run_dir, f"rank{r}.pkl"), "rb") as fh:
                results.append(pickle.load(fh))
        results.seconds, results.output = time.monotonic() - run.start, run.output
        return results
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _failure(run: _Run, failure: LaunchTimeout | None) -> LaunchError | None:
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
