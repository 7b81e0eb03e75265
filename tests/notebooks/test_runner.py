"""The notebook runner (nbrun.py): a swallowed reply cannot stall it, and a late one fails it.

    python -m pytest tests/notebooks/test_runner.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import select
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import zmq
import zmq.asyncio
from jupyter_client.session import Session

RUNNER = Path(__file__).with_name("nbrun.py")


@pytest.fixture
def nbrun():
    spec = importlib.util.spec_from_file_location("nbrun", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _reply_seen_after_a_client_send(rearm) -> bool:
    """A client awaits a reply on an asyncio DEALER; the reply lands while the event loop is
    busy, then the client sends on the same socket through Session.send, as nbclient's
    Output-widget mimic does. Returns whether the waiting poll saw the reply within 1 s."""
    router = zmq.Context.instance().socket(zmq.ROUTER)
    dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    try:
        dealer.connect(f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}")
        await dealer.send(b"hello")
        ident = router.recv_multipart()[0]
        session = Session(key=b"")
        channel = SimpleNamespace(socket=dealer, send=lambda msg: session.send(dealer, msg))
        rearm(channel)
        waiting = asyncio.ensure_future(dealer.poll(timeout=10_000))
        await asyncio.sleep(0.05)
        router.send_multipart([ident, b"reply"])
        # Without yielding to the loop, until libzmq has signalled the reply on the socket's fd.
        deadline = time.monotonic() + 5
        while not select.select([dealer.FD], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "the reply never reached the client socket"
        channel.send(session.msg("comm_msg", content={}))
        done, _ = await asyncio.wait({waiting}, timeout=1.0)
        waiting.cancel()
        return bool(done)
    finally:
        dealer.close(linger=0)
        router.close(linger=0)


def test_a_send_on_the_shell_socket_does_not_hide_a_reply(nbrun):
    # The mechanism of the stall: unpatched, the send swallows the reply's wake-up.
    assert not asyncio.run(_reply_seen_after_a_client_send(lambda channel: None))
    assert asyncio.run(_reply_seen_after_a_client_send(nbrun._rearm_after_send))


def test_a_late_reply_fails_the_run_with_the_cell_and_the_delay(nbrun, monkeypatch, tmp_path):
    """A reply held back past STALL_S after the kernel's idle is a ReplyStall naming the cell,
    reported at once (not after the cell timeout) and not retried; one held back less passes
    and is measured."""
    monkeypatch.setattr(nbrun, "STALL_S", 1.0)
    delays = {"slow = 1": 0.3, "late = 2": 4.0}
    starts = []

    class SlowReplies(nbrun.RunnerClient):
        async def async_start_new_kernel_client(self):
            starts.append(1)
            return await super().async_start_new_kernel_client()

        async def _async_poll_for_reply(self, msg_id, cell, *args):
            self.delay = delays.get(cell.source, 0.0)
            return await super()._async_poll_for_reply(msg_id, cell, *args)

        async def _next_reply(self, msg_id):
            msg = await super()._next_reply(msg_id)
            await asyncio.sleep(self.delay)
            return msg

    monkeypatch.setattr(nbrun, "RunnerClient", SlowReplies)
    src = tmp_path / "late.ipynb"
    cells = [nbformat.v4.new_code_cell(s) for s in ("slow = 1", "late = 2", "after = 3")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), src)
    start = time.monotonic()
    result = nbrun.main(str(src), str(tmp_path / "out.ipynb"), cell_timeout=60)
    assert time.monotonic() - start < 40, "the stall was waited out, not reported"
    assert not result["ok"] and len(starts) == 1, result
    err = result["error"]
    assert (err["cell"], err["ename"], err["source"]) == (1, "ReplyStall", "late = 2"), err
    assert "cell 1: no execute_reply 1." in err["evalue"], err
    assert 0.15 <= result["max_reply_lag_s"] < 1.0, result  # the 0.3 s one, measured
