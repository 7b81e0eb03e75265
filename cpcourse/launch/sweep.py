"""Removing the run folders of launches whose processes are all gone (a SIGKILLed caller).

    python -c "from cpcourse.launch.sweep import sweep_stale; print(sweep_stale())"

A launch removes its `cpcourse-launch-*` folder (in the temp dir) whatever happens, except when
the caller itself is killed outright (SIGKILL, a kernel restart, the OOM killer): nothing runs
then. `launch()` therefore sweeps the temp dir first. A folder goes only when it is safely dead:
- it is this user's, and older than `min_age_s` (a launch that is just starting has written no
  pid yet);
- none of the pids that could still use it is alive: `owner.pid` (the caller, with its pid
  namespace), `torchrun.pid`, `rank{k}.pid`;
- `owner.pid` names this pid namespace (a folder from another container on a shared /tmp names
  pids that mean nothing here: it is left alone).
A folder without `owner.pid` (a caller killed between creating it and writing the file, or a
cpcourse from before owner.pid) must be older than `NO_OWNER_AGE_S` instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time

from cpcourse.launch import proctree

PREFIX = "cpcourse-launch-"
OWNER = "owner.pid"  # "pid pid-namespace": the caller that created the folder
MIN_AGE_S = 60.0
NO_OWNER_AGE_S = 86_400.0  # a day: longer than any launch's start-up and timeout


def _namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"), or "" where there is no /proc."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def write_owner(run_dir: str, pid: int | None = None, name: str = OWNER) -> None:
    """Record `pid` (default: this process) as one that may still use `run_dir`."""
    with open(os.path.join(run_dir, name), "w") as fh:
        fh.write(f"{os.getpid() if pid is None else pid} {_namespace()}")


def _pids(run_dir: str) -> dict[str, tuple[int, str | None]] | None:
    """file name -> (pid, namespace or None when not recorded) for every pid file in
    `run_dir`; None when the folder cannot be read."""
    found = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return None
    for name in names:
        if not name.endswith(".pid"):
            continue
        try:
            with open(os.path.join(run_dir, name)) as fh:
                pid, *ns = fh.read().split()
            found[name] = (int(pid), ns[0] if ns else None)
        except (OSError, ValueError):
            continue  # a pid file half written: the others still decide
    return found


def stale(run_dir: str, now: float | None = None, min_age_s: float = MIN_AGE_S) -> bool:
    """True when `run_dir` is a run folder no live process can still use (see the module)."""
    try:
        st = os.stat(run_dir)
    except OSError:
        return False
    if getattr(os, "getuid", None) and st.st_uid != os.getuid():
        return False
    age = (time.time() if now is None else now) - st.st_mtime
    pids = _pids(run_dir)
    if pids is None or age < (min_age_s if OWNER in pids else NO_OWNER_AGE_S):
        return False
    if any(ns is not None and ns != _namespace() for _, ns in pids.values()):
        return False
    return not any(proctree.identify(pid) is not None for pid, _ in pids.values())


def sweep_stale(tmp: str | None = None, min_age_s: float = MIN_AGE_S) -> list[str]:
    """Remove the stale run folders in `tmp` (default: the temp dir); returns their paths.
    Never raises: a folder that cannot be judged or removed is left as it is."""
    removed = []
    now = time.time()
    for path in glob.glob(os.path.join(tmp or tempfile.gettempdir(), PREFIX + "*")):
        try:
            if os.path.isdir(path) and not os.path.islink(path) and stale(path, now, min_age_s):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        except OSError:
            continue
    return removed
