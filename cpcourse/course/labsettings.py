"""python -m cpcourse.course.labsettings: quiet JupyterLab's start-up pop-ups in this environment.

Writes `share/jupyter/lab/settings/overrides.json` under `sys.prefix` (the venv), so the
"Jupyter news" prompt never covers the course, for learners and for the browser test alike.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {
        "checkForUpdates": False,
        "fetchNews": "false",
    },
    "@jupyterlab/application-extension:context-menu": {},
}


def main() -> Path:
    path = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    current = json.loads(path.read_text()) if path.exists() else {}
    current.update(OVERRIDES)
    path.write_text(json.dumps(current, indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {main()}")
