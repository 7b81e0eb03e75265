"""A throwaway JupyterLab for the real-browser tests: loopback, random port, token, temp dirs.

    python -m pytest tests/browser -m browser -q

The server serves a temporary copy of notebooks/ (so a test can never save outputs into the
course's notebooks), keeps its config, runtime, settings, workspaces and IPython dirs in a
temporary folder, and is stopped afterwards with every process it started (kernels run in
sessions of their own, so they are tracked by pid, not by process group).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from cpcourse.cli.doctor import free_port
from cpcourse.launch import proctree

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")

# JupyterLab user settings for the test: no autosave (belt and braces, the notebooks are copies),
# every cell kept in the DOM (no windowing) so every output can be checked, no news pop-up.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False},
}


def browser_skip_reason() -> str | None:
    if not CHROMIUM.exists():
        return f"no {CHROMIUM}: run `bash tools/install_browser.sh` (Debian's chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed: pip install -e '.[dev]'"
    return None


@dataclass
class Lab:
    url: str
    token: str
    notebooks: Path
    proc: subprocess.Popen
    log: Path

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def api(self, path: str, method: str = "GET") -> int:
        return self.request(path, method)[0]

    def request(self, path: str, method: str = "GET", body: dict | None = None,
                timeout: float = 30) -> tuple[int, dict | None]:
        """One call of the server's REST API: (status, decoded JSON body or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", method=method, data=data,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw.strip() else None)


def _stop(lab: Lab) -> list[int]:
    """Stop the server and its kernels; returns the pids still alive afterwards (should be [])."""
    noted = proctree.descendants(lab.proc.pid)  # kernels run in sessions of their own
    try:
        lab.api("/api/shutdown", method="POST")  # the server shuts its kernels down itself
        lab.proc.wait(timeout=10)
    except Exception:
        pass
    proctree.end_tree(lab.proc, noted, grace_s=5.0)
    return sorted(proc[0] for proc in noted if proctree.alive(proc))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("lab")
    notebooks = tmp / "notebooks"
    shutil.copytree(ROOT / "notebooks", notebooks,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    settings = tmp / "settings"
    for name, value in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = {k: v for k, v in os.environ.items()
           if k not in ("MPLBACKEND", "CPCOURSE_IMPL", "JUPYTER_TOKEN")}
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTER_DATA_DIR=str(tmp / "data"), JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"), IPYTHONDIR=str(tmp / "ipython"),
        MPLCONFIGDIR=str(tmp / "mpl"), CPCOURSE_ROOT=str(ROOT), PYTHONUNBUFFERED="1",
    )
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={notebooks}",
           "--ServerApp.log_level=WARN"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "jupyterlab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=notebooks, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(f"http://127.0.0.1:{port}", token, notebooks, proc, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            if server.api("/api/status") == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(server)
            pytest.fail(f"JupyterLab did not start (exit {proc.poll()}):\n{server.log_tail()}")
        time.sleep(0.3)
    yield server
    left = _stop(server)
    assert not left, f"processes left behind by JupyterLab: {left}"
