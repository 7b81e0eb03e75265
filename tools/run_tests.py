"""python tools/run_tests.py [--fast]: every check of `make test`, in order, with one summary.

    make test

Phases: ruff; stale exercise stubs; unit tests; multi-process (gloo) tests; the graded tests on
the reference solutions; the notebooks (each executed once, on the stubs: their checks are the
graded tests just run, found in their record); the browser; then the graded tests on the
untouched stubs, where each must fail with the stub's own NotImplementedError
(`--expect-stubs`). Unit tests run on one pytest-xdist worker per core; distributed tests
run serially: ranks need the cores. At the end: the
seconds of each phase, the 25 slowest tests of the whole run, and the total,
`N passed, M failed`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _pytest(name: str, args: list[str], junit_dir: Path) -> list[str]:
    xml = junit_dir / f"{name}.xml"
    return [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *args]


def _slowest(junit_dir: Path, n: int = 25) -> list[tuple[float, str]]:
    """The `n` slowest test cases over every phase's junit file: (seconds, phase::name)."""
    cases = []
    for xml in junit_dir.glob("*.xml"):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            cases.append((float(case.get("time", 0) or 0), f"{xml.stem}: {name}"))
    return sorted(cases, reverse=True)[:n]


def _counts(xml: Path) -> tuple[int, int, int]:
    if not xml.exists():
        return 0, 0, 0
    passed = failed = skipped = 0
    for suite in ET.parse(xml).getroot().iter("testsuite"):
        tests, fails = int(suite.get("tests", 0)), int(suite.get("failures", 0))
        errs, skips = int(suite.get("errors", 0)), int(suite.get("skipped", 0))
        failed += fails + errs
        skipped += skips
        passed += tests - fails - errs - skips
    return passed, failed, skipped


def _workers() -> list[str]:
    """pytest-xdist's options for the unit phase: one worker per core, at most 4 (unit tests
    are single-threaded and independent; on the 2-core CI machine this takes the phase from
    ~250 s to ~160 s). Without xdist (a set-up without the [dev] extra): serial."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(max(1, min(4, os.cpu_count() or 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fast", action="store_true", help="skip notebooks and the browser")
    args = ap.parse_args()
    os.chdir(ROOT)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    junit = Path(tempfile.mkdtemp(prefix="cpcourse-tests-"))
    sol = ["--impl", "solutions"]
    phases = [
        ("ruff", [PY, "-m", "ruff", "check", "cpcourse", "tests", "tools", "solutions",
                  "exercises"]),
        ("stubs-fresh", [PY, "tools/make_exercises.py", "--check"]),
        ("unit", _pytest("unit", ["tests/unit", *_workers(), *sol], junit)),
        ("dist", _pytest("dist", ["tests/dist", "tests/gpu", *sol], junit)),
        ("graded", _pytest("graded", ["tests/graded", *sol], junit)),
        # after the graded phase: the notebooks' checks are found in its record
        ("notebooks", _pytest("notebooks", ["tests/notebooks", *sol], junit)),
        ("browser", _pytest("browser", ["tests/browser", *sol], junit)),
        ("stubs-fail", _pytest("stubs-fail", ["tests/graded", "--impl", "exercises",
                                         "--expect-stubs"], junit)),
    ]
    if args.fast:
        phases = [ph for ph in phases if ph[0] not in ("notebooks", "browser")]
    total = [0, 0, 0]
    failed_phases, seconds = [], {}
    for name, cmd in phases:
        if name == "stubs-fresh" and not (ROOT / "tools" / "make_exercises.py").exists():
            continue
        print(f"\n=== {name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(cmd, env=env)
        if code == 5 and name not in ("ruff", "stubs-fresh"):
            code = 0  # pytest's "no tests collected": a phase with nothing here (no GPU tests)
        seconds[name] = time.perf_counter() - start
        print(f"=== {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in "
              f"{seconds[name]:.0f} s", flush=True)
        if code != 0:
            failed_phases.append(name)
        counts = _counts(junit / f"{name}.xml")
        for i in range(3):
            total[i] += counts[i]
        if name in ("ruff", "stubs-fresh"):
            total[0 if code == 0 else 1] += 1
    print("\nslowest tests:")
    for sec, name in _slowest(junit):
        print(f"  {sec:7.1f} s  {name}")
    print("seconds per phase: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items())
          + f"; total {sum(seconds.values()):.0f}")
    print(f"\nfailed phases: {', '.join(failed_phases)}" if failed_phases else "\nall phases ok")
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if failed_phases else 0


if __name__ == "__main__":
    sys.exit(main())
