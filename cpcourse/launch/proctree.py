"""Finding and ending every process a launch started, including the ones torchrun detached.

    python -c "from cpcourse.launch.proctree import descendants; import os; print(descendants(1))"

torchrun starts each worker in a session of its own, so killing torchrun or its process group
leaves the workers running (and holding the output pipe open). `end_tree` does what works: note
the whole tree first, SIGTERM the root (torchrun then stops its workers), wait, and SIGKILL
whatever of the noted processes is still alive. A process is identified by (pid, start time) so
that a pid the kernel has reused for an unrelated process is never signalled, and `marked` finds
workers re-parented to init through a unique string in their environment.
Linux reads /proc; elsewhere (macOS) `ps` lists parents and the start-time check is skipped.
`launch` uses `end_tree`; the grader and the notebook tests use `stop_tree`. Both turn SIGTERM
into an exception while their children run (`raise_on_sigterm`), so that they clean up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

Proc = tuple[int, int]  # (pid, start time in clock ticks since boot; 0 where unknown)
_PROC_FS = os.path.isdir("/proc/self")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of `pid` from /proc, or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] == b"Z":  # a zombie is already dead; it only waits to be reaped
        return None
    return int(fields[1]), int(fields[19])


def _table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, start time) for every visible process."""
    if _PROC_FS:
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _stat(int(name))) is not None:
                table[int(name)] = st
        return table
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True,
                         check=False).stdout
    rows = (line.split() for line in out.splitlines() if line.strip())
    return {int(pid): (int(ppid), 0) for pid, ppid in rows}


def identify(pid: int) -> Proc | None:
    """(pid, start time) of a live process, or None."""
    if _PROC_FS:
        st = _stat(pid)
        return None if st is None else (pid, st[1])
    return (pid, 0) if alive((pid, 0)) else None


def descendants(root: int) -> set[Proc]:
    """Every live process below `root` (children, grandchildren, ...), as (pid, start time)."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[Proc] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if (child, table[child][1]) not in found:
                found.add((child, table[child][1]))
                todo.append(child)
    return found


def marked(marker: str) -> set[Proc]:
    """Live processes whose environment holds `marker` (Linux; empty elsewhere)."""
    if not _PROC_FS:
        return set()
    needle, found = marker.encode(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read():
                    continue
        except OSError:
            continue
        if (proc := identify(int(name))) is not None:
            found.add(proc)
    return found


def alive(proc: Proc) -> bool:
    """Is `proc` still running (and still the same process)?"""
    pid, start = proc
    if _PROC_FS:
        st = _stat(pid)
        return st is not None and (start == 0 or st[1] == start)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_proc(proc: Proc, sig: int) -> None:
    """Send `sig` to `proc` if it is still the same process."""
    if alive(proc):
        try:
            os.kill(proc[0], sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_tree(root: subprocess.Popen, noted: set[Proc], marker: str | None = None,
             grace_s: float = 3.0) -> int:
    """SIGTERM `root`, wait up to `grace_s` for it and `noted`, then SIGKILL what is left.

    Returns how many processes needed SIGKILL. `noted` should already hold the workers seen
    while they ran (the root may be gone before its children can be listed).
    """
    procs = set(noted)
    if root.poll() is None:
        procs |= descendants(root.pid)
    if marker:
        procs |= marked(marker)
    if root.poll() is None:
        root.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if root.poll() is not None and not any(alive(p) for p in procs):
            break
        time.sleep(0.05)
    if marker:
        procs |= marked(marker)
    left = [p for p in procs if alive(p)]
    for proc in left:
        signal_proc(proc, signal.SIGKILL)
    if root.poll() is None:
        root.kill()
    try:
        root.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return len(left)


def stop_tree(proc: subprocess.Popen, *, interrupt_first: bool = False,
              grace: float = 3.0) -> int:
    """Stop `proc` and every process below it; returns how many needed SIGKILL.

    interrupt_first: SIGINT `proc` first and wait up to `grace` seconds, so that a Python child
    (pytest) can print where it was before it is ended.
    """
    noted = descendants(proc.pid) if proc.poll() is None else set()
    if interrupt_first and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    return end_tree(proc, noted, grace_s=grace)


class Terminated(SystemExit):
    """SIGTERM reached a process while its children ran: end them and clean up, then exit 143."""


def raise_on_sigterm():
    """Until the returned function is called, SIGTERM (a job scheduler's stop, `kill PID`)
    raises `Terminated`, so that `finally` blocks end the children and remove the temporary
    files; the default action kills the process at once and leaves them behind. Only from the
    main thread, and only over the default disposition (a handler the caller installed is left
    alone). Returns the function that restores the previous handler."""
    if threading.current_thread() is not threading.main_thread() or (
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        return lambda: None

    def handler(signum, frame):
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
