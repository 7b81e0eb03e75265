"""`make lab`'s server, asked through its contents API: the repository root with `exercises/`
beside `notebooks/`, each notebook listed once, notebook 00 as the page it opens.

The server is started as `make lab` starts it (`--config=tools/jupyter_lab_config.py`), on a free
loopback port with a token, its config, runtime and data dirs in a temporary folder, and stopped
at the end with every process it started. About 5 s.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cpcourse.cli.doctor import free_port
from cpcourse.launch import proctree

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tools" / "jupyter_lab_config.py"

pytestmark = pytest.mark.timeout(60)


def _get(url: str, token: str) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read().decode()
            kind = resp.headers.get("Content-Type", "")
            return resp.status, (json.loads(raw) if "json" in kind else raw)
    except urllib.error.HTTPError as err:
        return err.code, ""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_TOKEN"}
    env.update(JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "rt"),
               JUPYTER_DATA_DIR=str(tmp / "data"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "ws"),
               IPYTHONDIR=str(tmp / "ipython"))
    port, token = free_port(), secrets.token_hex(16)
    # what `make lab` runs, without a browser, on loopback
    cmd = [sys.executable, "-m", "jupyterlab", f"--config={CONFIG}", "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", "--ServerApp.log_level=WARN"]
    if os.getuid() == 0:
        cmd.append("--allow-root")
    log = tmp / "lab.log"
    with open(log, "wb") as out:  # started from elsewhere: the config alone picks the root
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 40
    try:
        while True:
            try:
                if _get(f"{url}/api/status", token)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        yield url, token
    finally:
        noted = proctree.descendants(proc.pid)
        proctree.end_tree(proc, noted, grace_s=5.0)
        left = [p[0] for p in noted if proctree.alive(p)]
        assert proc.poll() is not None and not left, f"JupyterLab left processes: {left}"


def test_exercises_sit_beside_the_notebooks(lab):
    url, token = lab
    status, root = _get(f"{url}/api/contents", token)
    assert status == 200
    names = {item["name"] for item in root["content"]}
    assert {"exercises", "notebooks", "README.md"} <= names, names
    status, exercises = _get(f"{url}/api/contents/exercises", token)
    assert status == 200
    assert any(item["name"] == "ex00_tokens.py" for item in exercises["content"])


def test_each_notebook_is_listed_once(lab):
    url, token = lab
    status, listing = _get(f"{url}/api/contents/notebooks", token)
    assert status == 200
    listed = [item["name"] for item in listing["content"] if re.match(r"\d\d", item["name"])]
    on_disk = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    assert sorted(listed) == on_disk, f"listed: {sorted(listed)}"
    # the hidden text form still opens (jupytext pairs it with the .ipynb on save)
    status, _ = _get(f"{url}/api/contents/notebooks/00_token_explosion.md?content=0", token)
    assert status == 200


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_lab_opens_on_notebook_00(lab):
    url, token = lab
    opener = urllib.request.build_opener(_NoRedirect)
    req = urllib.request.Request(f"{url}/", headers={"Authorization": f"token {token}"})
    with pytest.raises(urllib.error.HTTPError) as err:  # a redirect, not followed
        opener.open(req, timeout=10)
    assert err.value.code in (301, 302)
    where = err.value.headers["Location"].rstrip("?")
    assert where.endswith("/lab/tree/notebooks/00_token_explosion.ipynb"), where
    status, _ = _get(f"{url}/api/contents/notebooks/00_token_explosion.ipynb?content=0", token)
    assert status == 200
