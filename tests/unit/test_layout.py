"""The package's layout holds: chapters ranked in course order, imports only downwards.

    python -m pytest tests/unit/test_layout.py -q

Ranks, lowest first (book/layout.md): `support` < the concept modules at the top of `cpcourse/`,
in the order the course builds them (online softmax < attention < the sim, the ring, Ulysses and
tensor parallelism < the mesh < video, sparse attention and the block-causal `causal` chapter;
`attention`, `ring`, `video`, `sparse` and `causal` are packages, a chapter each) < the chapters
`tinydit`, `models`, `planner` and the machinery `launch` < `approx` (approximate parallel
sampling of the tiny DiT) < `course`, `viz` and `runs` (what
runs an experiment on P ranks) < `bench` (which only measures) < `cli`. A module may import
its own chapter (its package, or itself) or any chapter of a lower rank; never a sibling chapter
of the same rank, never a higher one, and no chain of imports comes back to where it started.
Imports inside functions count too: a lazy import still ties the two modules together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "cpcourse"
RANKS = {
    "support": 0,
    "online_softmax": 1,
    "attention": 2,
    "sim": 3, "ring": 3, "ulysses": 3, "tensor_parallel": 3,
    "fp8_comm": 3,  # messages in fewer bytes: under sparse/ (16) and the planner's comm
    "mesh": 4, "tiling": 4,
    "video": 5, "causal": 5, "sparse": 5,
    "tinydit": 6, "models": 6, "planner": 6, "launch": 6,
    "approx": 7,
    "course": 8, "viz": 8, "runs": 8,
    "bench": 9,
    "cli": 10,
    "__main__": 11,  # `python -m cpcourse` runs the command line
    "cp_boundaries": 3,  # training's scatter, gather and loss scale
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = ["cpcourse", *path.relative_to(PKG).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def chapter(mod: str) -> str:
    """`cpcourse.planner.costs` -> "planner", `cpcourse.ring` -> "ring"."""
    return mod.split(".")[1]


def rank(mod: str) -> int:
    return RANKS[chapter(mod)]


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


def test_every_chapter_has_a_rank():
    chapters = {p.parent.name for p in PKG.glob("*/__init__.py")}
    chapters |= {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert chapters <= set(RANKS), f"give {sorted(chapters - set(RANKS))} a rank here"
    assert set(RANKS) - {"__main__"} <= chapters | {"__main__"}, "RANKS names a missing chapter"


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_imports_only_downwards(mod):
    up = sorted(b for b in GRAPH[mod] if rank(b) > rank(mod))
    assert not up, f"{mod} (rank {rank(mod)}) imports {up} from a higher rank"


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_no_sideways_import_between_chapters(mod):
    side = sorted(b for b in GRAPH[mod] if rank(b) == rank(mod) and chapter(b) != chapter(mod))
    assert not side, (f"{mod} imports {side} from a sibling chapter of the same rank: move what "
                      f"both need down a rank")


def test_the_planner_loads_without_torch():
    """The planner is arithmetic on sourced numbers: `cpcourse plan` starts without torch."""
    code = ("import sys, pkgutil, importlib, cpcourse.planner as p\n"
            "for m in pkgutil.iter_modules(p.__path__):\n"
            "    importlib.import_module('cpcourse.planner.' + m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] == 'torch')[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"the planner imports torch: {out.stdout.strip()}"


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


def private_imports(mod: str) -> list[str]:
    """`from cpcourse.x import _y` in `mod` where x is another module: what one module keeps to
    itself and another reaches into (a shared primitive needs a public name)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("cpcourse") and node.module != mod:
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


@pytest.mark.parametrize("mod", sorted(GRAPH))
def test_no_private_name_is_imported_across_modules(mod):
    assert not private_imports(mod), (f"{mod} imports {private_imports(mod)}: give the shared "
                                      "function a public name in its module")


def test_the_command_line_runs_experiments_through_runs_not_bench():
    """`cpcourse generate` and `cpcourse models` call the runners; only `cpcourse bench` (by
    name, through `cpcourse.bench.main`) reaches the benchmarks."""
    cli = [m for m in GRAPH if chapter(m) == "cli"]
    assert "cpcourse.runs.generate" in GRAPH["cpcourse.cli.generate"]
    assert not sorted(b for m in cli for b in GRAPH[m] if chapter(b) == "bench")


def test_the_checks_can_fail():
    """The layer rule and the cycle search see real imports (the rule is not vacuous)."""
    assert "cpcourse.launch.proctree" in GRAPH["cpcourse.launch.watch"]
    assert "cpcourse.support.errors" in GRAPH["cpcourse.ring"]
    assert "cpcourse.attention" in GRAPH["cpcourse.ring"]
    assert rank("cpcourse.cli.demo") > rank("cpcourse.planner.plan") > rank("cpcourse.video")
    assert rank("cpcourse.video") > rank("cpcourse.ring") > rank("cpcourse.support.errors")
    assert chapter("cpcourse.tinydit.model") != chapter("cpcourse.models.build")
    assert "cpcourse.runs.long_video" in GRAPH["cpcourse.bench.windows"]
    assert rank("cpcourse.cli.generate") > rank("cpcourse.bench.windows") > rank("cpcourse.runs")
    assert private_imports("cpcourse.mesh") == [] and "seq_to_heads" in MODULES[
        "cpcourse.mesh"].read_text()


CONTRACT = ["cpcourse.attention:attention_with_lse", "cpcourse.attention:merge_attention",
            "cpcourse.ring:ring_attention", "cpcourse.ulysses:ulysses_attention",
            "cpcourse.launch:launch", "cpcourse.video:frame_shard", "cpcourse.video:gather_frames",
            "cpcourse.video:temporal_attention_cp", "cpcourse.video:full_attention_cp",
            "cpcourse.video:spatial_attention", "cpcourse.models:parallelize",
            "cpcourse.mesh:make_mesh", "cpcourse:check", "cpcourse:hint",
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
