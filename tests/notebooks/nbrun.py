"""Execute one notebook in a fresh kernel and say how it went (used by test_notebooks.py).

    python tests/notebooks/nbrun.py notebooks/00_token_explosion.ipynb out.ipynb

Prints one JSON object: {"ok", "seconds", "cells", "error": {"cell", "ename", "evalue",
"source", "traceback"} or null, "notices": [...]}. The executed notebook (outputs included) is
written to the second path for inspection. The kernel inherits this process's environment
(CPCOURSE_IMPL, CPCOURSE_STRICT_CHECKS), and starts in the notebook's folder, as in JupyterLab.
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


class PollingClient(NotebookClient):
    """NotebookClient that waits for a cell's reply in short polls.

    nbclient 0.11 waits on the shell channel in one call as long as the cell timeout; after a
    cell that displays ipywidgets that wait sometimes never sees the reply that did arrive, and a
    run stalls for exactly the timeout (nbclient issue #312). Polling in 0.5 s slices, as the
    fix proposed upstream does, lets the event loop move and the reply be seen.
    """

    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg,
                                    task_poll_kernel_alive):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=0.5))
            except Empty:
                if deadline is None or time.monotonic() < deadline:
                    continue
                task_poll_kernel_alive.cancel()
                await self._async_check_alive()
                msg = await self._async_handle_timeout(timeout, cell)
                if msg is None:  # interrupted without an error: wait on for the reply
                    deadline = None
                    continue
                msg["parent_header"] = {"msg_id": msg_id}
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            try:
                await asyncio.wait_for(task_poll_output_msg, self.iopub_timeout)
            except (asyncio.TimeoutError, Empty):
                self.log.warning("Timeout waiting for IOPub output")
            task_poll_kernel_alive.cancel()
            return msg


def main(src: str, dest: str, cell_timeout: float = 120.0) -> dict:
    start, error = time.monotonic(), None
    for attempt in (1, 2):
        nb = nbformat.read(src, as_version=4)
        client = PollingClient(nb, timeout=cell_timeout, kernel_name="python3",
                               startup_timeout=90,
                               resources={"metadata": {"path": str(Path(src).parent)}})
        try:
            client.execute()
        except CellExecutionError:
            pass
        except Exception as exc:  # a kernel that died or timed out: report, do not hide
            # A kernel that dies or stays silent before its first reply ran no cell: two
            # kernels started at the same moment (both modes run in parallel) can race for the
            # same ports (CI once saw a kernel silent for the whole startup_timeout). One fresh
            # start; a kernel that cannot start twice is reported.
            started = any(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
            if attempt == 1 and not started and (
                    "before replying to kernel_info" in str(exc)
                    or "Kernel didn't respond" in str(exc)):
                continue
            error = {"cell": None, "ename": type(exc).__name__, "evalue": str(exc)[:2000],
                     "source": "", "traceback": ""}
        break
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
            "checks": re.findall(r"data-cpcourse-check='([^']+)'", text),
            "not_implemented_notices": text.count("not implemented yet")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
