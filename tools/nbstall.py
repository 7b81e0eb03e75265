"""Execute notebooks again and again in fresh kernels and count execute-reply stalls.

    python tools/nbstall.py notebooks/02_online_softmax.ipynb notebooks/03_ring_simulated.ipynb \
        --runs 25 --client runner --load 1 --log artifacts/nbstall.jsonl
    python tools/nbstall.py --tiny --runs 20 --client stock --timeout 8 --load 1

A stall: a cell whose execute_reply reaches the client more than --stall-s seconds after the
kernel said "idle" for it on IOPub (the kernel sends the reply before that status). Each run
starts a fresh kernel, as the notebook tests do. --client picks who reads the replies: "stock"
(nbclient's NotebookClient as released), "nomimic" (stock without its Output-widget mimic),
"runner" (tests/notebooks/nbrun.py's client, the one the tests use; --runner-file another).
--load N keeps N busy-looping processes beside the runs, since a busy core is what makes the
stall likely. Every cell's timestamps (sent, each IOPub message, idle, reply) go to --log as
one JSON line per run; a stalled cell also records the state of the client's shell socket
while the client still waited (`_shell_socket_state`).

What it showed (nbclient 0.11.0, ipykernel 7.4.0, pyzmq 27.3.0, 2 cores, --load 1): every stall
is on an `interact` cell, with the reply queued in the shell socket, its fd watched but not
readable and a poll waiting: the wake-up was consumed by nbclient's Output-widget mimic
sending comm_msg on the same socket (see tests/notebooks/nbrun.py, `_rearm_after_send`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import select
import selectors
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import zmq
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def _runner_client(path: Path):
    spec = importlib.util.spec_from_file_location("nbrun", path)
    nbrun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbrun)
    # An older runner (git show main:tests/notebooks/nbrun.py) named its client PollingClient.
    return getattr(nbrun, "RunnerClient", None) or nbrun.PollingClient


class NoMimicClient(NotebookClient):
    """The stock client without its Output-widget mimic, which is what writes on the shell
    channel while a reply is awaited."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        # Not a trait: NotebookClient.__init__ sets it unconditionally, a keyword is ignored.
        self.widget_registry = {}


def _traced(base: type, stall_s: float) -> type:
    """`base` with a timeline of every cell: what the kernel sent on IOPub and when."""

    class Traced(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.t0, self.cells_log, self._cur = time.monotonic(), [], None

        def _now(self) -> float:
            return round(time.monotonic() - self.t0, 3)

        async def async_execute_cell(self, cell, cell_index, *a, **kw):
            if cell.cell_type != "code" or not cell.source.strip():
                return await super().async_execute_cell(cell, cell_index, *a, **kw)
            self._cur = {"cell": cell_index, "sent": self._now(), "iopub": [], "idle": None,
                         "probe": None, "src": cell.source.splitlines()[0][:60]}
            probe = asyncio.ensure_future(self._probe(self._cur))
            try:
                return await super().async_execute_cell(cell, cell_index, *a, **kw)
            finally:
                probe.cancel()
                self._cur["reply"] = self._now()
                idle = self._cur["idle"]
                self._cur["lag"] = None if idle is None else round(self._cur["reply"] - idle, 3)
                self.cells_log.append(self._cur)

        def process_message(self, msg, cell, cell_index):
            kind = msg["msg_type"]
            if kind == "status" and msg["content"].get("execution_state") == "idle":
                self._cur["idle"] = self._now()
            self._cur["iopub"].append((self._now(), kind))
            return super().process_message(msg, cell, cell_index)

        async def _probe(self, rec):
            while rec["idle"] is None or self._now() - rec["idle"] < stall_s:
                await asyncio.sleep(0.1)
            rec["probe"] = {"at": self._now(), **_shell_socket_state(self.kc.shell_channel.socket)}

    return Traced


def _shell_socket_state(sock) -> dict:
    """Why an overdue reply is not being read. Non-destructive looks first: is the socket's fd
    watched by the running loop, is it readable (a wake-up pending), is a poll waiting; last,
    a raw getsockopt(EVENTS) (it runs the socket's pending commands but does not touch pyzmq's
    asyncio state): is the reply queued in the socket (client side) or not (kernel side)."""
    loop = asyncio.get_running_loop()
    try:
        watched = bool(loop._selector.get_key(sock.FD).events & selectors.EVENT_READ)
    except (KeyError, AttributeError):
        watched = False
    return {"fd_watched": watched,
            "fd_readable": bool(select.select([sock.FD], [], [], 0)[0]),
            "polls_waiting": sum(not ev.future.done() for ev in sock._recv_futures),
            "reply_queued": bool(zmq.Socket.shadow(sock.underlying).get(zmq.EVENTS)
                                 & zmq.POLLIN)}


def _busy(stop):
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def _tiny_notebook() -> Path:
    """The smallest notebook that stalls: an interact() whose Output widget gets outputs."""
    cells = [nbformat.v4.new_code_cell("import ipywidgets as widgets\n"
                                       "from IPython.display import display"),
             nbformat.v4.new_code_cell("def show(n=3):\n    display(n * 2)\n    print(n)\n\n"
                                       "widgets.interact(show, n=widgets.IntSlider(3, 0, 9));")]
    path = Path(tempfile.mkdtemp(prefix="nbstall-")) / "tiny_widget.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def run_once(nb_path: Path, client_cls, timeout: float, env: dict, drop_checks: bool) -> dict:
    os.environ.update(env)
    nb = nbformat.read(nb_path, as_version=4)
    if drop_checks:  # the graded checks are most of a run's time and make no widget
        nb.cells = [c for c in nb.cells if not c.source.lstrip().startswith("cpcourse.check(")]
    client = client_cls(nb, timeout=timeout, kernel_name="python3", startup_timeout=90,
                        resources={"metadata": {"path": str(nb_path.parent)}})
    error = None
    try:
        client.execute()
    except Exception as exc:  # a stalled cell under the stock client ends in a timeout error
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return {"notebook": nb_path.name, "seconds": round(time.monotonic() - client.t0, 2),
            "error": error, "cells": client.cells_log}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--tiny", action="store_true",
                    help="also a two-cell notebook with one interact(): a 3 s reproducer")
    ap.add_argument("--runs", type=int, default=10, help="fresh executions of each notebook")
    ap.add_argument("--client", choices=("stock", "nomimic", "runner"), default="runner")
    ap.add_argument("--runner-file", type=Path, default=ROOT / "tests/notebooks/nbrun.py",
                    help="the runner whose client --client runner uses")
    ap.add_argument("--drop-checks", action="store_true", help="skip cpcourse.check() cells")
    ap.add_argument("--timeout", type=float, default=30.0, help="per-cell timeout (s)")
    ap.add_argument("--stall-s", type=float, default=2.0)
    ap.add_argument("--load", type=int, default=0, help="busy-looping processes beside the runs")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting runs after this")
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.tiny:
        args.notebooks.append(_tiny_notebook())
    if not args.notebooks:
        ap.error("no notebook: name some, or --tiny")
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        ap.error(f"no such notebook: {', '.join(missing)}")
    if args.log and (args.log.is_dir() or not args.log.parent.is_dir()
                     or (args.log.exists() and not args.log.is_file())):
        ap.error(f"--log {args.log}: give a file (appended to) in a folder that exists")
    base = {"stock": NotebookClient, "nomimic": NoMimicClient}.get(args.client) or \
        _runner_client(args.runner_file)
    cls = _traced(base, args.stall_s)
    env = {"CPCOURSE_ROOT": str(ROOT), "OMP_NUM_THREADS": "1", "CPCOURSE_IMPL": "solutions",
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True)
            for _ in range(args.load)]
    for h in hogs:
        h.start()
    start, runs, stalls, lags = time.monotonic(), 0, [], []
    log = args.log.open("a") if args.log else None
    try:
        for i in range(args.runs):
            for nb in args.notebooks:
                if time.monotonic() - start > args.budget_s:
                    break
                res = run_once(nb, cls, args.timeout, env, args.drop_checks)
                runs += 1
                lags += [c["lag"] for c in res["cells"] if c["lag"] is not None]
                bad = [c for c in res["cells"] if c["lag"] is not None and c["lag"] > args.stall_s]
                stalls += [(res["notebook"], c) for c in bad]
                flag = " STALL " + ", ".join(f"cell {c['cell']} +{c['lag']:.1f}s "
                                               f"queued={c['probe'] and c['probe']['reply_queued']}"
                                               for c in bad) if bad else ""
                print(f"[{i}] {res['notebook']} {res['seconds']:.1f}s "
                      f"{res['error'] or ''}{flag}", flush=True)
                if log:
                    log.write(json.dumps({"client": args.client, "load": args.load,
                                          **res}) + "\n")
                    log.flush()
    finally:
        stop.set()
        for h in hogs:
            h.join(timeout=5)
            h.terminate()
    # A client that re-polls in slices turns a stall into a lag of up to one slice: count those.
    late = sum(lag > 0.25 for lag in lags)
    print(f"client={args.client} load={args.load}: {runs} runs, {len(stalls)} stalled cells, "
          f"{late} of {len(lags)} replies read > 0.25 s after idle (max "
          f"{max(lags, default=0):.2f} s), {time.monotonic() - start:.0f} s")
    return 1 if stalls else 0


if __name__ == "__main__":
    sys.exit(main())
