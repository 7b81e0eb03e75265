"""How torchrun starts cpcourse's ranks: forked from a preloaded server, or each a fresh Python.

    CPCOURSE_RANK_START=exec cpcourse demo --nproc 2   # the ranks started by exec instead

"forkserver" (the default on Linux): one server process imports torch and the target's module
once, while torchrun itself starts, and forks every rank from it, so a rank starts in a fraction
of a second instead of importing torch again (about 3 s of CPU per rank, most of a short launch on
a laptop). The server is single-threaded, unlike torchrun's agent (its rendezvous store runs
threads), which is why the ranks are not forked from the agent. "exec": each rank is a fresh
`python -m cpcourse.launch.entry RUN_DIR` (every other platform, or CPCOURSE_RANK_START=exec).
`cpcourse.launch.entry` (torchrun's role) calls `use_fork_server` before torchrun starts.
"""

from __future__ import annotations

import os
import sys

from cpcourse.launch.call import RankSpec

ENV_START = "CPCOURSE_RANK_START"
START_METHODS = ("forkserver", "exec")


def start_method(env=None) -> str:
    """The rank start method `CPCOURSE_RANK_START` asks for (default: forkserver on Linux)."""
    env = os.environ if env is None else env
    default = "forkserver" if sys.platform.startswith("linux") else "exec"
    method = str(env.get(ENV_START) or default).strip()
    if method not in START_METHODS:
        from cpcourse.support.errors import InputError

        raise InputError(f"{ENV_START}={method!r} must be {' or '.join(START_METHODS)}: fix it, "
                         "or unset it for the default")
    if method == "forkserver" and not sys.platform.startswith("linux"):
        return "exec"  # the fork server needs fork(); elsewhere every rank is a fresh process
    return method


def preload_modules(run_dir: str) -> list[str]:
    """What the fork server imports before forking ranks: torch, the rank's own start-up, and
    the target's module when it is cpcourse's (a user's module may do anything on import)."""
    target = RankSpec.read(run_dir).target
    where = target.rsplit(":", 1)[0] if ":" in target else ""
    mine = [where] if where.startswith("cpcourse.") and os.sep not in where else []
    return ["torch", "torch.distributed", "cpcourse.support.groups", "cpcourse.launch.entry",
            *mine]


def _start_fork_server(run_dir: str) -> bool:
    """Start the fork server now, so it imports torch while torchrun does; False (the ranks are
    then started by exec) where it cannot start, e.g. a temp dir whose socket path is too long
    for a Unix socket (about 107 bytes: a deep TMPDIR)."""
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.set_forkserver_preload(preload_modules(run_dir))
    try:
        multiprocessing.forkserver.ensure_running()
    except OSError:
        return False
    return True


def _record_exit_codes(run_dir: str) -> None:
    """Write `rank{k}.exit` (the exit code, negative for a signal) for every forked rank whose end
    torchrun's process context has seen: with forked ranks torchrun's failure summary names
    only the first failure it noticed, often a peer's echo of the real one
    (`cpcourse.launch.errors.rank_death` reads these files)."""
    import importlib

    spawn = importlib.import_module("torch.multiprocessing.spawn")
    plain_join = spawn.ProcessContext.join

    def join(self, *args, **kwargs):
        try:
            return plain_join(self, *args, **kwargs)
        finally:
            for k, proc in enumerate(self.processes):
                code = getattr(proc._popen, "returncode", None)  # known: no poll, no race
                path = os.path.join(run_dir, f"rank{k}.exit")
                if code is not None and not os.path.exists(path):
                    with open(path + ".tmp", "w") as fh:
                        fh.write(str(code))
                    os.replace(path + ".tmp", path)

    spawn.ProcessContext.join = join


def use_fork_server(run_dir: str, rank_main) -> bool:
    """In torchrun's agent, before torchrun parses its arguments: fork the ranks from a
    preloaded server, each calling `rank_main(run_dir)` (True), or leave torchrun to start them
    by exec (False: asked for, not Linux, or the server could not start)."""
    if start_method() != "forkserver" or not _start_fork_server(run_dir):
        return False
    import torch.distributed.run as torchrun

    plain = torchrun.config_from_args

    def config_from_args(args):  # the same config; the entrypoint becomes a function
        config, _, _ = plain(args)
        config.start_method = "forkserver"
        return config, rank_main, [run_dir]

    torchrun.config_from_args = config_from_args
    _record_exit_codes(run_dir)
    return True
