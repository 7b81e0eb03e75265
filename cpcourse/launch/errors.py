"""What went wrong in a launch, and where each rank was: the errors `cpcourse.launch` raises.

    python -m pytest tests/unit/test_launch_parts.py -q

- `RankError`: a rank raised; carries its rank, exception type, message and traceback text. When
  several ranks fail, the first real failure is reported, not the "connection closed by peer"
  echoes it causes in the others.
- `LaunchTimeout`: the run passed its time limit; for each unfinished rank, the call it was stuck
  in, read from the stack every worker dumps on SIGUSR1 (faulthandler) and from the heartbeat
  that `cpcourse.support.groups.tracked` writes ("recv (src=0, ring_step=2) for 5.0 s").
Everything here reads the files the workers leave in the launch's run directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

from cpcourse.launch import proctree

_PEER_FAILURE = re.compile(r"Connection closed by peer|Connection reset|Broken pipe|"
                           r"Socket Timeout|Timed out waiting|NCCL communicator was aborted")


class LaunchError(RuntimeError):
    """A launch that did not return results; `str()` says why."""

    def _render_traceback_(self):  # IPython shows this instead of our own stack frames
        return [f"{type(self).__name__}: {self}"]

    def summary(self) -> str:
        """One line for a command line: what happened and where (the full text is `str()`)."""
        return str(self).splitlines()[0]


class RankError(LaunchError):
    """A rank raised. `rank`, `exc_type`, `message`, `traceback` (text) describe the first one."""

    def __init__(self, record: dict, others: list[int], finished: list[int]):
        self.rank, self.exc_type = record["rank"], record["type"]
        self.message, self.traceback = record["message"], record["traceback"]
        self.op, self.others, self.raised_at = record.get("op"), others, record["time"]
        notes = [f"while in {self.op}"] if self.op else []
        if others:
            notes.append(f"also failed: rank {', '.join(map(str, others))}")
        if finished and _PEER_FAILURE.search(self.traceback):
            notes.append(f"rank {', '.join(map(str, finished))} had already returned: a send, "
                         "recv or collective with no partner on that rank?")
        head = (self.message if self.exc_type == "a crash"
                else f"rank {self.rank} raised {self.exc_type}: {self.message}")
        super().__init__("\n".join([head + "".join(f"\n  ({n})" for n in notes),
                                    f"--- traceback from rank {self.rank} ---",
                                    self.traceback.rstrip()]))

    @property
    def peer_failure(self) -> bool:
        """True when this is only the echo of another rank's death ("connection reset")."""
        return bool(_PEER_FAILURE.search(self.traceback) or _PEER_FAILURE.search(self.message))

    def summary(self) -> str:
        first = (self.message.strip().splitlines() or [""])[0]
        if self.exc_type == "InputError":  # the rank checked an input: its words are the message
            return f"{first} (on rank {self.rank})"
        if self.exc_type == "a crash":
            return first
        where = f" in {self.op}" if self.op else ""
        return f"rank {self.rank} raised {self.exc_type}{where}: {first}"

    def renamed(self, old: str, new: str) -> RankError:
        """The same error with file name `old` shown as `new` (a %%torchrun cell's temp file)."""
        self.traceback = self.traceback.replace(old, new)
        self.args = (self.args[0].replace(old, new),)
        return self


class LaunchTimeout(LaunchError):
    """The run passed its time limit. `stuck` maps each unfinished rank to where it was."""

    def __init__(self, seconds: float, stuck: dict[int, str], finished: list[int],
                 starting: bool = False):
        self.seconds, self.stuck, self.finished = seconds, stuck, finished
        self.rank = min(stuck) if stuck else None
        lines = [f"start-up took longer than {seconds:g} s (raise start_timeout=):" if starting
                 else f"timed out after {seconds:g} s (a deadlock? else raise `timeout`):"]
        lines += [f"  rank {r}: {what}" for r, what in sorted(stuck.items())]
        if finished:
            lines.append(f"  finished: rank {', '.join(map(str, finished))}")
        super().__init__("\n".join(lines))

    def summary(self) -> str:
        head, *stuck = str(self).splitlines()
        return head.rstrip(":") + (": " + "; ".join(s.strip() for s in stuck) if stuck else "")


def stack_frames(path: str) -> list[tuple[str, int, str]]:
    """(file, line, function) innermost first, from the faulthandler dump of the worker."""
    try:
        text = open(path).read()  # noqa: SIM115
    except OSError:
        return []
    threads = text.split("\n\n")
    main = next((t for t in reversed(threads) if "launch/entry.py" in t),
                threads[-1] if threads else "")
    return [(f, int(n), fn) for f, n, fn in re.findall(r'File "(.+?)", line (\d+) in (\S+)', main)]


def where_stuck(frames: list[tuple[str, int, str]]) -> str:
    """'in torch.distributed recv() called at cell.py:5: dist.recv(t, src=1)' from a dump."""
    import linecache

    if not frames:
        return "no Python stack (blocked before Python started, or exited)"
    lib = os.path.dirname(os.path.dirname(os.__file__))
    user = next(((f, n) for f, n, _ in frames
                 if "site-packages" not in f and not f.startswith((lib, "<"))
                 and not f.endswith(("launch/entry.py", "cpcourse/support/groups.py"))), None)
    f0, _, fn0 = frames[0]
    what = f"torch.distributed {fn0}()" if "torch/distributed" in f0 else f"{fn0}()"
    if user is None:
        return f"in {what}"
    source = linecache.getline(user[0], user[1]).strip()
    return f"in {what} called at {os.path.basename(user[0])}:{user[1]}: {source}"


def stuck_report(run_dir: str, nproc: int) -> tuple[dict[int, str], list[int]]:
    """Ask every unfinished rank for its stack (SIGUSR1) and read its heartbeat."""
    pending, finished = {}, []
    for r in range(nproc):
        if os.path.exists(os.path.join(run_dir, f"rank{r}.pkl")):
            finished.append(r)
            continue
        try:
            pid = int(open(os.path.join(run_dir, f"rank{r}.pid")).read())  # noqa: SIM115
        except (OSError, ValueError):
            pending[r] = None
            continue
        pending[r] = proctree.identify(pid)
        if pending[r] is not None:
            proctree.signal_proc(pending[r], signal.SIGUSR1)
    time.sleep(0.3)
    stuck = {}
    for r, proc in pending.items():
        if proc is None or not os.path.exists(os.path.join(run_dir, f"rank{r}.started")):
            stuck[r] = "still starting up (importing torch, or the rendezvous)"
            continue
        frames = stack_frames(os.path.join(run_dir, f"rank{r}.stack"))
        # A live rank that wrote no stack did not take the signal: stopped (SIGSTOP, a debugger)
        text = (where_stuck(frames) if frames or not proctree.alive(proc)
                else "did not answer the stack request (stopped?)")
        beat = _read_json(os.path.join(run_dir, f"rank{r}.op"))
        if beat and beat.get("op"):
            text = f"stuck in {beat['op']} for {time.time() - beat['since']:.1f} s; {text}"
        stuck[r] = text
    return stuck, finished


def rank_procs(run_dir: str, nproc: int) -> list:
    """(pid, start time) of each worker that recorded its pid and is still alive."""
    return rank_procs_of(run_dir, range(nproc))


def rank_procs_of(run_dir: str, ranks) -> list:
    """(pid, start time) of the workers `ranks` that recorded their pid and are still alive."""
    procs = []
    for r in ranks:
        try:
            with open(os.path.join(run_dir, f"rank{r}.pid")) as fh:
                proc = proctree.identify(int(fh.read()))
        except (OSError, ValueError):
            continue
        if proc is not None:
            procs.append(proc)
    return procs


def _read_json(path: str):
    try:
        with open(path) as fh:
            return json.loads(fh.read() or "null")
    except (OSError, ValueError):
        return None


def exit_codes(torchrun_log: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure summary ("rank : 1 ... exitcode : -11")."""
    # Line-anchored, rank then exitcode on the next line: a looser pattern paired an earlier
    # "rank : 0" in the log with rank 1's exit code.
    pairs = re.findall(r"^\s*rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)",
                       torchrun_log, flags=re.M)
    return {int(r): int(c) for r, c in pairs}


def _exit_files(run_dir: str, nproc: int) -> dict[int, int]:
    """rank -> exit code from the `rank{k}.exit` files a fork-server launch writes."""
    codes = {}
    for r in range(nproc):
        try:
            with open(os.path.join(run_dir, f"rank{r}.exit")) as fh:
                codes[r] = int(fh.read().strip())
        except (OSError, ValueError):
            continue
    return codes


def _how(code: int | None, stack_text: str) -> str:
    fatal = re.search(r"Fatal Python error: ([^\n]+)", stack_text)
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}" + (f" ({fatal.group(1).strip()})" if fatal else "")
    if fatal:
        return f"crashed: {fatal.group(1).strip()}"
    if code is not None:
        return f"exited with code {code} without raising (os._exit or sys.exit in native code?)"
    return "ended without raising or returning (os._exit, or killed by a signal)"


def rank_death(run_dir: str, nproc: int, torchrun_log: str = "") -> RankError | None:
    """The first rank that died without a Python exception (a segfault, a signal, os._exit):
    it started, left no result and no error, and is gone. Its peers then fail with "connection
    reset", which must not be what the user is told."""
    dead = []
    for r in range(nproc):
        has = {ext: os.path.exists(os.path.join(run_dir, f"rank{r}.{ext}"))
               for ext in ("pid", "err", "pkl")}
        if has["pid"] and not has["err"] and not has["pkl"] and not rank_procs_of(run_dir, [r]):
            dead.append(r)
    if not dead:
        return None
    codes = {**exit_codes(torchrun_log), **_exit_files(run_dir, nproc)}
    # torchrun ends the survivors of a failure with SIGTERM: those deaths are echoes
    r = min(dead, key=lambda x: (codes.get(x) is None, codes.get(x) == -signal.SIGTERM, x))
    try:
        with open(os.path.join(run_dir, f"rank{r}.stack")) as fh:
            stack_text = fh.read()
    except OSError:
        stack_text = ""
    finished = [x for x in range(nproc) if os.path.exists(os.path.join(run_dir, f"rank{x}.pkl"))]
    record = {"rank": r, "type": "a crash", "message": f"rank {r} {_how(codes.get(r), stack_text)}",
              "traceback": stack_text.strip() or "(no Python traceback: the process died in "
              "native code or was killed)", "time": time.time()}
    return RankError(record, [x for x in dead if x != r], finished)


def rank_error(run_dir: str, nproc: int) -> RankError | None:
    records = [rec for r in range(nproc)
               if (rec := _read_json(os.path.join(run_dir, f"rank{r}.err")))]
    if not records:
        return None
    primary = [rec for rec in records if not _PEER_FAILURE.search(rec["traceback"])] or records
    first = min(primary, key=lambda rec: (rec["time"], rec["rank"]))
    others = sorted(rec["rank"] for rec in records if rec is not first)
    finished = [r for r in range(nproc) if os.path.exists(os.path.join(run_dir, f"rank{r}.pkl"))]
    return RankError(first, others, finished)
