"""Stop a subprocess and every process it started, even those that left its session.

    python -m pytest tests/unit/test_grading.py -k times_out

torchrun starts its workers in sessions of their own, so killing a process group is not enough
(research/cpu-calibration.md): note the descendants first, ask politely (SIGINT or SIGTERM),
wait a little, then SIGKILL whatever of the noted processes is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children first), found through the parent links."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except ImportError:
        pass
    except Exception:  # psutil.NoSuchProcess and friends: nothing left to find
        return []
    try:
        out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "ppid="], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    found, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(), []):
            found.append(kid)
            todo.append(kid)
    return found


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(proc: subprocess.Popen, *, interrupt_first: bool = False,
              grace: float = 3.0) -> list[int]:
    """Stop `proc` (started with start_new_session=True) and all its descendants.

    interrupt_first: send SIGINT to `proc` first and wait up to `grace` seconds, so that a
    Python child (pytest) prints where it was. Returns the pids that needed SIGKILL.
    """
    noted = set(descendants(proc.pid)) if proc.poll() is None else set()
    if interrupt_first and proc.poll() is None:
        _signal([proc.pid], signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        noted |= set(descendants(proc.pid))
    _killpg(proc.pid, signal.SIGTERM)
    _signal(noted, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None
                                           or any(_alive(p) for p in noted)):
        time.sleep(0.05)
    killed = [p for p in noted if _alive(p)] + ([proc.pid] if proc.poll() is None else [])
    _killpg(proc.pid, signal.SIGKILL)
    _signal(killed, signal.SIGKILL)
    proc.wait()
    return killed
