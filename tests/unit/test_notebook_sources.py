"""Every committed notebook is what its builder writes (tools/notebooks/build_NN.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_notebook_has_a_builder_and_is_up_to_date():
    builders = {p.stem.removeprefix("build_") for p in
                (ROOT / "tools" / "notebooks").glob("build_[0-9]*.py")}
    notebooks = {p.name[:2] for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert notebooks == builders, "each notebooks/NN_*.ipynb needs tools/notebooks/build_NN.py"
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "notebooks" / "build_all.py"),
                        "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr + "\nrun `make notebooks`"
