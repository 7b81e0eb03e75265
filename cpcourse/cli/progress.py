"""What a command that starts processes prints while it runs, on stderr (stdout keeps the
report: one JSON object with --json).

    cpcourse vae --arch wan --nproc 3 --compare       # starting 3 ranks: ... / ... 10 s / done

`running(nproc, what)` prints "starting N ranks: what", then a line every 10 s until the run
ends, then how long it took; inside it $CPCOURSE_PROGRESS is 1, which asks a rank function that
counts its denoising steps (`cpcourse.tinydit.sampling.generate_rank`) to print "step k/n" from
rank 0. Inside a rank of your own torchrun nothing is printed: every rank would say it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

ENV = "CPCOURSE_PROGRESS"
EVERY_S = 10.0


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rank_lines(line: str) -> None:
    """launch()'s `stream` under --json: the ranks' lines go to stderr, never to stdout."""
    print(line, end="" if line.endswith("\n") else "\n", file=sys.stderr, flush=True)


@contextlib.contextmanager
def running(nproc: int, what: str, every_s: float = EVERY_S):
    from cpcourse.launch.torchrun import torchrun_rank

    if torchrun_rank() is not None:
        yield
        return
    ranks = f"{nproc} rank{'s' * (nproc != 1)}" if nproc else "the ranks"
    say(f"starting {ranks}: {what}")
    previous, start, stop = os.environ.get(ENV), time.monotonic(), threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            say(f"  ... {time.monotonic() - start:.0f} s")

    thread = threading.Thread(target=beat, name="cpcourse-progress", daemon=True)
    os.environ[ENV] = "1"
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if previous is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = previous
    say(f"{ranks} done in {time.monotonic() - start:.1f} s")
