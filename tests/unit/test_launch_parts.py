"""The launcher's pieces that need no torchrun: input checks, stack reading, error choice, killing.

    python -m pytest tests/unit/test_launch_parts.py -q
"""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from cpcourse import launch as L
from cpcourse.launch import errors as E
from cpcourse.launch.proctree import alive, descendants, end_tree, identify, marked
from cpcourse.support.errors import InputError

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.mark.parametrize("target, nproc, timeout, what", [
    ("no/such/file.py", 2, 10, "no such file"),
    ("no_such_module_without_colon", 2, 10, "no such file"),
    ("cpcourse.launch.entry:rank_info", 0, 10, "nproc must be > 0"),
    ("cpcourse.launch.entry:rank_info", 2, -1, "timeout must be a positive"),
    ("cpcourse.launch.entry:rank_info", 1000, 10, "use 64 or fewer"),
    ("cpcourse.launch.entry:rank_info", 2, 1e308, "timeout must be <="),
    ("no_such_package.mod:fn", 2, 10, "no module 'no_such_package'"),
])
def test_bad_arguments_fail_before_anything_starts(target, nproc, timeout, what):
    with pytest.raises(InputError, match=what):
        L.launch(target, nproc, timeout=timeout)


def test_bad_backend_and_threads_fail_before_anything_starts(monkeypatch):
    with pytest.raises(InputError, match="backend must be 'gloo' or 'nccl'"):
        L.launch("cpcourse.launch.entry:rank_info", 2, backend="mpi")
    for omp in ("four", "0"):  # 0 used to be "threads must be > 0", naming no variable
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
        with pytest.raises(InputError, match=f"OMP_NUM_THREADS='{omp}' is not a positive whole"):
            L.launch("cpcourse.launch.entry:rank_info", 2)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setenv("CPCOURSE_BACKEND", "mpi")
    with pytest.raises(InputError, match="CPCOURSE_BACKEND='mpi' must be 'gloo' or 'nccl'"):
        L.launch("cpcourse.launch.entry:rank_info", 2)


def test_nccl_without_a_gpu_per_rank_fails_before_anything_starts(monkeypatch):
    """It used to fail inside every rank after start-up ("no attribute '_cuda_setDevice'")."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CPCOURSE_BACKEND", "nccl")
    with pytest.raises(InputError, match=r"CPCOURSE_BACKEND='nccl' needs a CUDA GPU per local "
                       r"rank \(2 here\), and this machine has 1"):
        L.launch("cpcourse.launch.entry:rank_info", 2)
    monkeypatch.delenv("CPCOURSE_BACKEND")
    with pytest.raises(InputError, match="backend='nccl' needs a CUDA GPU"):
        L.launch("cpcourse.launch.entry:rank_info", 2, backend="nccl")


def test_magic_options_are_checked():
    with pytest.raises(InputError, match="%%torchrun"):
        L.torchrun_cell("-n four", "print(1)")


DUMP = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f00 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2799 in recv
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "{user}", line 3 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/work/cpcourse/launch/entry.py", line 150 in _run_rank
"""


def test_a_stack_dump_names_the_call_and_the_user_line(tmp_path):
    user = tmp_path / "cell.py"
    user.write_text("import torch\nbuf = torch.zeros(1)\ndist.recv(buf, src=1)\n")
    dump = tmp_path / "rank0.stack"
    dump.write_text(DUMP.format(user=user))
    frames = E.stack_frames(str(dump))
    assert frames[0][2] == "recv" and frames[2] == (str(user), 3, "<module>")
    where = E.where_stuck(frames)
    assert where == "in torch.distributed recv() called at cell.py:3: dist.recv(buf, src=1)"
    assert E.where_stuck([]).startswith("no Python stack")


def _err(run_dir, rank, t, exc, msg):
    record = {"rank": rank, "time": t, "type": exc, "message": msg, "op": None,
              "traceback": f"Traceback (most recent call last):\n{exc}: {msg}\n"}
    (run_dir / f"rank{rank}.err").write_text(json.dumps(record))


def test_the_first_real_failure_is_reported_not_its_echo(tmp_path):
    # rank 0's error is the consequence (its peer vanished), even though it was written first
    _err(tmp_path, 0, 1.0, "RuntimeError", "Connection closed by peer [127.0.0.1]:1234")
    _err(tmp_path, 2, 1.2, "ValueError", "bad shard")
    (tmp_path / "rank1.pkl").write_bytes(b"")
    err = E.rank_error(str(tmp_path), 3)
    assert (err.rank, err.exc_type, err.others) == (2, "ValueError", [0])
    assert "also failed: rank 0" in str(err) and "--- traceback from rank 2 ---" in str(err)
    assert E.rank_error(str(tmp_path / "nothing"), 3) is None


def test_an_echo_alone_names_the_ranks_that_had_returned(tmp_path):
    _err(tmp_path, 0, 1.0, "RuntimeError", "Connection closed by peer [127.0.0.1]:1234")
    (tmp_path / "rank1.pkl").write_bytes(b"")
    err = E.rank_error(str(tmp_path), 2)
    assert err.rank == 0 and "rank 1 had already returned" in str(err)


@linux
def test_end_tree_kills_detached_and_reparented_descendants():
    marker = f"tree-{uuid.uuid4().hex}"
    # The shell starts a child in a new session (as torchrun does with its workers).
    script = "setsid sleep 300 & sleep 300 & wait"
    root = subprocess.Popen(["sh", "-c", script], env={**os.environ, "TREE_MARK": marker},
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while len(descendants(root.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    noted = descendants(root.pid)
    assert len(noted) == 2 and len(marked(marker)) == 3
    killed = end_tree(root, noted, marker, grace_s=0.5)
    assert killed >= 1  # sh dies on SIGTERM; the sleeps may need SIGKILL
    deadline = time.monotonic() + 5
    while marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not marked(marker) and not any(alive(p) for p in noted)


@linux
def test_a_reused_pid_is_never_signalled():
    me = identify(os.getpid())
    assert me is not None and alive(me)
    assert not alive((me[0], me[1] + 1))  # same pid, another start time: someone else


# --- inside the user's own torchrun: launch() runs the target here, as that rank ---------------

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "GROUP_RANK",
                "CPCOURSE_RUN_DIR")


@pytest.fixture
def torchrun_env(monkeypatch):
    """Set this process up as torchrun rank `rank` of `world` on node `node` (no agent)."""
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)

    def as_rank(rank, world, local_rank=0, node=0, port=29500):
        for name, value in (("RANK", rank), ("WORLD_SIZE", world), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", port), ("LOCAL_RANK", local_rank),
                            ("GROUP_RANK", node)):
            monkeypatch.setenv(name, str(value))
    return as_rank


def test_a_torchrun_rank_is_detected_from_its_environment(torchrun_env, monkeypatch):
    assert L.torchrun_rank() is None  # a plain process
    torchrun_env(3, 4, local_rank=1, node=1)
    where = L.torchrun_rank()
    assert where == (3, 4, 1, 1) and (where.rank, where.world, where.node) == (3, 4, 1)
    monkeypatch.setenv("CPCOURSE_RUN_DIR", "/tmp/x")  # a rank cpcourse.launch started itself
    assert L.torchrun_rank() is None
    monkeypatch.delenv("CPCOURSE_RUN_DIR")
    monkeypatch.delenv("MASTER_ADDR")  # RANK and WORLD_SIZE alone: not torchrun's whole set
    assert L.torchrun_rank() is None
    torchrun_env("one", 4)
    with pytest.raises(InputError, match="RANK='one' is not a whole number"):
        L.torchrun_rank()
    torchrun_env(4, 4)
    with pytest.raises(InputError, match="RANK=4 is not a rank of WORLD_SIZE=4"):
        L.torchrun_rank()


def test_inside_torchrun_nproc_must_be_the_world_size(torchrun_env, capsys):
    import torch.distributed as dist

    from cpcourse import cli

    torchrun_env(1, 4)
    with pytest.raises(InputError, match="running as rank 1 of a torchrun world of 4: pass "
                                         "nproc=4"):
        L.launch("cpcourse.launch.entry:rank_info", 2)
    assert not dist.is_initialized()  # refused before any process group
    code = cli.main(["demo", "--nproc", "2", "--json", "--seq-len", "8"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("cpcourse: error: running as rank 1 of a torchrun world of 4")


def test_the_cli_under_torchrun_defaults_nproc_refuses_and_silences(torchrun_env, capsys):
    import sys as _sys

    from cpcourse import cli

    torchrun_env(1, 4)
    with cli.as_torchrun_rank(["demo", "--json"]) as argv:
        assert argv == ["demo", "--nproc", "4", "--json"]
        print("not shown")  # a rank other than 0 prints nothing on stdout
        _sys.stderr.write("errors still show\n")
    with cli.as_torchrun_rank(["bench", "ring", "--nproc", "4"]) as argv:
        assert argv == ["bench", "ring", "--nproc", "4"]  # given: kept (launch checks it)
    with cli.as_torchrun_rank(["tokens", "--json"]) as argv:
        assert argv == ["tokens", "--json"]
    out, err = capsys.readouterr()
    assert out == "" and err == "errors still show\n"
    for argv in (["grade"], ["bench", "launch"]):
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "does not run inside a torchrun rank" in err and "bench ring" in err
    torchrun_env(0, 4)
    with cli.as_torchrun_rank(["models", "--arch", "wan"]) as argv:
        assert argv == ["models", "--nproc", "4", "--arch", "wan"]
        print("rank 0 reports")
    assert capsys.readouterr().out == "rank 0 reports\n"


def raises_here():
    raise ValueError("this rank refuses")


def prints_here():
    print("a line from the target")
    return {"pid": os.getpid()}


def test_a_one_rank_torchrun_world_runs_the_target_in_this_process(torchrun_env, capsys):
    import torch.distributed as dist

    from cpcourse.cli.doctor import free_port

    torchrun_env(0, 1, port=free_port())
    results = L.launch("cpcourse.launch.entry:rank_info", 1, timeout=30)
    assert isinstance(results, L.RankResults) and len(results) == 1
    assert results[0]["rank"] == 0 and results[0]["world"] == 1
    assert results[0]["pid"] == os.getpid() and results[0]["backend"] == "gloo"
    assert not dist.is_initialized()  # the group it made is gone again
    results = L.launch(f"{__file__}:prints_here", 1, timeout=30, stream=False)
    assert results.output == ["[rank 0] a line from the target"]
    assert capsys.readouterr().out == ""  # stream=False: kept, not printed
    try:
        with pytest.raises(L.RankError) as info:
            L.launch(f"{__file__}:raises_here", 1, timeout=30)
        assert info.value.rank == 0
        assert info.value.summary() == "rank 0 raised ValueError: this rank refuses"
        assert "raises_here" in str(info.value)  # the traceback, for --verbose
    finally:
        if dist.is_initialized():  # a failure leaves the group (a peer may be inside it)
            dist.destroy_process_group()


_TORCHRUN_SUMMARY = """\
[W1202 02:13:54] rank: 0 sending SIGTERM to the workers (local_rank: 0)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
cpcourse.launch.entry FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_02:13:54
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 3 (pid: 27255)
  error_file: <N/A>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_02:13:54
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -11 (pid: 27254)
  error_file: <N/A>
============================================================
"""


def test_torchruns_summary_gives_each_rank_its_own_exit_code():
    """A log line mentioning "rank: 0" before the summary must not steal rank 1's code."""
    from cpcourse.launch.errors import exit_codes

    assert exit_codes(_TORCHRUN_SUMMARY) == {1: 3, 0: -11}


def test_the_rank_torchrun_ended_with_sigterm_is_not_blamed(tmp_path):
    """Rank 1 segfaults; torchrun then ends rank 0 with SIGTERM. Both are dead with exit codes,
    and the one to name is rank 1, not the lower-numbered echo."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    for r in (0, 1):
        (tmp_path / f"rank{r}.pid").write_text(str(dead.pid))
    log = _TORCHRUN_SUMMARY.replace("exitcode  : 3", "exitcode  : -11").replace(
        "exitcode  : -11 (pid: 27254)", "exitcode  : -15 (pid: 27254)")
    err = E.rank_death(str(tmp_path), 2, log)
    assert err.rank == 1 and "SIGSEGV" in err.summary(), err.summary()


def _run_folder(tmp, name, pids: dict, age_s: float):
    """A fake run folder: `pids` maps file name -> its text; modified `age_s` seconds ago."""
    folder = tmp / name
    folder.mkdir()
    for file, text in pids.items():
        (folder / file).write_text(text)
    (folder / "spec.json").write_text("{}")
    then = time.time() - age_s
    os.utime(folder, (then, then))
    return folder


@linux
def test_the_folders_of_killed_launches_are_swept_and_no_other(tmp_path, monkeypatch):
    """A SIGKILLed caller leaves its cpcourse-launch-* folder: the next launch() removes it,
    but never one whose processes live, a young one, or one from another pid namespace."""
    from cpcourse.launch import launcher, sweep

    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, ns = str(gone.pid), os.readlink("/proc/self/ns/pid")
    folders = {
        "dead": _run_folder(tmp_path, "cpcourse-launch-dead", {
            "owner.pid": f"{dead} {ns}", "torchrun.pid": dead, "rank0.pid": dead}, 120),
        "live": _run_folder(tmp_path, "cpcourse-launch-live", {
            "owner.pid": f"{os.getpid()} {ns}", "rank0.pid": dead}, 120),
        "live_rank": _run_folder(tmp_path, "cpcourse-launch-rank", {
            "owner.pid": f"{dead} {ns}", "rank1.pid": str(os.getpid())}, 120),
        "young": _run_folder(tmp_path, "cpcourse-launch-young", {
            "owner.pid": f"{dead} {ns}"}, 5),
        "no_owner": _run_folder(tmp_path, "cpcourse-launch-old", {"rank0.pid": dead}, 120),
        "elsewhere": _run_folder(tmp_path, "cpcourse-launch-ns", {
            "owner.pid": f"{dead} pid:[1]"}, 120),
        "not_ours": _run_folder(tmp_path, "other-dead", {"owner.pid": f"{dead} {ns}"}, 120),
    }
    monkeypatch.setattr(launcher.tempfile, "tempdir", str(tmp_path))

    def stop(*args, **kwargs):  # the sweep comes before anything starts
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_start", stop)
    with pytest.raises(KeyboardInterrupt):
        L.launch("cpcourse.launch.entry:rank_info", 2)
    assert not folders.pop("dead").exists()
    assert all(f.exists() for f in folders.values())
    assert sweep.sweep_stale(str(tmp_path)) == []
    old = time.time() - 2 * sweep.NO_OWNER_AGE_S
    os.utime(folders["no_owner"], (old, old))  # without owner.pid: only after a day
    assert sweep.sweep_stale(str(tmp_path)) == [str(folders["no_owner"])]


@linux
def test_a_stopped_rank_is_said_not_to_answer(tmp_path):
    """A SIGSTOPped rank writes no stack: it was described as "no Python stack (blocked before
    Python started, or exited)"."""
    import signal

    # A rank handles SIGUSR1 (faulthandler); with the default action it would kill even a
    # stopped process. An ignored signal stays ignored across exec.
    proc = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: signal.signal(
        signal.SIGUSR1, signal.SIG_IGN))
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        (tmp_path / "rank0.pid").write_text(str(proc.pid))
        (tmp_path / "rank0.started").write_text("")
        (tmp_path / "rank0.stack").write_text("")
        stuck, finished = E.stuck_report(str(tmp_path), 1)
        assert stuck == {0: "did not answer the stack request (stopped?)"} and finished == []
    finally:
        proc.kill()
        proc.wait()


def test_rank_start_method_is_checked_before_anything_starts(monkeypatch):
    from cpcourse.launch.forkserver import ENV_START, start_method

    linux = sys.platform.startswith("linux")
    assert start_method({}) == ("forkserver" if linux else "exec")
    assert start_method({ENV_START: " exec "}) == "exec"
    with pytest.raises(InputError, match="CPCOURSE_RANK_START='spawn' must be forkserver or exec"):
        start_method({ENV_START: "spawn"})
    with pytest.raises(InputError, match="CPCOURSE_RANK_START"):  # refused by launch() itself
        L.launch("cpcourse.launch.entry:rank_info", 2, env={ENV_START: "fork"})


def test_the_fork_server_preloads_only_cpcourse_targets(tmp_path):
    from cpcourse.launch.forkserver import preload_modules

    def preload(target):
        (tmp_path / "spec.json").write_text(json.dumps({"target": target}))
        return preload_modules(str(tmp_path))

    assert preload("cpcourse.runs.models:models_rank")[-1] == "cpcourse.runs.models"
    base = preload("/home/me/train.py:main")  # a user's file may do anything when imported
    assert "torch" in base and not any("train" in m for m in base)
    assert preload("mypkg.mod:fn") == base


def test_each_rank_reads_the_launchers_spec_by_field(tmp_path):
    """What the launcher writes into the run folder is what every rank reads back: a
    `RankSpec`, through JSON, its fields by name."""
    from cpcourse.launch.call import RankSpec

    spec = RankSpec("cpcourse.launch.entry:rank_info", threads=3, init=False, backend="gloo")
    spec.write(str(tmp_path))
    assert json.loads((tmp_path / "spec.json").read_text())["threads"] == 3
    assert RankSpec.read(str(tmp_path)) == spec


def test_exit_codes_of_forked_ranks_come_from_their_files(tmp_path):
    (tmp_path / "rank1.exit").write_text("-11")
    (tmp_path / "rank0.exit").write_text("garbled")
    assert E._exit_files(str(tmp_path), 3) == {1: -11}


def test_a_function_target_is_launched_by_its_module_and_name():
    from cpcourse.launch.entry import rank_info
    from cpcourse.launch.launcher import target_name
    from cpcourse.support.errors import InputError

    assert target_name(rank_info) == "cpcourse.launch.entry:rank_info"
    assert target_name("pkg.mod:fn") == "pkg.mod:fn"

    def local():
        pass

    with pytest.raises(InputError, match="not a module-level function"):
        target_name(local)
    with pytest.raises(InputError, match="not a module-level function"):
        target_name(lambda: None)
