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
On Linux the ranks are forked from a server that imported torch once (`CPCOURSE_RANK_START=exec`
starts each as a fresh interpreter instead; see `cpcourse.launch.forkserver`).
The calling process never imports CUDA or creates a process group.
Inside a rank of the user's own torchrun (RANK, WORLD_SIZE, MASTER_ADDR set; see
`cpcourse.launch.torchrun`) nothing is started: nproc must be WORLD_SIZE, the target runs in
this process as that rank, and every rank gets the list of all ranks' return values.
The `%%torchrun` cell magic (`cpcourse.launch.magic`) calls `launch` on a cell's code.
This module checks the arguments and starts torchrun; `cpcourse.launch.watch` follows the ranks
and collects their results.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from cpcourse.launch.call import RankCall, RankSpec
from cpcourse.launch.forkserver import start_method
from cpcourse.launch.sweep import sweep_stale, write_owner
from cpcourse.launch.torchrun import run_here, torchrun_rank
from cpcourse.launch.watch import Run, collect, watch
from cpcourse.support.errors import positive_float, positive_int, require
from cpcourse.support.request import check_nproc

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 86_400.0  # a day: longer is no wall-clock limit at all


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


def target_name(target) -> str:
    """`target` as launch() passes it to the ranks: a module-level function becomes its
    "module:function" (the ranks import it by name, so a reader and a type checker can follow
    `launch(generate_rank, 2)` to the code); a string is returned as it is."""
    if not callable(target) or isinstance(target, str):
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", "")
    require(module not in (None, "__main__") and "<" not in qualname and "." not in qualname,
            f"launch() imports the target on every rank, and {qualname or target!r} is not a "
            "module-level function of an importable module: move it into a module (or a "
            "%%torchrun cell), or pass 'path/file.py:function'")
    return f"{module}:{qualname}"


def _check_target(target: str) -> None:
    require(isinstance(target, str) and target,
            "target must be a module-level function, 'module:function' or a file path")
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


def _pump(pipe, name: str, out: queue.Queue) -> None:
    for raw in iter(pipe.readline, b""):
        out.put((name, raw.decode("utf-8", "replace")))
    out.put((name, None))


def launch(target, nproc: int, timeout: float = DEFAULT_TIMEOUT_S, env: dict | None = None,
           *, args: tuple = (), kwargs: dict | None = None, threads: int | None = None,
           pg_timeout: float | None = None, backend: str | None = None, init: bool = True,
           stream=True, start_timeout: float = 120.0) -> RankResults:
    """Run `target` on `nproc` local ranks; return its per-rank return values.

    target: a module-level function, "pkg.module:function", "path/file.py:function" (called
    with *args, **kwargs on every rank, after the process group is initialised) or
    "path/file.py" (run as a script).
    timeout: seconds the target may run, counted once every rank has started it (start-up,
    mostly importing torch, has its own `start_timeout`); pg_timeout: the process group's own
    timeout (default min(30, timeout)). threads: torch threads per rank (default
    OMP_NUM_THREADS, else 1).
    stream: True prints rank output here, False keeps it quiet, a callable receives each line.
    Inside a foreign torchrun rank (`torchrun_rank()` is not None) the target runs here instead.

    The steps: check every argument (nothing starts on a bad one), remove the run folders a
    killed caller left (`cpcourse.launch.sweep`), start torchrun on the ranks,
    watch them until they finish, fail or run out of time, then end the process tree and
    return the results or raise the failure.
    """
    target = target_name(target)
    nproc, timeout, start_timeout, threads, pg_timeout = _checked(
        target, nproc, timeout, start_timeout, backend, env, threads, pg_timeout)
    where = torchrun_rank()
    check_backend(backend, env, 1 if where else nproc)
    start_method({**os.environ, **(env or {})})  # a bad CPCOURSE_RANK_START, named here
    call = RankCall(tuple(args), kwargs, env, threads, pg_timeout, backend, init, stream)
    if where is not None:  # a rank of the user's own torchrun: run here, as that rank
        values, seconds, output = run_here(_absolute(target), nproc, where, call)
    else:
        sweep_stale()  # the folders of launches whose caller was SIGKILLed
        run = _start(target, nproc, call)
        failure = watch(run, timeout, start_timeout)
        values, seconds, output = collect(run, failure)
    results = RankResults(values)
    results.seconds, results.output = seconds, output
    return results


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
    if threads is None:  # from the environment: its name is what the user must change
        require(str(omp).strip().isdigit() and int(omp) > 0, f"OMP_NUM_THREADS={omp!r} is not a "
                "positive whole number: unset it, or set it to the threads each rank should use "
                "(e.g. 1)")
        threads = int(omp)
    threads = positive_int("threads", threads)
    pg_timeout = positive_float("pg_timeout", pg_timeout or min(30.0, timeout))
    return nproc, timeout, start_timeout, threads, pg_timeout


def check_backend(backend: str | None, env: dict | None, local_ranks: int) -> None:
    """The backend the ranks will use, checked here: a bad CPCOURSE_BACKEND, or nccl without a
    GPU for each local rank, otherwise fails inside every rank after start-up."""
    source = "backend"
    if backend is None:
        source = "CPCOURSE_BACKEND"
        backend = ((env or {}).get(source) or os.environ.get(source) or "").strip() or None
        require(backend in (None, "gloo", "nccl"), f"CPCOURSE_BACKEND={backend!r} must be "
                "'gloo' or 'nccl': fix it, or unset it to choose by the GPUs present")
    if backend != "nccl":
        return
    import torch  # only here: device_count() asks NVML, without starting CUDA in this process

    gpus = torch.cuda.device_count()
    require(gpus >= local_ranks, f"{source}='nccl' needs a CUDA GPU per local rank "
            f"({local_ranks} here), and this machine has {gpus}: use 'gloo', or leave "
            f"{source} unset to choose by the GPUs present")


def _start(target: str, nproc: int, call: RankCall) -> Run:
    """Write the run folder (the target, its arguments, a temp dir) and start torchrun on it,
    its stdout and stderr read into the run's queue by two threads."""
    env, threads, backend = call.env, call.threads, call.backend
    run = Run(nproc, tempfile.mkdtemp(prefix="cpcourse-launch-"), f"cpcourse-{uuid.uuid4().hex}",
              call.stream)
    write_owner(run.run_dir)  # a later launch's sweep takes the folder once these pids are dead
    RankSpec(_absolute(target), threads, call.init, backend).write(run.run_dir)
    with open(os.path.join(run.run_dir, "args.pkl"), "wb") as fh:
        pickle.dump((tuple(call.args), dict(call.kwargs or {})), fh)
    child_env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
                 "CPCOURSE_PG_TIMEOUT": str(call.pg_timeout), "CPCOURSE_RUN_DIR": run.run_dir,
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
    write_owner(run.run_dir, run.proc.pid, "torchrun.pid")
    run.readers = [threading.Thread(target=_pump, args=(pipe, name, run.lines), daemon=True)
                   for name, pipe in (("out", run.proc.stdout), ("err", run.proc.stderr))]
    for reader in run.readers:
        reader.start()
    return run
