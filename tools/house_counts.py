"""python tools/house_counts.py [--json]: the house's structure in numbers (issue 42's counts).

    python tools/house_counts.py

Counts, over `cpcourse/`: string-keyed spec lookups (`spec["..."]`), functions that take more
than 8 parameters, private names imported across modules, `arch == "..."`-style branches on an
architecture's id, modules over 300 lines, and the lines of the concept chapters against the
machinery. Reads the source only (ast), so it runs in a second on any checkout.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cpcourse"
MACHINERY = {"support", "launch", "course", "viz", "bench", "cli", "runs", "data"}
SPEC = re.compile(r"""\bspec\[["'][a-z_]+["']\]""")
ARCH_IDS = ("wan", "wan2.2", "hunyuanvideo", "cogvideox")


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    return len([n for n in names if n.arg not in ("self", "cls")])


def _arch_branch(node: ast.Compare) -> bool:
    """`x == "wan"`, `x in ("wan", ...)`, `x.startswith("wan")` is not counted."""
    consts = []
    for comp in node.comparators:
        if isinstance(comp, ast.Constant):
            consts.append(comp.value)
        elif isinstance(comp, ast.Tuple | ast.List | ast.Set):
            consts += [e.value for e in comp.elts if isinstance(e, ast.Constant)]
    return any(c in ARCH_IDS for c in consts)


def counts() -> dict:
    out = {"spec_lookups": 0, "functions_over_8_params": [], "private_imports": [],
           "arch_branches": [], "modules_over_300_lines": [], "lines_concept": 0,
           "lines_machinery": 0}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        text = path.read_text()
        lines = text.count("\n")
        top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        out["lines_machinery" if top in MACHINERY else "lines_concept"] += lines
        if lines > 300:
            out["modules_over_300_lines"].append(f"{rel} ({lines})")
        out["spec_lookups"] += len(SPEC.findall(text))
        module = "cpcourse." + ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _params(node) > 8:
                out["functions_over_8_params"].append(f"{rel}:{node.lineno} {node.name} "
                                                      f"({_params(node)})")
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("cpcourse") and node.module != module:
                out["private_imports"] += [f"{rel}: {node.module}.{a.name}" for a in node.names
                                           if a.name.startswith("_")
                                           and not a.name.startswith("__")]
            elif isinstance(node, ast.Compare) and _arch_branch(node):
                out["arch_branches"].append(f"{rel}:{node.lineno}")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    c = counts()
    if args.json:
        print(json.dumps(c, indent=1))
        return 0
    total = c["lines_concept"] + c["lines_machinery"]
    print(f"spec[...] lookups: {c['spec_lookups']}")
    for key in ("functions_over_8_params", "private_imports", "arch_branches",
                "modules_over_300_lines"):
        print(f"{key.replace('_', ' ')}: {len(c[key])}")
        for item in c[key]:
            print(f"  {item}")
    print(f"lines: {total} ({c['lines_machinery'] / total:.0%} machinery)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
