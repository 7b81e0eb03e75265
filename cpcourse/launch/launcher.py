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

In Jupyter: `%load_ext cpcourse`, then a cell starting with `%%torchrun -n 4 [--timeout S]`
runs the cell's code on 4 ranks, with `rank`, `world_size`, `torch` and `dist` predefined.
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
    """
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
    where = torchrun_rank()
    if where is not None:  # a rank of the user's own torchrun: run here, as that rank
        values, seconds, output = run_here(
            _absolute(target), nproc, where, args=args, kwargs=kwargs, env=env, threads=threads,
            pg_timeout=pg_timeout, backend=backend, init=init, stream=stream)
        results = RankResults(values)
        results.seconds, results.output = seconds, output
        return results
    run_dir = tempfile.mkdtemp(prefix="cpcourse-launch-")
    marker = f"cpcourse-{uuid.uuid4().hex}"
    with open(os.path.join(run_dir, "spec.json"), "w") as fh:
        json.dump({"target": _absolute(target),
                   "threads": threads, "init": init, "backend": backend}, fh)
    with open(os.path.join(run_dir, "args.pkl"), "wb") as fh:
        pickle.dump((tuple(args), dict(kwargs or {})), fh)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                 "CPCOURSE_PG_TIMEOUT": str(pg_timeout), "CPCOURSE_RUN_DIR": run_dir,
                 "CPCOURSE_LAUNCH_ID": marker, "PYTHONPATH": _child_pythonpath(),
                 "TORCH_CPP_LOG_LEVEL": os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR")}
    child_env.update({k: str(v) for k, v in (env or {}).items()})
    child_env["OMP_NUM_THREADS"] = str(threads)  # torch.set_num_threads(threads) in each rank
    # torchrun leaves a torchelastic_* folder in the temp dir after every run: give it (and the
    # ranks' own temporary files) a temp dir inside run_dir, removed with it.
    child_env["TMPDIR"] = os.path.join(run_dir, "tmp")
    os.mkdir(child_env["TMPDIR"])
    if backend:
        child_env["CPCOURSE_BACKEND"] = backend
    cmd = [sys.executable, "-m", "cpcourse.launch.entry", "--torchrun", "--standalone",
           f"--nproc-per-node={nproc}", "--monitor-interval=0.1", "-m", "cpcourse.launch.entry",
           run_dir]
    sink = (lambda name, line: print(line, end="", flush=True,
                                     file=sys.stdout if name == "out" else sys.stderr)
            ) if stream is True else (lambda name, line: stream(line)) if callable(stream) else None
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_pump, args=(pipe, name, lines), daemon=True)
               for name, pipe in (("out", proc.stdout), ("err", proc.stderr))]
    for reader in readers:
        reader.start()
    output, launcher_log, noted = [], [], set()
    state = {"open": 2}

    def take(name, line):
        if line is None:
            state["open"] -= 1
        elif line.startswith("[rank "):
            output.append(line.rstrip("\n"))
            if sink:
                sink(name, line)
        else:
            launcher_log.append(line.rstrip("\n"))

    first_error_at, running_since, next_scan, failure = None, None, 0.0, None
    restore = _raise_on_sigterm()
    try:
        while state["open"]:
            try:
                take(*lines.get(timeout=0.05))
                for _ in range(1000):
                    take(*lines.get_nowait())
            except queue.Empty:
                pass
            now = time.monotonic()
            if now >= next_scan:  # note the workers while torchrun still knows them
                noted |= proctree.descendants(proc.pid)
                next_scan = now + 0.5
            names = os.listdir(run_dir)
            if first_error_at is None and any(f.endswith(".err") for f in names):
                first_error_at = now
            if sum(f.endswith(".pkl") and f.startswith("rank") for f in names) == nproc and (
                    not any(proctree.alive(p) for p in rank_procs(run_dir, nproc))):
                break  # every rank returned and exited: torchrun's own teardown is not needed
            if first_error_at is not None and now - first_error_at > _ERROR_WAIT_S:
                break  # torchrun did not end its failed workers by itself: end them
            if proc.poll() is not None and not any(proctree.alive(p) for p in noted):
                break  # only an unnoted process still holds the pipe: end_tree finds it
            if running_since is None and sum(f.endswith(".started") for f in names) == nproc:
                running_since = now
            if (now - running_since > timeout) if running_since else (
                    now - start > start_timeout):
                stuck, finished = stuck_report(run_dir, nproc)
                failure = LaunchTimeout(timeout if running_since else start_timeout, stuck,
                                        finished, starting=running_since is None)
                break
    except (KeyboardInterrupt, _Terminated):
        proctree.end_tree(proc, noted, marker)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        restore()
    # Success: the workers are gone and torchrun has nothing left to do, so no grace for it.
    # Otherwise SIGTERM first: torchrun then stops its workers itself.
    done = failure is None and first_error_at is None and not rank_procs(run_dir, nproc)
    proctree.end_tree(proc, noted, marker, grace_s=0.0 if done else 3.0)
    for reader in readers:  # every writer is gone now: the pipes reach end-of-file
        reader.join(timeout=2.0)
    while True:
        try:
            take(*lines.get_nowait())
        except queue.Empty:
            break
    try:
        raised = rank_error(run_dir, nproc)
        # After a timeout the launcher itself ended the ranks: none of them "died".
        died = (None if isinstance(failure, LaunchTimeout)
                else rank_death(run_dir, nproc, "\n".join(launcher_log)))
        # A rank that crashed outright comes first: its peers' "connection reset" is an echo.
        failure = (died if died and (raised is None or raised.peer_failure) else raised) or failure
        if failure is None:
            missing = [r for r in range(nproc)
                       if not os.path.exists(os.path.join(run_dir, f"rank{r}.pkl"))]
            if missing:
                tail = "\n".join(launcher_log[-15:])
                failure = LaunchError(
                    f"rank {', '.join(map(str, missing))} ended without a result or a Python "
                    f"exception (killed by a signal?); torchrun exit code {proc.returncode}; "
                    f"its last lines:\n{tail}")
        if failure is not None:
            raise failure
        results = RankResults()
        for r in range(nproc):
            with open(os.path.join(run_dir, f"rank{r}.pkl"), "rb") as fh:
                results.append(pickle.load(fh))
        results.seconds, results.output = time.monotonic() - start, output
        return results
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


# --- the %%torchrun cell magic -------------------------------------------------------------------

def _magic_parser():
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="%%torchrun", add_help=False)
    p.add_argument("-n", "--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="store the per-rank RESULT list in this variable")
    return p


def torchrun_cell(line: str, cell: str, user_ns: dict | None = None) -> RankResults:
    """Run a cell's code on `-n` ranks (what `%%torchrun` calls)."""
    import shlex

    opts = _magic_parser().parse_args(shlex.split(line))
    cell_dir = tempfile.mkdtemp(prefix="cpcourse-cell-")
    path = os.path.join(cell_dir, "torchrun_cell.py")
    with open(path, "w") as fh:
        fh.write(cell)
    try:
        results = launch(path, opts.nproc, timeout=opts.timeout, threads=opts.threads)
    except LaunchError as exc:
        if isinstance(exc, RankError):
            raise exc.renamed(path, "<%%torchrun cell>") from None
        exc.args = (exc.args[0].replace("torchrun_cell.py", "<%%torchrun cell>"),)
        raise exc from None
    finally:
        shutil.rmtree(cell_dir, ignore_errors=True)
    if opts.out and user_ns is not None:
        user_ns[opts.out] = results
    return results


def register_magics(ipython) -> None:
    """Register `%%torchrun` on an IPython shell (called by `%load_ext cpcourse`)."""

    def torchrun(line, cell):
        torchrun_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
