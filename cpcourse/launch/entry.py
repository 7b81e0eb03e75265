"""What each process started by `cpcourse.launch` runs (you do not call this yourself).

    python -c "import cpcourse; print(cpcourse.launch('cpcourse.launch.entry:rank_info', 2))"

Two roles, chosen by the first argument:
- `--torchrun ARGS`: torchrun itself (`torch.distributed.run.main`), after asking Linux to
  SIGTERM it when the launching process dies, so a killed notebook kernel leaves no orphans.
- `RUN_DIR`: one worker rank. It prefixes its output with `[rank k]`, records its pid, registers a
  stack dump on SIGUSR1 (read by the launcher on a timeout), sets its thread count, initialises the
  process group, runs the target and writes either `rank{k}.pkl` (the return value) or
  `rank{k}.err` (the traceback as JSON) into RUN_DIR.
"""

from __future__ import annotations

import atexit
import faulthandler
import fcntl
import importlib
import importlib.util
import io
import json
import os
import pickle
import runpy
import signal
import sys
import time
import traceback

from cpcourse.launch.call import RankSpec

_KEEP = []  # files that must stay open for the life of the process (faulthandler's target)


def _set_parent_death_signal(sig: int) -> None:
    """Linux only: deliver `sig` to this process when its parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)


class _RankStream(io.TextIOBase):
    """Writes whole lines, each prefixed with `[rank k] `, to a file descriptor, unbuffered.

    The ranks share one pipe, and the kernel interleaves writes longer than PIPE_BUF (4 KiB)
    from different processes: each line is written under an exclusive lock on a file all ranks
    of the launch share, so a long line arrives whole. A partial line waits for its newline or
    for flush at exit.
    """

    def __init__(self, fd: int, prefix: str, lock_fd: int | None = None):
        self._fd, self._prefix, self._pending, self._lock = fd, prefix, "", lock_fd

    def writable(self):
        return True

    def fileno(self):
        return self._fd

    @property
    def encoding(self):
        return "utf-8"

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._write_all(f"{self._prefix}{line}\n".encode("utf-8", "replace"))
        return len(text)

    def _write_all(self, data: bytes) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            view = memoryview(data)
            while view:  # a write to a full pipe may take only part: finish under the lock
                view = view[os.write(self._fd, view):]
        finally:
            if self._lock is not None:
                fcntl.flock(self._lock, fcntl.LOCK_UN)

    def close_line(self) -> None:
        if self._pending:
            self.write("\n")


def _resolve(target: str):
    """`pkg.mod:fn` or `path/file.py:fn` -> the function; `path/file.py` -> None (run as script)."""
    if ":" in target:
        where, name = target.rsplit(":", 1)
        if where.endswith(".py") or os.sep in where:
            spec = importlib.util.spec_from_file_location("_cpcourse_target", where)
            module = importlib.util.module_from_spec(spec)
            sys.modules["_cpcourse_target"] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        return getattr(module, name)
    return None


def to_cpu(obj):
    """Move tensors (also inside lists, tuples, dicts) to CPU: the caller must never touch CUDA."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, list | tuple):
        return type(obj)(to_cpu(x) for x in obj)
    if isinstance(obj, dict):
        return {key: to_cpu(val) for key, val in obj.items()}
    return obj


def user_traceback(exc: BaseException, skip: tuple[str, ...] = ()) -> str:
    """The traceback without this file's, runpy's and `skip`'s frames: it starts in the
    learner's code."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, *skip)
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


_UNRESOLVED = object()


def call_target(target: str, args: tuple, kwargs: dict, fn=_UNRESOLVED):
    """Run a launch target in this process: a function's return value, or a script's global
    RESULT (the script sees `rank`, `world_size`, `torch` and `dist` predefined). `fn`: the
    target as `_resolve` already found it (None for a script), to import it only once."""
    import torch
    import torch.distributed as dist

    fn = _resolve(target) if fn is _UNRESOLVED else fn
    if fn is not None:
        return fn(*args, **kwargs)
    ready = {"rank": dist.get_rank(), "world_size": dist.get_world_size()} if (
        dist.is_initialized()) else {}
    try:
        scope = runpy.run_path(target, run_name="__main__",
                               init_globals={"torch": torch, "dist": dist, **ready})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
        scope = {}
    return scope.get("RESULT")


def current_op() -> str | None:
    """The communication call this rank was inside when it failed (from cpcourse.support.groups)."""
    cpdist = sys.modules.get("cpcourse.support.groups")
    record = getattr(getattr(cpdist, "_HEARTBEAT", None), "current", None) or {}
    return record.get("op") or record.get("failed_in")


def _write_atomic(path: str, data: bytes) -> None:
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)


def _run_rank(run_dir: str) -> int:
    rank = int(os.environ.get("RANK", "0"))
    prefix = f"[rank {rank}] "
    lock = os.open(os.path.join(run_dir, "output.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    out, err = _RankStream(1, prefix, lock), _RankStream(2, prefix, lock)
    sys.stdout, sys.stderr = out, err
    _set_parent_death_signal(signal.SIGKILL)
    spec = RankSpec.read(run_dir)
    stack = open(os.path.join(run_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115
    _KEEP.append(stack)
    faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    faulthandler.enable(file=stack)  # a segfault leaves "Fatal Python error" and its stack here
    _write_atomic(os.path.join(run_dir, f"rank{rank}.pid"), str(os.getpid()).encode())
    code = 0
    try:
        import torch

        torch.set_num_threads(int(spec.threads))
        if spec.init:
            from cpcourse.support import groups as cpdist

            cpdist.init(spec.backend)
        with open(os.path.join(run_dir, "args.pkl"), "rb") as fh:
            args, kwargs = pickle.load(fh)
        fn = _resolve(spec.target)
        # From here on the launcher's `timeout` runs (start-up has a limit of its own).
        _write_atomic(os.path.join(run_dir, f"rank{rank}.started"), b"")
        value = call_target(spec.target, args, kwargs, fn)
        try:
            data = pickle.dumps(to_cpu(value))
        except Exception as exc:  # noqa: BLE001  (reported, not raised: the run itself worked)
            print(f"return value could not be pickled ({exc}); the caller gets None")
            data = pickle.dumps(None)
        _write_atomic(os.path.join(run_dir, f"rank{rank}.pkl"), data)
    except BaseException as exc:  # noqa: BLE001  (every failure goes to the caller)
        record = {"rank": rank, "time": time.time(), "type": type(exc).__name__,
                  "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                  "traceback": user_traceback(exc), "op": current_op()}
        _write_atomic(os.path.join(run_dir, f"rank{rank}.err"), json.dumps(record).encode())
        code = 1
    out.close_line()
    err.close_line()
    if code:
        # Peers may be blocked in a collective with us; tearing the group down could block too.
        os._exit(code)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001  (the result is already written)
        pass
    # Run the atexit hooks, then skip the interpreter's teardown of torch (about a second per
    # rank on a small machine, for nothing: the result is on disk and the group is closed).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(0)


def rank_info() -> dict:
    """A trivial target: this rank's view of the world (used by tests and the docstring)."""
    import torch
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
            "threads": torch.get_num_threads(), "backend": dist.get_backend()}


def forked_rank(run_dir: str) -> None:
    """A rank forked by the fork server (torchrun has set its RANK etc. in os.environ)."""
    _run_rank(run_dir)


def _torchrun(argv: list[str]) -> None:
    """torchrun, its ranks forked from a preloaded server where `cpcourse.launch.forkserver`
    says so (argv ends with the run folder)."""
    _set_parent_death_signal(signal.SIGTERM)
    from cpcourse.launch.forkserver import use_fork_server

    use_fork_server(argv[-1], forked_rank)
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--torchrun":
        _torchrun(argv[1:])
        return 0
    return _run_rank(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
