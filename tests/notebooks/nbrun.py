"""Execute one notebook in a fresh kernel and say how it went (used by test_notebooks.py).

    python tests/notebooks/nbrun.py notebooks/00_token_explosion.ipynb out.ipynb

Prints one JSON object: {"ok", "seconds", "cells", "error": {"cell", "ename", "evalue",
"source", "traceback"} or null, "max_reply_lag_s", "checks", "not_implemented_notices"}. A cell
whose execute_reply is not read within STALL_S of the kernel going idle is an error
(ReplyStall, with the cell and the delay), not a wait for the cell timeout. The executed
notebook (outputs included) is written to the second path for inspection. The kernel inherits
this process's environment (CPCOURSE_IMPL, CPCOURSE_STRICT_CHECKS), and starts in the
notebook's folder, as in JupyterLab.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from queue import Empty

import nbformat
import zmq
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbclient.util import ensure_async

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _texts(cell) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        for kind in ("text/html", "text/plain"):
            if kind in o.get("data", {}):
                out.append(o["data"][kind])
    return out


# The kernel sends a cell's execute_reply just before it reports idle on IOPub: a reply read
# later than this after the idle is a stall.
STALL_S = 5.0


class ReplyStall(Exception):
    """A cell's execute_reply did not reach the client within STALL_S of the kernel's idle."""

    def __init__(self, cell: int, waited: float, queued: bool):
        self.cell, self.waited, self.queued = cell, waited, queued
        where = ("it was already queued in the client's shell socket, unread: a missed wake-up"
                 if queued else "the kernel had not sent it")
        super().__init__(f"cell {cell}: no execute_reply {waited:.1f} s after the kernel went "
                         f"idle ({where})")


def _rearm_after_send(channel) -> None:
    """Make a send on `channel` re-check its socket for a reply that the send swallowed.

    jupyter_client's Session.send writes through a plain zmq shadow of the channel's asyncio
    socket; libzmq runs the socket's pending commands on every send, so the "reply readable"
    signal of an execute_reply that has just arrived is consumed there and the event loop's
    reader never fires: the client's wait sees the reply only when its timeout ends (nbclient
    issue #312). nbclient's Output-widget mimic sends comm_msg updates on the shell channel
    while the cell's reply is awaited, so every `interact` cell can hit it. Reading EVENTS
    through the asyncio socket afterwards re-arms it, as pyzmq's own sends do.
    """
    send = channel.send

    def send_and_rearm(msg):
        send(msg)
        channel.socket.get(zmq.EVENTS)

    channel.send = send_and_rearm


class RunnerClient(NotebookClient):
    """NotebookClient whose shell sends cannot strand a reply, and which fails on a stall.

    A cell whose reply is still missing STALL_S after the kernel reported idle for it raises
    ReplyStall (cell, delay) instead of waiting out the cell timeout, so a stall is a test
    failure with the cell named, never a slow run that passes.
    """

    max_reply_lag = 0.0  # seconds from the kernel's idle to the reply, worst cell

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        _rearm_after_send(kc.shell_channel)
        return kc

    async def _next_reply(self, msg_id: str) -> dict:
        while True:
            msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=None))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg,
                                    task_poll_kernel_alive):
        reply = asyncio.ensure_future(self._next_reply(msg_id))
        try:
            msg = await self._reply_or_stall(reply, cell, timeout, task_poll_output_msg)
        finally:
            reply.cancel()
            task_poll_kernel_alive.cancel()
        try:
            await asyncio.wait_for(task_poll_output_msg, self.iopub_timeout)
        except (asyncio.TimeoutError, Empty):
            self.log.warning("Timeout waiting for IOPub output")
        return msg

    async def _reply_or_stall(self, reply, cell, timeout, outputs) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())
        await asyncio.wait({reply, outputs}, timeout=left(), return_when=asyncio.FIRST_COMPLETED)
        if not reply.done() and outputs.done():
            outputs.result()  # an error while reading outputs is the cell's error
            idle = time.monotonic()
            await asyncio.wait({reply}, timeout=STALL_S)
            if not reply.done():
                raw = zmq.Socket.shadow(self.kc.shell_channel.socket.underlying)
                index = next(i for i, c in enumerate(self.nb.cells) if c is cell)
                raise ReplyStall(index, time.monotonic() - idle,
                                 bool(raw.get(zmq.EVENTS) & zmq.POLLIN))
            self.max_reply_lag = max(self.max_reply_lag, time.monotonic() - idle)
        if reply.done():
            return reply.result()
        await asyncio.wait({reply}, timeout=left())
        if reply.done():
            return reply.result()
        await self._async_check_alive()
        await self._async_handle_timeout(timeout, cell)  # raises: interrupt_on_timeout is off
        raise RuntimeError("unreachable: interrupt_on_timeout is not supported here")


def _never_started(nb, exc: Exception) -> bool:
    """A kernel that died or stayed silent before its first reply: it ran no cell."""
    ran = any(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    return not ran and ("before replying to kernel_info" in str(exc)
                        or "Kernel didn't respond" in str(exc))


def _run_client(src: str, cell_timeout: float):
    """One execution; returns the notebook, the client and the error that stopped it, if any."""
    nb = nbformat.read(src, as_version=4)
    client = RunnerClient(nb, timeout=cell_timeout, kernel_name="python3", startup_timeout=90,
                          resources={"metadata": {"path": str(Path(src).parent)}})
    try:
        client.execute()
    except CellExecutionError:
        pass  # the cell's error output says what happened
    except ReplyStall as exc:
        return nb, client, {"cell": exc.cell, "ename": "ReplyStall", "evalue": str(exc),
                            "source": nb.cells[exc.cell].source, "traceback": ""}
    except Exception as exc:  # a kernel that died or timed out: report, do not hide
        return nb, client, exc
    return nb, client, None


def main(src: str, dest: str, cell_timeout: float = 120.0) -> dict:
    start = time.monotonic()
    nb, client, error = _run_client(src, cell_timeout)
    # Two kernels started at the same moment (both modes run in parallel) can race for the same
    # ports (CI once saw a kernel silent for the whole startup_timeout): a kernel that never
    # started gets one fresh start. Nothing else is retried: a stall is reported (ReplyStall).
    if isinstance(error, Exception) and _never_started(nb, error):
        nb, client, error = _run_client(src, cell_timeout)
    if isinstance(error, Exception):
        error = {"cell": None, "ename": type(error).__name__, "evalue": str(error)[:2000],
                 "source": "", "traceback": ""}
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error" and error is None:
                error = {"cell": i, "ename": o["ename"], "evalue": o["evalue"],
                         "source": cell.source,
                         "traceback": ANSI.sub("", "\n".join(o.get("traceback", [])))[-4000:]}
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    text = "\n".join(t for c in nb.cells for t in _texts(c))
    return {"ok": error is None, "seconds": round(time.monotonic() - start, 2),
            "cells": len(nb.cells), "error": error,
            "max_reply_lag_s": round(client.max_reply_lag, 3),
            "checks": re.findall(r"data-cpcourse-check='([^']+)'", text),
            "not_implemented_notices": text.count("not implemented yet")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
