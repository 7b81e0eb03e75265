"""cpcourse.launch and %%torchrun on real processes: results, errors, deadlocks, no orphans.

    python -m pytest tests/dist/test_launch.py -q

Every launch carries a unique marker in its environment; after each one the test scans /proc for
it, so "no processes left" is checked, not assumed. Functions below run inside the ranks.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from cpcourse.launch import LaunchTimeout, RankError, launch
from cpcourse.launch.proctree import marked

pytestmark = [pytest.mark.dist,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="scans /proc")]


# --- what the ranks run ---------------------------------------------------------------------------

def rank_view(tag):
    import torch
    import torch.distributed as dist

    print(f"hello from {dist.get_rank()}")
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
            "threads": torch.get_num_threads(), "tag": tag, "backend": dist.get_backend()}


def one_rank_raises():
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("rank 1 refuses")
    dist.all_reduce(torch.ones(1))  # the others wait for rank 1 in a collective
    return "unreachable"


def both_receive():
    """Each rank waits for a message nobody sends: rank 0 in a bare recv, rank 1 in a tracked
    one."""
    import torch
    import torch.distributed as dist

    from cpcourse.support.groups import tracked

    buf = torch.zeros(4)
    if dist.get_rank() == 0:
        dist.recv(buf, src=1)
    else:
        with tracked("recv", src=0, ring_step=2):
            dist.recv(buf, src=0)


def sleep_forever():
    import time

    print("started", flush=True)
    time.sleep(600)


# --- helpers --------------------------------------------------------------------------------------

@pytest.fixture
def mark():
    """A unique marker for this test's launches; asserts none of their processes outlived it."""
    tag = f"cpcourse-test-{uuid.uuid4().hex}"
    yield tag
    deadline = time.monotonic() + 5
    while marked(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not marked(tag), f"processes left behind: {marked(tag)}"


def _env(mark):
    return {"CPCOURSE_TEST_MARK": mark}


# --- tests ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("nproc", [1, 4])
def test_each_rank_returns_its_value(nproc, mark, capsys):
    results = launch(f"{__file__}:rank_view", nproc, timeout=120, env=_env(mark), args=("x",))
    assert [r["rank"] for r in results] == list(range(nproc))
    assert all(r["world"] == nproc and r["tag"] == "x" and r["backend"] == "gloo"
               for r in results)
    assert all(r["threads"] == int(os.environ.get("OMP_NUM_THREADS", "1")) for r in results)
    assert len({r["pid"] for r in results}) == nproc and os.getpid() not in {
        r["pid"] for r in results}
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == [f"[rank {r}] hello from {r}" for r in range(nproc)]
    assert sorted(results.output) == sorted(printed)


def test_a_launch_leaves_nothing_in_the_temp_dir(mark):
    """torchrun used to leave a torchelastic_* folder behind after every launch."""
    import glob
    import tempfile

    def leftovers():
        tmp = tempfile.gettempdir()
        return {p for pat in ("torchelastic_*", "cpcourse-launch-*")
                for p in glob.glob(os.path.join(tmp, pat))}

    from cpcourse.launch.entry import rank_info

    before = leftovers()
    # The function itself, not its "module:function" name: a reader can follow it.
    results = launch(rank_info, 2, timeout=120, env=_env(mark), stream=False)
    assert [r["rank"] for r in results] == [0, 1]
    assert leftovers() - before == set()


def test_a_raising_rank_surfaces_its_traceback(mark):
    with pytest.raises(RankError) as info:
        launch(f"{__file__}:one_rank_raises", 2, timeout=120, env=_env(mark))
    err = info.value
    # A RankError (not a LaunchTimeout) at timeout=120: the launcher did not wait it out.
    assert (err.rank, err.exc_type, err.message) == (1, "ValueError", "rank 1 refuses")
    assert 'raise ValueError("rank 1 refuses")' in err.traceback
    assert "rank 1 raised ValueError: rank 1 refuses" in str(err)


def test_a_deadlock_times_out_naming_rank_and_operation(mark):
    with pytest.raises(LaunchTimeout) as info:
        launch(f"{__file__}:both_receive", 2, timeout=5, pg_timeout=120, env=_env(mark))
    stuck = info.value.stuck
    assert set(stuck) == {0, 1}, str(info.value)
    assert "recv" in stuck[0] and "dist.recv(buf, src=1)" in stuck[0], stuck[0]
    assert "recv (src=0, ring_step=2)" in stuck[1] and "dist.recv(buf, src=0)" in stuck[1]
    assert "rank 0:" in str(info.value) and "timed out after 5 s" in str(info.value)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_killed_launch_leaves_no_process(how, mark, tmp_path):
    # A shell that started this run in the background (`cmd &`) left SIGINT ignored, and an
    # ignored signal stays ignored in every child: give the caller Python's own handler back.
    code = textwrap.dedent(f"""
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from cpcourse.launch import launch
        launch({__file__!r} + ":sleep_forever", 2, timeout=300, env={{"M": {mark!r}}})
    """)
    caller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        lines = [caller.stdout.readline() for _ in range(2)]
        assert all("started" in line for line in lines), lines
        # torchrun and its two workers, and the fork server unless they were started by exec
        # (CPCOURSE_RANK_START, or a temp dir too deep for the server's Unix socket)
        assert len(marked(mark)) in (3, 4), marked(mark)
        assert len(list(tmp_path.glob("cpcourse-launch-*"))) == 1
        caller.send_signal(how)
        code = caller.wait(timeout=30)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    # the `mark` fixture checks that torchrun and both workers are gone; a signal the caller can
    # catch also removes the run folder (SIGKILL cannot be caught: nothing runs after it)
    if how != signal.SIGKILL:
        assert list(tmp_path.glob("cpcourse-launch-*")) == []
    if how == signal.SIGTERM:
        assert code == 128 + signal.SIGTERM


def test_the_magic_runs_a_cell_on_ranks(mark, capsys, monkeypatch):
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell

    import cpcourse

    monkeypatch.setenv("CPCOURSE_TEST_MARK", mark)  # the magic's launches inherit it
    shell = InteractiveShell.instance()
    cpcourse.load_ipython_extension(shell)
    cell = "x = torch.ones(2) * (rank + 1)\ndist.all_reduce(x)\nprint(x.tolist())\nRESULT = rank\n"
    shell.run_cell_magic("torchrun", "-n 2 --timeout 120 --out res", cell)
    assert shell.user_ns["res"] == [0, 1]
    assert sorted(capsys.readouterr().out.splitlines()) == ["[rank 0] [3.0, 3.0]",
                                                            "[rank 1] [3.0, 3.0]"]
    outcome = shell.run_cell("%%torchrun -n 2\nif rank == 1:\n    raise KeyError('lost')\n")
    err = outcome.error_in_exec
    assert isinstance(err, RankError) and err.rank == 1 and err.exc_type == "KeyError"
    assert "<%%torchrun cell>" in err.traceback and "raise KeyError('lost')" in err.traceback
    import torch.distributed

    assert not torch.distributed.is_initialized()  # the kernel itself never joins a group


def crash(how):
    """Rank 1 dies without a Python exception; rank 0 then loses its peer in a barrier."""
    import signal as sig

    import torch.distributed as dist

    if dist.get_rank() == 1:
        if how == "segfault":
            os.kill(os.getpid(), sig.SIGSEGV)
        os._exit(3)
    dist.barrier()
    return dist.get_rank()


# "rank 1 was killed by SIGSEGV (Segmentation fault)": the launcher waits for torchrun's failure
# summary, the only place with the dead rank's exit code or signal.
@pytest.mark.parametrize("how, words", [("segfault", "SIGSEGV (Segmentation fault)"),
                                        ("os._exit", "exited with code 3 without raising")])
def test_a_rank_that_dies_without_raising_is_named(how, words, mark):
    """Not rank 0's "connection reset by peer", which is only the echo of rank 1's death."""
    with pytest.raises(RankError) as info:
        launch(f"{__file__}:crash", 2, timeout=60, env=_env(mark), args=(how,), stream=False)
    summary = info.value.summary()
    assert info.value.rank == 1 and summary.startswith("rank 1 ") and words in summary, (
        str(info.value)[:800])


def long_lines(n, width):
    import torch.distributed as dist

    rank = dist.get_rank()
    for i in range(n):
        print(f"{rank}:{i}:" + str(rank) * width)
    return rank


def test_long_lines_from_two_ranks_arrive_whole(mark):
    """Lines past the pipe's 4 KiB atomic limit, printed by two ranks at once, used to arrive
    interleaved or cut (21 of 40 intact)."""
    n, width = 100, 65_536  # without the lock, 2 to 32 of these 200 lines broke per run here
    results = launch(f"{__file__}:long_lines", 2, timeout=120, env=_env(mark), args=(n, width),
                     stream=False)
    want = {f"[rank {r}] {r}:{i}:" + str(r) * width for r in range(2) for i in range(n)}
    got = [line.rstrip("\n") for line in results.output]
    assert want <= set(got), f"{len(want - set(got))} of {len(want)} lines arrived broken"


def exit_three():
    os._exit(3)


def test_a_rank_that_exits_without_raising_is_named_with_its_code(mark):
    """When torchrun ends on its own, its failure summary gives the dead rank's exit code."""
    with pytest.raises(RankError) as info:
        launch(f"{__file__}:exit_three", 1, timeout=60, env=_env(mark), stream=False)
    assert info.value.rank == 0 and "exited with code 3" in info.value.summary()


# --- interrupts from a notebook and from a service manager (issue 51) ----------------------------

def _wait_for(mark, count, seconds=180.0):
    """Block until at least `count` processes carry `mark` (the ranks have started)."""
    deadline = time.monotonic() + seconds
    while len(marked(mark)) < count:
        assert time.monotonic() < deadline, f"only {marked(mark)} started"
        time.sleep(0.2)


def _reply_to(kc, msg_id: str) -> dict:
    """The shell reply to request `msg_id`: a late kernel_info_reply from the kernel's start
    can come first on the shell channel."""
    deadline = time.monotonic() + 60
    while True:
        msg = kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg["content"]


def test_a_kernel_interrupt_ends_every_rank(mark, tmp_path):
    """launch() in a Jupyter kernel (a notebook cell) and the user presses interrupt: the cell
    ends with KeyboardInterrupt, torchrun and both ranks are gone, the kernel lives on."""
    jupyter_client = pytest.importorskip("jupyter_client")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    km, kc = jupyter_client.manager.start_new_kernel(
        startup_timeout=120, kernel_name="python3",
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": root})
    try:
        cell = kc.execute(f"from cpcourse.launch import launch\n"
                          f"launch({__file__!r} + ':sleep_forever', 2, timeout=300, "
                          f"env={{'M': {mark!r}}})")
        _wait_for(mark, 3)          # torchrun and its two workers (and maybe the fork server)
        time.sleep(1.0)
        km.interrupt_kernel()
        reply = _reply_to(kc, cell)
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        deadline = time.monotonic() + 10
        while marked(mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not marked(mark), f"ranks outlived the interrupt: {marked(mark)}"
        assert list(tmp_path.glob("cpcourse-launch-*")) == []
        after = kc.execute("1 + 1")  # the kernel itself survived the interrupt
        assert _reply_to(kc, after)["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_sigterm_to_a_command_that_started_ranks_ends_them(mark, tmp_path):
    """`kill PID` (SIGTERM, as a service manager or a batch scheduler sends it) to `cpcourse
    generate` while its ranks run: exit 143, no traceback, no rank left, no run folder."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cli = subprocess.Popen(
        [sys.executable, "-m", "cpcourse", "generate", "--causal", "--prompt", "circle-right",
         "--nproc", "2", "--steps", "1000", "--timeout", "600", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "CPCOURSE_TEST_MARK": mark, "TMPDIR": str(tmp_path),
             "PYTHONPATH": root})
    try:
        _wait_for(mark, 4)          # the command, torchrun and its two workers
        time.sleep(1.0)
        cli.send_signal(signal.SIGTERM)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 128 + signal.SIGTERM, (cli.returncode, err)
    assert out == "" and "Traceback" not in err, err
    assert list(tmp_path.glob("cpcourse-launch-*")) == []
