"""pyproject.toml and environment.yml ask for the same packages; CPU set-up never needs CUDA."""

import re
from pathlib import Path

import pytest
import yaml

tomllib = pytest.importorskip("tomllib" if __import__("sys").version_info >= (3, 11) else "tomli")

ROOT = Path(__file__).resolve().parents[2]
CONDA_NAME = {"torch": "pytorch"}


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _spec(req: str) -> tuple[str, str]:
    name, bound = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", req).groups()
    return name.lower(), bound.split("=*")[0].replace(" ", "")


def test_environment_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = dict(_spec(d) for d in env["dependencies"] if isinstance(d, str))
    for req in _pyproject()["dependencies"]:
        name, bound = _spec(req)
        assert conda.get(CONDA_NAME.get(name, name)) == bound, (name, bound, conda)
    assert conda["python"] == _pyproject()["requires-python"]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[dev]" in pip


def test_flash_attn_only_in_the_gpu_extra():
    project = _pyproject()
    assert not any("flash" in d for d in project["dependencies"])
    assert not any("flash" in d for d in project["optional-dependencies"]["dev"])
    assert any("flash-attn" in d for d in project["optional-dependencies"]["gpu"])


def test_setup_installs_torch_without_cuda_on_cpu_machines():
    script = (ROOT / "tools" / "install_torch.sh").read_text()
    assert "nvidia-smi" in script and "-U" not in script.split()
    makefile = (ROOT / "Makefile").read_text()
    assert "install_torch.sh" in makefile and "--upgrade" not in makefile


def test_every_test_folder_is_collected():
    """pytest's default norecursedirs skips folders named dist: tests/dist went unrun."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                        "no:cacheprovider", "tests", "--impl", "solutions"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    folders = {t.parent.name for t in (ROOT / "tests").glob("*/test_*.py")}
    collected = {line.split("/")[1] for line in p.stdout.splitlines()
                 if line.startswith("tests/") and "::" in line}
    assert folders and folders <= collected, (sorted(folders - collected), p.stdout[-500:])
