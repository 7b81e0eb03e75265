"""The package's layout holds: concepts on top, machinery in subpackages, imports only downwards.

    python -m pytest tests/unit/test_layout.py -q

Layers, lowest first (README "Layout"): `support` < the concept modules at the top of
`cpcourse/` and the concept package `models` < `launch` < `course`, `viz` < `bench` < `cli`.
A module may import its own layer or a lower one, never a higher one, and no chain of imports
comes back to where it started. Imports inside functions count too: a lazy import still ties
the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "cpcourse"
LAYERS = {"support": 0, "": 1, "models": 1, "planner": 1, "tinydit": 1, "launch": 2,
          "course": 3, "viz": 3, "bench": 4,
          "cli": 5, "__main__": 5}  # `python -m cpcourse` is the command line


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = ["cpcourse", *path.relative_to(PKG).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def layer(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) == 2 and parts[1] not in LAYERS:  # cpcourse.<concept>
        return LAYERS[""]
    return LAYERS[parts[1]]


def imports_of(mod: str) -> set[str]:
    """Every cpcourse module `mod` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from cpcourse.launch import proctree` imports the submodule when there is one
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES and n != "cpcourse")
    found.discard(mod)
    return found


GRAPH = {m: imports_of(m) for m in MODULES if m != "cpcourse"}  # the root only re-exports lazily


def test_every_subpackage_has_a_layer():
    subpackages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert subpackages <= set(LAYERS), f"give {sorted(subpackages - set(LAYERS))} a layer here"
    assert (PKG / "support" / "__init__.py").exists() and (PKG / "launch" / "__init__.py").exists()


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_imports_only_downwards(mod):
    up = sorted(b for b in GRAPH[mod] if layer(b) > layer(mod))
    assert not up, f"{mod} (layer {layer(mod)}) imports {up} from a higher layer"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                cycle = path[path.index(n):] + [n] if n in path else [m, n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])


def test_the_checks_can_fail():
    """The layer rule and the cycle search see real imports (the rule is not vacuous)."""
    assert "cpcourse.launch.proctree" in GRAPH["cpcourse.launch.launcher"]
    assert "cpcourse.support.errors" in GRAPH["cpcourse.ring"]
    assert layer("cpcourse.cli.demo") > layer("cpcourse.ring") > layer("cpcourse.support.errors")


CONTRACT = ["cpcourse.attention:attention_with_lse", "cpcourse.attention:merge_attention",
            "cpcourse.ring:ring_attention", "cpcourse.ulysses:ulysses_attention",
            "cpcourse.launch:launch", "cpcourse.video:frame_shard", "cpcourse.video:gather_frames",
            "cpcourse:check",
            "cpcourse:exercise", "cpcourse:use_reference", "cpcourse:load_ipython_extension",
            "cpcourse.course:exercise", "cpcourse.course:use_reference", "cpcourse.cli:main"]


@pytest.mark.parametrize("path", CONTRACT)
def test_contract_paths_stay_importable(path):
    """What graders, notebooks and DESIGN.md name keeps its import path across moves."""
    import importlib

    module, name = path.split(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_cpcourse_launch_is_both_the_package_and_the_function():
    import cpcourse
    import cpcourse.launch

    assert callable(cpcourse.launch) and cpcourse.launch.launch.__name__ == "launch"
