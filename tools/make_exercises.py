"""Regenerate the learner's stubs in exercises/ from the reference answers in solutions/.

    python tools/make_exercises.py            # write stale stubs; never overwrite your edits
    python tools/make_exercises.py --check    # exit 1 when a committed stub is stale (CI)
    python tools/make_exercises.py --force ex00_tokens   # reset ex00_tokens.py, keeping a backup

Each generated file starts with a header recording the hash of what was generated, so this tool
can tell its own output from a learner's edits. A file you edited is never overwritten silently:
without `--force` it is left alone (exit status 1, with a message); with `--force` your version is
first copied to `exercises/exNN_topic.py.bak-YYYYmmdd-HHMMSS` and the path is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpcourse.course.stubs import course_root, make_stub, solution_files  # noqa: E402
from cpcourse.support.errors import InputError  # noqa: E402

HASH_LINE = re.compile(r"^# stub-sha256: (?P<digest>[0-9a-f]{16})\b")
INIT = '"""Your answers to the course\'s exercises: edit these files (see AUTHORING.md)."""\n'


def digest(body: str) -> str:
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def render(stub_body: str, source_name: str) -> str:
    """A generated file: two header lines, then the stub."""
    return (f"# Yours to edit. Generated from solutions/{source_name} by tools/make_exercises.py\n"
            f"# stub-sha256: {digest(stub_body)} (how the generator tells your edits from its "
            "output)\n"
            "# ruff: noqa: F401, F841, E501\n" + stub_body)


def split(text: str) -> tuple[str | None, str]:
    """(recorded digest or None, body after the header) of a file in exercises/."""
    lines = text.splitlines(keepends=True)
    if len(lines) >= 3 and (m := HASH_LINE.match(lines[1])):
        return m.group("digest"), "".join(lines[3:])
    return None, text


def state(path: Path, wanted: str) -> str:
    """'current', 'missing', 'stale' (ours, out of date) or 'edited' (a learner's work)."""
    if not path.exists():
        return "missing"
    text = path.read_text()
    if text == wanted:
        return "current"
    recorded, body = split(text)
    if recorded is None or digest(body) != recorded:
        # Edited, but a stub whose source did not change is still current as far as CI cares.
        return "edited" if recorded != split(wanted)[0] else "edited-current"
    return "stale"


def plan(root: Path) -> list[tuple[Path, str, str]]:
    """(target, wanted text, state) for every file the generator owns."""
    out = []
    for src in solution_files(root):
        wanted = render(make_stub(src.read_text(), src.relative_to(root)), src.name)
        target = root / "exercises" / src.name
        out.append((target, wanted, state(target, wanted)))
    init = root / "exercises" / "__init__.py"
    out.append((init, INIT, "current" if init.exists() and init.read_text() == INIT
                else "missing" if not init.exists() else "stale"))
    return out


def backup(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while dest.exists():  # two resets within a second keep both versions
        dest, n = path.with_name(f"{path.name}.bak-{stamp}-{n}"), n + 1
    shutil.copy2(path, dest)
    return dest


def orphans(root: Path) -> list[Path]:
    sources = {p.name for p in solution_files(root)}
    return [p for p in sorted((root / "exercises").glob("ex[0-9]*.py")) if p.name not in sources]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="only these modules (e.g. ex00_tokens)")
    parser.add_argument("--check", action="store_true", help="report stale stubs, write nothing")
    parser.add_argument("--force", action="store_true",
                        help="regenerate edited files too, after a timestamped backup")
    parser.add_argument("--root", type=Path, default=None,
                        help="course folder (default: this repo)")
    args = parser.parse_args(argv)
    root = (args.root or course_root()).resolve()
    if not (root / "solutions").is_dir():  # a typo in --root: one line, nothing made there
        parser.error(f"--root {root}: no solutions/ folder there: give the course folder")
    if not args.check:
        (root / "exercises").mkdir(exist_ok=True)
    try:
        todo = plan(root)
    except InputError as exc:
        print(f"make_exercises: error: {exc}", file=sys.stderr)
        return 2
    known = {t.stem for t, _, _ in todo}
    unknown = [n for n in args.names if n.removesuffix(".py") not in known]
    if unknown:
        print(f"make_exercises: error: no solutions/{unknown[0]}.py; use one of "
              f"{', '.join(sorted(known - {'__init__'}))}", file=sys.stderr)
        return 2
    if args.names:
        names = {n.removesuffix(".py") for n in args.names}
        todo = [t for t in todo if t[0].stem in names]
    code = 0
    for target, wanted, st in todo:
        rel = target.relative_to(root)
        if args.check:
            if st in ("missing", "stale", "edited"):
                why = {"missing": "missing", "stale": "out of date with solutions/",
                       "edited": "edited, and its solution changed since it was generated"}[st]
                print(f"{rel}: {why}; run `python tools/make_exercises.py`")
                code = 1
            elif st == "edited-current":
                print(f"{rel}: edited by you (fine: its stub is current)")
            continue
        # An edited file whose stub did not change is only reset when named: `--force ex00_tokens`.
        reset = args.force and target.stem in {n.removesuffix(".py") for n in args.names}
        if st == "current" or (st == "edited-current" and not reset):
            continue
        if st in ("edited", "edited-current"):
            if not args.force:
                print(f"{rel}: has your edits and its solution changed; left as it is. To get the "
                      f"new stub, run `python tools/make_exercises.py --force {target.stem}` "
                      "(your version is kept in a timestamped backup beside it).")
                code = 1
                continue
            print(f"{rel}: your version is saved as {backup(target).relative_to(root)}")
        target.write_text(wanted)
        print(f"{rel}: {'written' if st == 'missing' else 'regenerated'}")
    for path in orphans(root):
        print(f"{path.relative_to(root)}: no solutions/{path.name} any more; left as it is")
    if args.check and code == 0:
        print(f"exercises/ is up to date ({len(todo)} files)")
    return code


if __name__ == "__main__":
    sys.exit(main())
