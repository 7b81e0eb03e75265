"""JupyterLab's settings for the course (`make lab` passes `--config=tools/jupyter_lab_config.py`).

Lab serves the repository root, so `exercises/` (the files every exercise cell asks you to edit)
sits beside `notebooks/`; it opens on notebook 00; and each notebook is listed once: its jupytext
text form (`notebooks/NN_topic.md`) is hidden from the file browser, while saving in Lab still
writes both files of the pair. Checked by tests/unit/test_lab_server.py.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_NOTEBOOK = "notebooks/00_token_explosion.ipynb"

c = get_config()  # noqa: F821  (a name Jupyter's config loader provides)
c.ServerApp.root_dir = str(ROOT)
c.LabApp.default_url = f"/lab/tree/{FIRST_NOTEBOOK}"
# Names only (fnmatch): the notebooks' text forms; README.md and AUTHORING.md stay listed.
c.ContentsManager.hide_globs = ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~",
                                "[0-9][0-9]_*.md", "[0-9][0-9][a-z]_*.md", "*.egg-info"]
